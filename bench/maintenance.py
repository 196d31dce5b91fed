"""Maintenance benchmark: a churn of small apply batches, then one maintenance pass, both targets.

    PYTHONPATH=. .venv/bin/python bench/maintenance.py [--rows 20000] [--batches 200] [--changes 50]

Each target gets a copy of ``--rows`` rows, then ``--batches`` apply batches of ``--changes``
changes (updates of random keys, a few deletes and inserts) through the target's own
``apply_batch``, as the run loop applies a flush. Reported before and after one maintenance pass
(``Target.maintain``, retention 0, keep 2 snapshots): data files, delete files, snapshots, bytes,
and the full-scan read time (median of 5: Spark ``sum``/``count`` over the Iceberg table; DuckDB
over the DuckLake table). The reference is the same scan right after the copy (one commit).
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from pyspark.sql import SparkSession
from timing import median_ms  # bench/timing.py, beside this script

from headrace.core.interfaces import Target
from headrace.core.maintenance import MaintenancePolicy, TableFiles
from headrace.core.position import Position
from headrace.core.schema import Column, ColumnType, TableSchema, TypeKind
from headrace.engines.spark.session import build_session
from headrace.targets.ducklake.config import DuckLakeConfig
from headrace.targets.iceberg.config import IcebergConfig
from headrace.targets.iceberg.session import iceberg_session_conf

TABLE = TableSchema(oid=1, schema="public", name="churn", key=("id",), columns=(
    Column("id", ColumnType(TypeKind.LONG, "bigint"), 20),
    Column("v", ColumnType(TypeKind.LONG, "bigint"), 20),
    Column("pad", ColumnType(TypeKind.STRING, "text"), 25),
))
ROW_DDL = "id bigint, v bigint, pad string, _hr_lsn bigint, _hr_seq bigint, _hr_commit_ts timestamp"
BATCH_DDL = ROW_DDL + ", _hr_op string, _hr_unchanged string"
POLICY = MaintenancePolicy(retention_seconds=0, keep_last=2, orphan_age_seconds=24 * 3600)
TS = datetime(2026, 1, 1)



def churn(spark: SparkSession, target: Target, rows: int, batches: int, changes: int) -> float:
    """Copy, then ``batches`` small batches; returns the seconds the batches took."""
    pad = "p" * 100
    copy = spark.createDataFrame([(i, 0, pad, 1, 0, TS) for i in range(rows)], ROW_DDL)
    target.write_snapshot(TABLE, copy, Position(1))
    rng = random.Random(7)
    alive = set(range(rows))
    next_id = rows
    started = time.perf_counter()
    for b in range(batches):
        lsn = 100 + b
        keys = rng.sample(sorted(alive), changes - 4)
        batch = [(k, b, pad, lsn, i, TS, "U", None) for i, k in enumerate(keys[:-2])]
        for i, k in enumerate(keys[-2:]):  # two deletes (key only)
            batch.append((k, None, None, lsn, changes + i, TS, "D", None))
            alive.discard(k)
        for i in range(4):  # four inserts
            batch.append((next_id, b, pad, lsn, 2 * changes + i, TS, "I", None))
            alive.add(next_id)
            next_id += 1
        target.apply_batch(TABLE, spark.createDataFrame(batch, BATCH_DDL), None, b + 1)
    return time.perf_counter() - started


def scan(spark: SparkSession, target: Target) -> Callable[[], object]:
    """A full scan of the table by the reader a user would reach for first."""
    if target.name == "iceberg":
        return lambda: target.read_table(TABLE).selectExpr("sum(v)", "count(*)", "max(length(pad))").collect()
    con = target._con  # type: ignore[attr-defined]
    return lambda: con.execute("SELECT sum(v), count(*), max(length(pad)) FROM hr_lake.public.churn").fetchall()


def measure(spark: SparkSession, target: Target, rows: int, batches: int, changes: int) -> list[str]:
    """One target's results as markdown table rows."""
    pad = "p" * 100
    reference = spark.createDataFrame([(i, 0, pad, 1, 0, TS) for i in range(rows)], ROW_DDL)
    target.write_snapshot(TABLE, reference, Position(1))
    copy_files = target.table_files(TABLE)
    scan(spark, target)()  # warm-up: the first Spark job of a session pays for JIT and class loading
    copy_ms = median_ms(scan(spark, target))
    target.drop_table(TABLE)
    churn_s = churn(spark, target, rows, batches, changes)
    before = target.table_files(TABLE)
    read = scan(spark, target)
    expected = read()
    before_ms = median_ms(read)
    started = time.perf_counter()
    target.maintain(TABLE, POLICY)
    maintain_s = time.perf_counter() - started
    after = target.table_files(TABLE)
    assert read() == expected, "maintenance changed the rows"
    after_ms = median_ms(read)

    def line(label: str, files: TableFiles | None, ms: float, extra: str) -> str:
        assert files is not None
        return (f"| {target.name} | {label} | {files.data_files} | {files.delete_files} | {files.snapshots} | "
                f"{files.bytes / 1e6:.2f} | {ms:.0f} | {ms / copy_ms:.2f}x | {extra} |")

    return [
        line("after the copy (reference)", copy_files, copy_ms, ""),
        line(f"after {batches} batches", before, before_ms, f"churn {churn_s:.0f} s ({churn_s / batches:.2f} s/batch)"),
        line("after maintenance", after, after_ms, f"maintenance pass {maintain_s:.1f} s"),
    ]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--changes", type=int, default=50)
    parser.add_argument("--targets", default="iceberg,ducklake")
    args = parser.parse_args()
    spark = build_session("local[2]", target_conf=iceberg_session_conf())
    root = Path(tempfile.mkdtemp(prefix="hr-bench-maint-"))
    lines = ["| target | when | data files | delete files | snapshots | MB | full scan ms | vs copy | note |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    try:
        for kind in args.targets.split(","):
            target: Target
            if kind == "iceberg":
                from headrace.targets.iceberg.target import IcebergTarget

                target = IcebergTarget(spark, IcebergConfig(warehouse=str(root / "wh"), catalog_name="bench"), "b")
            else:
                from headrace.targets.ducklake.target import DuckLakeTarget

                target = DuckLakeTarget(spark, DuckLakeConfig(catalog=str(root / "lake" / "meta.ducklake"),
                                                              data_path=str(root / "lake" / "data")), "b")
            try:
                lines += measure(spark, target, args.rows, args.batches, args.changes)
            finally:
                target.close()
            print("\n".join(lines), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\n{args.rows} rows, {args.batches} batches of {args.changes} changes; local[2]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
