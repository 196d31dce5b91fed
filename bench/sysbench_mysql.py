"""sysbench ``oltp_read_write --delete_inserts`` against MariaDB beside a running pipeline into DuckLake or Iceberg.

A real client no one here wrote: Debian's sysbench (``apt-get install sysbench``) prepares ``--tables``
tables of ``--table-size`` rows, headrace copies them and streams, then sysbench runs for ``--time``
seconds at full speed (``--threads`` clients: point and range reads, index and non-index updates, a
DELETE and an INSERT of the same id per transaction). Measured: sysbench's TPS, and the time from
sysbench's end until the pipeline is caught up with the binlog's end then (every change committed
before it applied: ``run.apply_pass.caught_up``). Then the pipeline stops and each target table is
read by a plain DuckDB (no headrace; Iceberg: ``iceberg_scan`` of the table's current metadata file)
and compared with the source row for row.

    .venv/bin/python bench/sysbench_mysql.py [--tables 4] [--table-size 50000] [--time 60] [--threads 4]
        [--target ducklake|iceberg]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness import target_config  # noqa: E402

from headrace.config import parse_config  # noqa: E402
from headrace.pipeline import Pipeline  # noqa: E402
from headrace.readers import duckdb_with, iceberg_metadata_location  # noqa: E402
from headrace.readers import ducklake as attach_ducklake  # noqa: E402
from headrace.run.apply_pass import caught_up  # noqa: E402
from headrace.source.mysql.connect import connect  # noqa: E402
from headrace.source.mysql.position import to_int  # noqa: E402
from headrace.source.mysql.throwaway import ThrowawayMariaDB  # noqa: E402
from headrace.source.postgres.throwaway import ThrowawayPostgres  # noqa: E402
from headrace.state.lifecycle import TableState  # noqa: E402
from headrace.state.store import StateStore  # noqa: E402

DATABASE = "sbtest"


def sysbench(server: ThrowawayMariaDB, command: str, *options: str) -> str:
    """Run sysbench's oltp_read_write ``command`` against ``server`` as root; its output."""
    binary = shutil.which("sysbench")
    if binary is None:
        raise SystemExit("sysbench is not installed: apt-get install sysbench")
    out = subprocess.run([binary, "oltp_read_write", "--db-driver=mysql", "--mysql-host=127.0.0.1",
                          f"--mysql-port={server.port}", "--mysql-user=root", f"--mysql-db={DATABASE}", *options,
                          command], check=True, capture_output=True, text=True)
    return out.stdout


def binlog_end(server: ThrowawayMariaDB) -> int:
    with contextlib.closing(connect(server.root_dsn)) as conn, conn.cursor() as cur:
        cur.execute("SHOW MASTER STATUS")
        file, pos = cur.fetchone()[:2]
    return to_int(str(file), int(pos))


def config_for(server: ThrowawayMariaDB, state_dsn: str, work: Path, tables: int, target: str) -> Any:
    return parse_config({
        "name": "sysbench",
        "source": {"dsn": server.dsn_for(DATABASE), "state_dsn": state_dsn,
                   "tables": [f"{DATABASE}.sbtest{i}" for i in range(1, tables + 1)]},
        "target": target_config(target, work),
        "staging": {"path": str(work / "staging")},
        "spark": {"master": "local[2]"},
        "api": {"listen": "127.0.0.1:0"},
    })


def all_streaming(state_dsn: str) -> bool:
    state = StateStore(state_dsn, "sysbench")
    try:
        rows = state.tables() if state.installed() else []
        return bool(rows) and all(r.state is TableState.STREAMING for r in rows)
    finally:
        state.close()


def wait_caught_up(pipeline: Pipeline, state_dsn: str, end: int, limit: float) -> float:
    """Seconds until every change committed before binlog position ``end`` is applied."""
    t0 = time.monotonic()
    state = StateStore(state_dsn, "sysbench")
    try:
        while time.monotonic() - t0 < limit:
            capture = pipeline.capture
            if capture is not None and caught_up(state, pipeline.target, capture.captured_lsn, end)[0]:
                return time.monotonic() - t0
            time.sleep(0.1)
    finally:
        state.close()
    raise RuntimeError(f"not caught up {limit} s after sysbench stopped")


def compare(config: Any, server: ThrowawayMariaDB, tables: int) -> dict[str, int]:
    """Each table read by a plain DuckDB against the source, row for row; rows per table."""
    settings, iceberg = config.target.settings, config.target.kind == "iceberg"
    con = duckdb_with("avro", "iceberg") if iceberg else attach_ducklake(settings)
    counts = {}
    with contextlib.closing(connect(server.root_dsn + DATABASE)) as conn, conn.cursor() as cur:
        for i in range(1, tables + 1):
            cur.execute(f"SELECT id, k, c, pad FROM sbtest{i} ORDER BY id")
            source = [tuple(r) for r in cur.fetchall()]
            relation = (f"iceberg_scan('{iceberg_metadata_location(settings, DATABASE, f'sbtest{i}')}')" if iceberg
                        else f"lake.{DATABASE}.sbtest{i}")
            target = [tuple(r) for r in con.execute(f"SELECT id, k, c, pad FROM {relation} ORDER BY id").fetchall()]
            if source != target:
                missing = [r for r in source if r not in set(target)][:2]
                raise AssertionError(f"sbtest{i}: {len(source)} source rows, {len(target)} target rows; missing {missing}")
            counts[f"sbtest{i}"] = len(source)
    con.close()
    return counts


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tables", type=int, default=4)
    parser.add_argument("--table-size", type=int, default=50_000)
    parser.add_argument("--time", type=int, default=60, help="seconds of sysbench run")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--target", choices=("ducklake", "iceberg"), default="ducklake")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="headrace-sysbench-"))
    results: dict[str, Any] = {"load_avg_start": round(os.getloadavg()[0], 1), **vars(args)}
    with ThrowawayPostgres() as pg, ThrowawayMariaDB(settings={"innodb_buffer_pool_size": "256M"}) as server:
        server.create_database(DATABASE)
        sizes = [f"--tables={args.tables}", f"--table_size={args.table_size}"]
        sysbench(server, "prepare", *sizes)
        config = config_for(server, pg.dsn, work, args.tables, args.target)
        pipeline = Pipeline(config)
        stop, outcome = threading.Event(), {}

        def run() -> None:
            try:
                outcome["code"] = pipeline.run(stop=stop)
            except BaseException as exc:  # reported below
                outcome["error"] = exc

        thread = threading.Thread(target=run, name="pipeline")
        t0 = time.monotonic()
        thread.start()
        try:
            while not all_streaming(pg.dsn):
                if not thread.is_alive():
                    raise RuntimeError(f"the pipeline stopped: {outcome}")
                time.sleep(0.5)
            results["copy_s"] = round(time.monotonic() - t0, 1)
            out = sysbench(server, "run", *sizes, f"--time={args.time}", f"--threads={args.threads}",
                           "--delete_inserts=1", "--report-interval=0")
            end = binlog_end(server)
            results["load_avg_run"] = round(os.getloadavg()[0], 1)
            match = re.search(r"transactions:\s+(\d+)\s+\(([\d.]+) per sec", out)
            results["transactions"], results["tps"] = (int(match.group(1)), float(match.group(2))) if match else (0, 0)
            results["caught_up_s"] = round(wait_caught_up(pipeline, pg.dsn, end, 600), 1)
        finally:
            stop.set()
            thread.join(120)
        if "error" in outcome:
            raise outcome["error"]
        results["rows"] = compare(config, server, args.tables)
        results["equal"] = True
        results["load_avg_end"] = round(os.getloadavg()[0], 1)
    print(f"\nsysbench oltp_read_write --delete_inserts=1, {args.tables} x {args.table_size:,} rows, {args.threads}"
          f" threads, {args.time} s: {results['tps']} TPS beside headrace into {args.target}; caught up"
          f" {results['caught_up_s']} s after sysbench stopped; every table equal to the source (plain DuckDB)."
          f" Load average {results['load_avg_start']} -> {results['load_avg_end']}.")
    print(json.dumps(results, indent=2))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
