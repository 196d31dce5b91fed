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

    .venv/bin/python bench/initial_copy.py [--rows 5000000] [--skip-dlt] [--csv]
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
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="headrace-copy-bench-"))
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


if __name__ == "__main__":
    sys.exit(main())
