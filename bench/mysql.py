"""MySQL/MariaDB source: initial copy and change capture against a plain client on the same data.

A throwaway MariaDB (the source) and a throwaway PostgreSQL (headrace's state). A table of
``--rows`` rows (bigint key, int, decimal, varchar, datetime(6), ~100-byte text, a mostly-NULL
column) is loaded with ``INSERT ... SELECT`` from MariaDB's sequence engine. Then, in one run:

1. Copy. References: ``SELECT *`` of the table read by pymysql (server-side cursor) and by the
   ``mariadb --batch --quick`` client to /dev/null; the faster is the physical limit. The copy's
   chunk read alone (``copy_chunk`` of the whole table, the staged text in Arrow) through pymysql
   and through connectorx, one connection each. headrace:
   ``Pipeline.run(until_caught_up=True)`` into DuckLake (state set-up, copy, switch to the binlog),
   with ``snapshot.max_connections`` 1 and 2; Spark is started once before, timed on its own.
2. Changes. ``--changes`` inserts, updates and deletes in transactions of 100 are written while
   headrace is stopped, into a binlog file of their own. References: ``mariadb-binlog
   --read-from-remote-server --base64-output=decode-rows --verbose`` decoding exactly those events
   to /dev/null. headrace: ``BinlogStream`` alone reading them, with mysql-replication's Python row
   decoder and with the C one (``rows_native``; ``--profile`` prints where its time goes), and the
   stopped pipeline run again until caught up (staged and applied to DuckLake). Beside the wall clock,
   the CPU seconds of a run of ``mariadb-binlog`` and of ``BinlogStream`` (``cpu_*`` in the JSON; a
   loaded machine slows the two unequally). ``BinlogStream`` with the C path hands over the staged
   bytes capture takes (``source/mysql/staged.py``).

    .venv/bin/python bench/mysql.py [--rows 1000000] [--changes 200000] [--repeat 3] [--profile] [--png out.png] [--pg]

With ``--repeat N`` the references and the cheap measurements (the chunk read alone, ``BinlogStream``
alone) run N times each and the fastest counts, as the least disturbed by a shared machine's load; the
copy and the catch-up (a pipeline each) run once.

With ``--pg`` the same changes are also drained through the PostgreSQL source into DuckLake
(``bench/mysql_pg_leg.py``): the reference of the issue's 0.8x goal for the MySQL catch-up.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import json
import os
import pstats
import random
import resource
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from headrace.config import parse_config  # noqa: E402
from headrace.core.changes import Delete, Insert, Update  # noqa: E402
from headrace.pipeline import Pipeline  # noqa: E402
from headrace.source.mysql.binlog import BinlogStream  # noqa: E402
from headrace.source.mysql.catalog import read_table_schema  # noqa: E402
from headrace.source.mysql.connect import connect  # noqa: E402
from headrace.source.mysql.copy import OPEN_HIGH, OPEN_LOW, copy_chunk  # noqa: E402
from headrace.source.mysql.position import to_int  # noqa: E402
from headrace.source.mysql.throwaway import ThrowawayMariaDB, find_mariadb_bin  # noqa: E402
from headrace.source.postgres.throwaway import ThrowawayPostgres  # noqa: E402

DATABASE, TABLE = "bench", "items"
CREATE = f"""CREATE TABLE {TABLE} (id BIGINT PRIMARY KEY, customer INT NOT NULL, amount DECIMAL(12,2),
  status VARCHAR(16) NOT NULL, created DATETIME(6) NOT NULL, note TEXT, coupon VARCHAR(32) NULL)"""
# One row per sequence value: ~100 bytes of text, one coupon in ten (the NULL-heavy column).
ROW_SELECT = """SELECT seq, seq % 100000, (seq % 10000) / 100, ELT(1 + seq % 4, 'new', 'paid', 'shipped', 'cancelled'),
  '2024-01-01' + INTERVAL seq SECOND + INTERVAL seq % 1000000 MICROSECOND,
  CONCAT(MD5(seq), MD5(seq + 1), '-', seq % 997, REPEAT('x', 30)), IF(seq % 10 = 0, CONCAT('C', seq), NULL)
  FROM seq_{lo}_to_{hi}"""
TXN = 100  # changes per transaction: 25 inserts, 50 updates, 25 deletes


def rate(count: int, seconds: float) -> int:
    return round(count / seconds) if seconds > 0 else 0


def binlog_end(root: str) -> tuple[str, int]:
    with contextlib.closing(connect(root)) as conn, conn.cursor() as cur:
        cur.execute("SHOW MASTER STATUS")
        file, pos = cur.fetchone()[:2]
    return str(file), int(pos)


def execute(root: str, *statements: str) -> None:
    with contextlib.closing(connect(root)) as conn, conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)


def best(measure: Any, times: int) -> Any:
    """The fastest of ``times`` runs of ``measure`` (seconds, or a tuple starting with them)."""
    return min((measure() for _ in range(max(1, times))), key=lambda r: r[0] if isinstance(r, tuple) else r)


def read_pymysql(root: str) -> float:
    """Seconds to read ``SELECT *`` through pymysql's server-side cursor (rows as Python values)."""
    import pymysql

    t0 = time.monotonic()
    with contextlib.closing(connect(root, cursorclass=pymysql.cursors.SSCursor)) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT * FROM {TABLE}")
        while cur.fetchmany(10_000):
            pass
    return time.monotonic() - t0


def read_chunk(dsn: str, compiled: bool) -> float:
    """Seconds for ``copy_chunk`` to read the whole table as the copy stages it (text columns and
    positions in Arrow, no Spark): connectorx (``compiled``) or the pymysql path."""
    with contextlib.closing(connect(dsn)) as conn:
        schema = read_table_schema(conn, DATABASE, TABLE)
    t0 = time.monotonic()
    rows = sum(b.num_rows for b in copy_chunk(dsn, schema, OPEN_LOW, OPEN_HIGH, compiled=compiled))
    seconds = time.monotonic() - t0
    assert rows > 0
    return seconds


@contextlib.contextmanager
def pymysql_copy(on: bool) -> Any:
    """With ``on``, the pipeline's copy chunks take the pymysql path (the bench's reference; the
    copy runs on driver threads in local mode, so the switch reaches it)."""
    from headrace.source.mysql import copy as chunked

    planned = chunked.arrow_plan
    if on:
        chunked.arrow_plan = lambda columns: "the bench's pymysql reference"  # type: ignore[assignment]
    try:
        yield
    finally:
        chunked.arrow_plan = planned


def read_client(server: ThrowawayMariaDB) -> float:
    """Seconds for the ``mariadb`` command-line client to print ``SELECT *`` to /dev/null."""
    t0 = time.monotonic()
    subprocess.run([find_mariadb_bin("mariadb"), "-h", "127.0.0.1", "-P", str(server.port), "-u", "root",
                    "--batch", "--quick", "-e", f"SELECT * FROM {DATABASE}.{TABLE}"],
                   check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - t0


def pipeline_config(server: ThrowawayMariaDB, state_dsn: str, work: Path, name: str, connections: int) -> Any:
    folder = work / name
    return parse_config({
        "name": name,
        "source": {"dsn": server.dsn_for(DATABASE), "state_dsn": state_dsn, "tables": [f"{DATABASE}.{TABLE}"],
                   "server_id": 1000 + connections},
        "target": {"ducklake": {"catalog": str(folder / "meta.ducklake"), "data_path": str(folder / "data")}},
        "staging": {"path": str(folder / "staging")},
        "apply": {"idle_sleep_seconds": 0.1},
        "snapshot": {"max_connections": connections},
        "spark": {"master": "local[2]"},
        "api": {"listen": "127.0.0.1:0"},
    })


GC_SECONDS: dict[str, float] = {}  # the last pipeline run's time in Python's garbage collector


def run_caught_up(config: Any, spark: Any) -> float:
    """Seconds for a pipeline run until caught up; ``GC_SECONDS`` says how many went to the collector
    (this process holds whatever the measurements before left, unlike ``headrace run``'s own)."""
    spent = {"total": 0.0, "full": 0.0, "start": 0.0}

    def collected(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            spent["start"] = time.perf_counter()
            return
        seconds = time.perf_counter() - spent["start"]
        spent["total"] += seconds
        spent["full"] += seconds if info["generation"] == 2 else 0.0

    gc.callbacks.append(collected)
    t0 = time.monotonic()
    try:
        code = Pipeline(config, spark=spark).run(until_caught_up=True)
    finally:
        gc.callbacks.remove(collected)
    if code != 0:
        raise RuntimeError(f"headrace run of {config.name} exited with {code}")
    GC_SECONDS.update(total=round(spent["total"], 2), full=round(spent["full"], 2))
    return time.monotonic() - t0


def write_changes(root: str, rows: int, changes: int) -> int:
    """``changes`` row changes in transactions of ``TXN``; returns how many were written."""
    rng = random.Random(7)
    transactions = max(1, changes // TXN)
    deletes_total = transactions * TXN // 4
    if deletes_total >= rows // 2:
        raise SystemExit(f"--changes {changes} deletes more than half of --rows {rows}; raise --rows")
    next_id, next_delete = rows + 1, 1
    with contextlib.closing(connect(root, autocommit=False)) as conn, conn.cursor() as cur:
        for _ in range(transactions):
            cur.execute(f"INSERT INTO {TABLE} " + ROW_SELECT.format(lo=next_id, hi=next_id + TXN // 4 - 1))
            next_id += TXN // 4
            # Updates hit the upper half of the loaded keys, which the deletes (from 1 up) never reach.
            ids = ", ".join(str(i) for i in rng.sample(range(rows // 2 + 1, rows + 1), TXN // 2))
            cur.execute(f"UPDATE {TABLE} SET amount = amount + 1, status = 'paid', created = NOW(6) WHERE id IN ({ids})")
            cur.execute(f"DELETE FROM {TABLE} WHERE id BETWEEN {next_delete} AND {next_delete + TXN // 4 - 1}")
            next_delete += TXN // 4
            conn.commit()
    return transactions * TXN


def mariadb_binlog(server: ThrowawayMariaDB, file: str, start: int, stop: int) -> float:
    """Seconds for ``mariadb-binlog`` to fetch and decode (rows as pseudo-SQL) ``file`` from ``start``
    to ``stop`` from the server, to /dev/null."""
    t0 = time.monotonic()
    subprocess.run([find_mariadb_bin("mariadb-binlog"), "--read-from-remote-server", "-h", "127.0.0.1",
                    "-P", str(server.port), "-u", "root", "--base64-output=decode-rows", "--verbose",
                    f"--start-position={start}", f"--stop-position={stop}", file],
                   check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - t0


def stream_changes(dsn: str, start: int, end: int, profile: bool, native: bool = True) -> tuple[float, int]:
    """(seconds, row changes) for ``BinlogStream`` to read the binlog from ``start`` to ``end``; with
    ``profile``, a second pass under cProfile prints its top functions to stderr (not timed: the
    profiler roughly doubles the time)."""

    def drain(profiler: cProfile.Profile | None) -> tuple[float, int]:
        stream = BinlogStream(dsn, 77, start, {(DATABASE, TABLE)}, native=native, staged=native)
        count, t0 = 0, time.monotonic()
        if profiler:
            profiler.enable()
        try:
            while stream.position < end:
                count += sum(isinstance(e, (Insert, Update, Delete, bytes)) for _, e in stream.read(10_000, 1.0))
        finally:
            if profiler:
                profiler.disable()
            stream.close()
        return time.monotonic() - t0, count

    seconds, count = drain(None)
    if profile:
        profiler = cProfile.Profile()
        drain(profiler)
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(20)
    return seconds, count


def plot(rows: list[tuple[str, int, int]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 0.45 * len(rows) + 1))
    labels = [r[0] for r in rows]
    ax.barh(labels, [r[2] for r in rows], color=["grey" if "reference" in r[0] else "tab:blue" for r in rows])
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("rows/s (log scale)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--changes", type=int, default=200_000)
    parser.add_argument("--profile", action="store_true", help="cProfile BinlogStream, top functions to stderr")
    parser.add_argument("--connections", default="1,2", help="snapshot.max_connections values to copy with")
    parser.add_argument("--png", help="also plot rows/s to this PNG")
    parser.add_argument("--pg", action="store_true",
                        help="also drain the same changes through the PostgreSQL source (bench/mysql_pg_leg.py)")
    parser.add_argument("--both-copies", action="store_true",
                        help="also copy end to end through the pymysql path (the reference for connectorx)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs of each reference and of the chunk read and BinlogStream alone; the fastest counts")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="headrace-mysql-bench-"))
    results: dict[str, Any] = {"rows": args.rows, "load_avg_start": round(os.getloadavg()[0], 1)}
    table: list[tuple[str, int, int]] = []  # (what, rows, rows/s) for the printed table
    settings = {"innodb_buffer_pool_size": "1G", "max_binlog_size": "1G"}
    with ThrowawayPostgres() as pg, ThrowawayMariaDB(settings=settings) as server:
        server.create_database(DATABASE)
        root = server.root_dsn + DATABASE
        t0 = time.monotonic()
        execute(root, CREATE, f"INSERT INTO {TABLE} " + ROW_SELECT.format(lo=1, hi=args.rows), f"ANALYZE TABLE {TABLE}")
        results["load_s"] = round(time.monotonic() - t0, 1)
        with contextlib.closing(connect(root)) as conn, conn.cursor() as cur:
            cur.execute("SELECT data_length FROM information_schema.tables WHERE table_schema = %s AND table_name = %s",
                        (DATABASE, TABLE))
            results["table_mb"] = round(int(cur.fetchone()[0]) / 2**20)

        # 1. Copy.
        read_pymysql(root)  # warm the buffer pool
        ref_pymysql, ref_client = best(lambda: read_pymysql(root), args.repeat), best(lambda: read_client(server), args.repeat)
        ref_copy = min(ref_pymysql, ref_client)
        table += [("reference: SELECT * via pymysql SSCursor", args.rows, rate(args.rows, ref_pymysql)),
                  ("reference: SELECT * via mariadb --batch --quick", args.rows, rate(args.rows, ref_client))]
        for compiled, label in ((False, "pymysql"), (True, "connectorx")):
            seconds = best(partial(read_chunk, server.dsn_for(DATABASE), compiled), args.repeat)
            results[f"chunk_read_{label}_s"] = round(seconds, 2)
            table.append((f"headrace chunk read alone ({label}), one connection", args.rows, rate(args.rows, seconds)))
        from headrace.engines.spark.session import build_session

        connections = [int(c) for c in args.connections.split(",")]
        first = pipeline_config(server, pg.dsn, work, "spark", 1)
        t0 = time.monotonic()
        spark = build_session(first.spark.master, first.spark.conf, target_conf=first.target.spark_conf(first.spark.conf))
        results["spark_start_s"] = round(time.monotonic() - t0, 1)
        config = first
        for i, n in enumerate(connections):  # each its own pipeline (state, staging, lake)
            for compiled in (False, True) if args.both_copies else (True,):
                config = pipeline_config(server, pg.dsn, work, f"copy{n}_{i}_{int(compiled)}", n)
                with pymysql_copy(not compiled):
                    seconds = run_caught_up(config, spark)
                label = "connectorx" if compiled else "pymysql"
                results[f"copy_{i}_max_connections_{n}_{label}_s"] = round(seconds, 1)
                table.append((f"headrace copy to DuckLake, max_connections {n}, {label}", args.rows,
                              rate(args.rows, seconds)))

        copies = len(table)

        # 2. Changes, written while headrace is stopped, in a binlog file of their own.
        execute(root, "FLUSH BINARY LOGS")
        file, start = binlog_end(root)
        t0 = time.monotonic()
        written = write_changes(root, args.rows, args.changes)
        results["changes_write_s"] = round(time.monotonic() - t0, 1)
        end_file, end = binlog_end(root)
        assert end_file == file, "the changes span two binlog files: raise max_binlog_size"
        results["changes"] = written
        results["binlog_mb"] = round((end - start) / 2**20, 1)
        results["load_avg_changes"] = round(os.getloadavg()[0], 1)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        ref_binlog = best(lambda: mariadb_binlog(server, file, start, end), args.repeat)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        # CPU seconds a run, beside the wall clock: a loaded machine slows the two unequally.
        results["cpu_mariadb_binlog_s"] = round((after.ru_utime + after.ru_stime - children.ru_utime
                                                 - children.ru_stime) / args.repeat, 3)
        table.append(("reference: mariadb-binlog --verbose (decode rows)", written, rate(written, ref_binlog)))
        for native, label in ((False, "Python rows"), (True, "C rows")):
            cpu = time.process_time()
            stream_s, streamed = best(partial(stream_changes, server.dsn_for(DATABASE), to_int(file, start),
                                              to_int(file, end), args.profile, native), args.repeat)
            results[f"cpu_stream_{label.split()[0].lower()}_s"] = round((time.process_time() - cpu) / args.repeat, 3)
            assert streamed == written, f"the stream read {streamed} changes, {written} were written"
            results[f"stream_{label.split()[0].lower()}_s"] = round(stream_s, 2)
            table.append((f"headrace BinlogStream alone ({label})", written, rate(written, stream_s)))
        catch_up = run_caught_up(config, spark)  # the last copy's pipeline, stopped since
        results["catch_up_gc_s"] = dict(GC_SECONDS)
        table.append(("headrace catch-up to DuckLake (staged + applied)", written, rate(written, catch_up)))
        if args.pg:
            from mysql_pg_leg import postgres_catch_up

            pg_written, pg_s = postgres_catch_up(pg, work, args.rows, args.changes, spark)
            results["pg_catch_up_s"], results["mysql_catch_up_s"] = round(pg_s, 1), round(catch_up, 1)
            results["mysql_vs_pg_catch_up"] = round(rate(written, catch_up) / max(1, rate(pg_written, pg_s)), 3)
            table.append(("PostgreSQL source: catch-up of the same changes to DuckLake", pg_written,
                          rate(pg_written, pg_s)))
        spark.stop()
        results["cpu_stream_c_vs_mariadb_binlog"] = round(results["cpu_mariadb_binlog_s"] / results["cpu_stream_c_s"], 3)
        results["load_avg_end"] = round(os.getloadavg()[0], 1)

    refs = {"copy": rate(args.rows, ref_copy), "changes": rate(written, ref_binlog)}
    print(f"\nMariaDB source: {args.rows:,} rows ({results['table_mb']} MB), {written:,} changes "
          f"({results['binlog_mb']} MB of binlog); load average {results['load_avg_start']} -> "
          f"{results['load_avg_end']}; Spark start {results['spark_start_s']} s (not in the figures)\n")
    print(f"| {'what':<58} | {'rows':>9} | {'rows/s':>9} | {'vs reference':>12} |")
    print(f"|{'-' * 60}|{'-' * 11}|{'-' * 11}|{'-' * 14}|")
    for i, (what, count, per_s) in enumerate(table):
        ref = refs["copy"] if i < copies else refs["changes"]
        print(f"| {what:<58} | {count:>9,} | {per_s:>9,} | {per_s / ref:>12.3f} |")
    print(json.dumps(results, indent=2))
    if args.png:
        plot(table, args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
