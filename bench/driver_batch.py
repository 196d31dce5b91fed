"""Seconds per apply batch, Spark path against the driver path, in one process (issue 22).

For each batch size, a staged file of that many changes (60% updates of existing keys, 25%
inserts, 15% deletes, a text and a timestamp column beside the key) is applied to a DuckLake (or,
with ``--target iceberg``, Iceberg) table of 10,000 rows, alternately through Spark
(``read_change_batch`` + ``apply_batch``) and on the driver (``read_driver_batch`` +
``apply_arrow_batch``); the median of ``--repeat`` runs each, after a warm-up of both. DuckLake: both
end in the same DuckDB commit; the difference is the read, cast and dedup. Iceberg: both end in one
MERGE; the Spark path also runs the batch's read job and its bounds' jobs. The driver path's time is
also split into building the batch (``build``) and applying it.

    PYTHONPATH=. .venv/bin/python bench/driver_batch.py --sizes 10,100,1000,10000 --repeat 7 [--target iceberg]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from headrace.core.position import Position
from headrace.core.schema import Column, ColumnType, TableSchema, TypeKind
from headrace.core.spark_types import ValueRules
from headrace.engines.driver.batch import read_driver_batch
from headrace.engines.spark.batch import read_change_batch
from headrace.engines.spark.session import build_session
from headrace.log.codec import StagingBuffer, encode_row, write_staging_file
from headrace.log.facts import FileFacts
from headrace.targets.ducklake.config import DuckLakeConfig
from headrace.targets.ducklake.target import DuckLakeTarget
from headrace.targets.iceberg.config import IcebergConfig
from headrace.targets.iceberg.session import iceberg_session_conf
from headrace.targets.iceberg.target import IcebergTarget

TABLE = TableSchema(oid=1, schema="public", name="bench", key=("id",), columns=(
    Column("id", ColumnType(TypeKind.LONG, "bigint"), 20), Column("note", ColumnType(TypeKind.STRING, "text"), 25),
    Column("at", ColumnType(TypeKind.TIMESTAMPTZ, "timestamp with time zone"), 1184)))
ROWS = 10_000


def stage(path: Path, n: int, lsn: int, rng: random.Random) -> tuple[str, FileFacts]:
    """``n`` mixed changes at commit LSN ``lsn`` as one staged file."""
    buf = StagingBuffer()
    for seq in range(1, n + 1):
        r = rng.random()
        key = str(rng.randint(1, ROWS)) if r < 0.75 else str(ROWS + lsn * 100_000 + seq)
        op = "U" if r < 0.6 else "D" if r < 0.75 else "I"
        values = (key, f"note {seq}", "2024-05-01 12:00:00.25+00") if op != "D" else (key, None, None)
        data, unchanged = encode_row(TABLE.column_names, values)
        buf.append(op, lsn, seq, 1_700_000_000_000_000, 1, data, unchanged)
    write_staging_file(path, buf)
    return str(path), buf.facts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10,100,1000,10000")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--target", choices=("ducklake", "iceberg"), default="ducklake")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="headrace-driver-bench-"))
    target: DuckLakeTarget | IcebergTarget
    if args.target == "iceberg":
        settings = IcebergConfig(warehouse=str(work / "wh"), catalog_name="bench")
        spark = build_session("local[2]", target_conf=iceberg_session_conf({}, jdbc_driver=False))
        target = IcebergTarget(spark, settings, "bench")
    else:
        spark = build_session("local[2]")
        target = DuckLakeTarget(spark, DuckLakeConfig(catalog=str(work / "meta.ducklake"),
                                                      data_path=str(work / "data")), "bench")
    target.ensure_table(TABLE)
    rng = random.Random(1)
    path, facts = stage(work / "seed.parquet", ROWS, 1, rng)
    target.apply_batch(TABLE, read_change_batch(spark, [path], TABLE, None).changes, None, 1)
    rules = ValueRules("public.bench", "stop", keep_infinity=target.keeps_infinity)
    lsn, offset = 10, 1
    builds: list[float] = []

    def one(n: int, path_: str) -> float:
        nonlocal lsn, offset
        lsn, offset = lsn + 1, offset + 1
        file, f = stage(work / f"b{lsn}.parquet", n, lsn, rng)
        started = time.perf_counter()
        if path_ == "spark":
            batch = read_change_batch(spark, [file], TABLE, Position(0, 0), rules, facts=[f])
            target.apply_batch(TABLE, batch.changes, batch.truncate_before, offset)  # type: ignore[arg-type]
        else:
            batch = read_driver_batch([file], TABLE, Position(0, 0), rules, [f])
            builds.append(time.perf_counter() - started)
            target.apply_arrow_batch(TABLE, batch.changes, batch.truncate_before, offset)  # type: ignore[arg-type]
        return time.perf_counter() - started

    for path_ in ("spark", "driver", "spark", "driver"):  # warm-up: Spark compiles, DuckDB loads
        one(100, path_)
    print(f"{'rows':>7} {'spark s':>9} {'driver s':>9} {'ratio':>7} {'build s':>8}")
    for n in [int(s) for s in args.sizes.split(",")]:
        times: dict[str, list[float]] = {"spark": [], "driver": []}
        builds.clear()
        for _ in range(args.repeat):
            for path_ in ("spark", "driver"):
                times[path_].append(one(n, path_))
        s, d = statistics.median(times["spark"]), statistics.median(times["driver"])
        print(f"{n:>7} {s:>9.3f} {d:>9.3f} {s / d:>6.1f}x {statistics.median(builds):>8.3f}", flush=True)
    target.close()
    spark.stop()


if __name__ == "__main__":
    main()
