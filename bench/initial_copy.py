"""Initial copy throughput: headrace into Iceberg and DuckLake vs raw COPY and dlt.

A table of ``--rows`` rows (mixed types, about 100 bytes a row) is copied by:
  1. raw ``COPY ... TO STDOUT (FORMAT binary)`` read by psql into /dev/null: the physical limit;
  2. the chunk read alone, the whole table as one chunk in this process: CSV text parsed by
     pyarrow (``snapshot.binary_copy: false``) and binary COPY into typed Arrow (the default);
  3. ``headrace run --until-caught-up`` into Iceberg, and into DuckLake (process start, Spark start,
     slot and snapshot included: what a user waits for), with the binary read and, with ``--csv``,
     with the CSV read too (before/after in one run);
  3. dlt's ``sql_database`` source (pyarrow backend) into DuckDB, when dlt can be installed
     (it runs in its own virtualenv under bench/.venv-dlt so it never touches headrace's).
All in the same run, on the same throwaway server.

With ``--small-tables N`` it instead times a schema of N tables of ``--small-rows`` rows each: from
process start until every table is STREAMING (``run --until-caught-up``), on both targets, with a
breakdown from the run's JSON log events (tables added, copy round, per-table copy seconds, the last
table's switch to streaming).

    .venv/bin/python bench/initial_copy.py [--rows 5000000] [--skip-dlt] [--csv]
    .venv/bin/python bench/initial_copy.py --small-tables 200 --small-rows 1000 [--targets ducklake]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from headrace.source.postgres.throwaway import ThrowawayPostgres  # noqa: E402

TABLE_DDL = """
CREATE TABLE bench_copy (
    id bigint PRIMARY KEY, customer integer, amount numeric(12,2), status text,
    created timestamptz, note text, flag boolean, ratio double precision
);
INSERT INTO bench_copy
SELECT g, g % 100000, (g % 10000) / 100.0, (ARRAY['new','paid','shipped','cancelled'])[1 + g % 4],
       '2024-01-01'::timestamptz + g * interval '1 second', md5(g::text) || '-' || (g % 997),
       g % 3 = 0, g / 7.0
FROM generate_series(1, {rows}) g;
"""

DLT_SCRIPT = """
import sys, time, dlt
from dlt.sources.sql_database import sql_table
dsn, out = sys.argv[1], sys.argv[2]
t0 = time.monotonic()
pipe = dlt.pipeline(pipeline_name="bench", destination=dlt.destinations.duckdb(out + "/dlt.duckdb"),
                    dataset_name="bench", pipelines_dir=out + "/dlt-pipelines")
pipe.run(sql_table(credentials=dsn.replace("postgresql://", "postgresql+psycopg2://"), table="bench_copy",
                   backend="pyarrow"))
print(time.monotonic() - t0)
"""


SMALL_DDL = """
CREATE TABLE small.t{i} (id bigint PRIMARY KEY, customer integer, amount numeric(12,2), status text,
                         created timestamptz, note text);
INSERT INTO small.t{i} SELECT g, g % 1000, (g % 10000) / 100.0, (ARRAY['new','paid','shipped'])[1 + g % 3],
       '2024-01-01'::timestamptz + g * interval '1 second', md5(g::text) FROM generate_series(1, {rows}) g;
"""


def timed(cmd: list[str], **kw: Any) -> float:
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, **kw)
    return time.monotonic() - t0


def chunk_reads(dsn: str) -> dict[str, tuple[float, float]]:
    """Wall and CPU seconds (this process, all threads) to read the whole table as one chunk, by the
    CSV path and by the binary path. CPU time is what counts when every core runs a copy task:
    pyarrow's CSV parse is multi-threaded, so its wall time alone flatters it on an idle machine."""
    from headrace.source.postgres.binary_copy import copy_chunk_binary
    from headrace.source.postgres.catalog import read_table_schema
    from headrace.source.postgres.copy import OPEN_END, copy_chunk

    with psycopg.connect(dsn, autocommit=True) as conn:
        oid = conn.execute("SELECT 'bench_copy'::regclass::oid").fetchone()[0]  # type: ignore[index]
        table = read_table_schema(conn, oid)
    out = {}
    for name, read in (("csv", copy_chunk), ("binary", copy_chunk_binary)):
        t0, c0 = time.monotonic(), time.process_time()
        rows = sum(b.num_rows for b in read(dsn, None, table, 0, OPEN_END))
        out[name] = (time.monotonic() - t0, time.process_time() - c0)
        assert rows > 0
    return out


def headrace_copy(dsn: str, work: Path, target: str, rows: int, binary: bool = True) -> float:
    folder = work / (target if binary else f"{target}-csv")
    folder.mkdir()
    target_cfg: dict[str, Any] = (
        {"iceberg": {"warehouse": str(folder / "wh")}} if target == "iceberg"
        else {"ducklake": {"catalog": str(folder / "meta.ducklake"), "data_path": str(folder / "data")}}
    )
    name = f"copy_{target}" + ("" if binary else "_csv")  # its own state and slot
    config = {"name": name, "source": {"dsn": dsn, "tables": ["public.bench_copy"]},
              "target": target_cfg, "staging": {"path": str(folder / "staging")},
              "api": {"listen": "127.0.0.1:0"}, "spark": {"master": "local[*]"},
              "snapshot": {"binary_copy": binary}}
    path = folder / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    with open(folder / "run.log", "w") as run_log:
        seconds = timed([sys.executable, "-m", "headrace.cli", "run", "-c", str(path), "--until-caught-up"],
                        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=run_log)
    with psycopg.connect(dsn, autocommit=True) as conn:  # free the slot for the next run
        conn.execute("SELECT pg_drop_replication_slot(%s)", (f"headrace_{name}",))
    return seconds


def small_tables(dsn: str, work: Path, target: str, tables: int, extra: dict[str, Any]) -> dict[str, Any]:
    """Start to every table STREAMING for the ``small`` schema, and where the time went (log events)."""
    folder = work / f"small-{target}"
    folder.mkdir()
    target_cfg: dict[str, Any] = (
        {"iceberg": {"warehouse": str(folder / "wh")}} if target == "iceberg"
        else {"ducklake": {"catalog": str(folder / "meta.ducklake"), "data_path": str(folder / "data")}}
    )
    name = f"small_{target}"
    config = {"name": name, "source": {"dsn": dsn, "schemas": ["small"]}, "target": target_cfg,
              "staging": {"path": str(folder / "staging")}, "api": {"listen": "127.0.0.1:0"},
              "spark": {"master": "local[*]"}, **extra}
    path = folder / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    t0 = time.time()
    with open(folder / "run.log", "w") as run_log:
        seconds = timed([sys.executable, "-m", "headrace.cli", "run", "-c", str(path), "--until-caught-up"],
                        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=run_log,
                        env={**os.environ, "HEADRACE_LOG_FORMAT": "json"})
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (f"headrace_{name}",))
        streaming = conn.execute(
            "SELECT count(*) FILTER (WHERE state = 'STREAMING'), count(*) FROM _headrace.tables WHERE pipeline = %s",
            (name,)).fetchone()
    events = []
    for line in (folder / "run.log").read_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue

    def at(ev: dict[str, Any]) -> float:
        from datetime import datetime
        return datetime.strptime(ev["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").timestamp() + 0.0 - t0

    def first(name: str) -> float | None:
        return next((round(at(e), 2) for e in events if e["event"] == name), None)

    def last(name: str) -> float | None:
        times = [at(e) for e in events if e["event"] == name]
        return round(max(times), 2) if times else None

    per_table = sorted(e["seconds"] for e in events if e["event"] == "snapshot.done")
    out = {"total_s": round(seconds, 2), "streaming": f"{streaming[0]}/{streaming[1]}" if streaming else None,
           "run_start_at": first("run.start"), "first_added_at": first("table.added"),
           "last_added_at": last("table.added"), "first_copy_start_at": first("snapshot.start"),
           "last_copy_done_at": last("snapshot.done"), "first_streaming_at": first("table.streaming"),
           "last_streaming_at": last("table.streaming"), "caught_up_at": first("run.caught_up"),
           "copied_tables": len(per_table)}
    if per_table:
        out["copy_table_s_median"] = per_table[len(per_table) // 2]
        out["copy_table_s_p90"] = per_table[int(len(per_table) * 0.9)]
        out["copy_table_s_sum"] = round(sum(per_table), 1)
    out["load_avg"] = [round(x, 2) for x in os.getloadavg()]
    return out


def dlt_copy(dsn: str, work: Path) -> float | None:
    venv = ROOT / "bench" / ".venv-dlt"
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        try:
            subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "dlt[duckdb,sql_database]", "pyarrow",
                            "psycopg2-binary", "sqlalchemy"], check=True, timeout=900)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            return None
    out = subprocess.run([str(venv / "bin" / "python"), "-c", DLT_SCRIPT, dsn, str(work)], capture_output=True,
                         text=True, env={**os.environ, "RUNTIME__LOG_LEVEL": "WARNING"})
    if out.returncode != 0:
        print(out.stderr[-2000:], file=sys.stderr)
        return None
    return float(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--skip-dlt", action="store_true")
    parser.add_argument("--csv", action="store_true", help="also copy with the CSV read (the path before)")
    parser.add_argument("--reads-only", action="store_true", help="raw COPY and the chunk reads, no headrace runs")
    parser.add_argument("--small-tables", type=int, default=0, help="instead: N small tables to STREAMING")
    parser.add_argument("--small-rows", type=int, default=1000)
    parser.add_argument("--targets", default="iceberg,ducklake")
    parser.add_argument("--snapshot", default="{}", help="snapshot settings as JSON, for before/after runs")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="headrace-copy-bench-"))
    if args.small_tables:
        return main_small(args, work)
    results: dict[str, Any] = {"rows": args.rows}
    with ThrowawayPostgres() as pg:
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            conn.execute(TABLE_DDL.format(rows=args.rows))
            conn.execute("VACUUM ANALYZE bench_copy")  # outside the load's transaction
            size = conn.execute("SELECT pg_table_size('bench_copy')").fetchone()[0]  # type: ignore[index]
        results["table_mb"] = round(size / 2**20)
        results["bytes_per_row"] = round(size / args.rows)
        raw = timed(["psql", pg.dsn, "-qAt", "-c", "COPY bench_copy TO STDOUT (FORMAT binary)"],
                    stdout=subprocess.DEVNULL)
        results["raw_copy_s"] = round(raw, 2)
        results["raw_copy_rows_per_s"] = round(args.rows / raw)
        results["raw_copy_mb_per_s"] = round(size / 2**20 / raw, 1)
        for name, (secs, cpu) in chunk_reads(pg.dsn).items():
            results[f"read_{name}_s"] = round(secs, 2)
            results[f"read_{name}_cpu_s"] = round(cpu, 2)
            results[f"read_{name}_rows_per_s"] = round(args.rows / secs)
            results[f"read_{name}_vs_raw_copy"] = round(raw / secs, 3)
        for target in () if args.reads_only else ("iceberg", "ducklake"):
            for binary in (True, False) if args.csv else (True,):
                secs = headrace_copy(pg.dsn, work, target, args.rows, binary)
                key = f"headrace_{target}" + ("" if binary else "_csv")
                results[f"{key}_s"] = round(secs, 2)
                results[f"{key}_rows_per_s"] = round(args.rows / secs)
                results[f"{key}_mb_per_s"] = round(size / 2**20 / secs, 1)
                results[f"{key}_vs_raw_copy"] = round(raw / secs, 3)
        if not args.skip_dlt and not args.reads_only:
            secs_dlt = dlt_copy(pg.dsn, work)
            if secs_dlt:
                results["dlt_duckdb_s"] = round(secs_dlt, 2)
                results["dlt_duckdb_rows_per_s"] = round(args.rows / secs_dlt)
    print(json.dumps(results, indent=2))
    return 0


def main_small(args: argparse.Namespace, work: Path) -> int:
    """The many-small-tables case: every table STREAMING, per target."""
    results: dict[str, Any] = {"tables": args.small_tables, "rows_per_table": args.small_rows}
    with ThrowawayPostgres() as pg:
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            conn.execute("CREATE SCHEMA small")
            for i in range(args.small_tables):
                conn.execute(SMALL_DDL.format(i=i, rows=args.small_rows))
            conn.execute("VACUUM ANALYZE")
        extra = {"snapshot": json.loads(args.snapshot)} if args.snapshot != "{}" else {}
        for target in args.targets.split(","):
            results[target] = small_tables(pg.dsn, work, target, args.small_tables, extra)
            print(target, json.dumps(results[target]), file=sys.stderr, flush=True)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
