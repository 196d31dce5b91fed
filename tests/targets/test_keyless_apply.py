"""Tables without a key in Iceberg: batches are multiset deltas, applied exactly once across replays.

Real staging files, real ``read_change_batch``, real Iceberg tables (DuckLake's keyless apply is
covered by the property test in tests/materialize/test_apply_property.py). Keyless staging
rows look as capture writes them: a delete carries the whole old row, an update the whole old row
in ``_old_key``.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from headrace.core.interfaces import Target
from headrace.core.position import Position
from headrace.core.schema import Column, ColumnType, TableSchema, TypeKind
from headrace.engines.spark.batch import read_change_batch
from headrace.log.codec import StagingBuffer, write_staging_file
from headrace.targets.iceberg import keyless
from headrace.targets.iceberg.config import IcebergConfig
from headrace.targets.iceberg.target import IcebergTarget

_names = itertools.count()

TABLE = TableSchema(
    oid=77,
    schema="public",
    name="bag",
    columns=(Column("a", ColumnType(TypeKind.INT, "integer"), 23), Column("b", ColumnType(TypeKind.STRING, "text"), 25)),
    key=(),
    replica_identity="f",
)


@pytest.fixture
def iceberg(spark: SparkSession, tmp_path: Path) -> IcebergTarget:
    settings = IcebergConfig(warehouse=str(tmp_path / "wh"), catalog_name=f"hr_keyless_{next(_names)}")
    return IcebergTarget(spark, settings, pipeline="p")


def _row(a: int | None, b: str | None) -> str:
    return json.dumps({"a": None if a is None else str(a), "b": b})


def _stage(path: Path, changes: list[tuple[Any, ...]]) -> str:
    """(op, lsn, seq, new or deleted row, old row of an update) as one staging file."""
    buf = StagingBuffer()
    for op, lsn, seq, row, old in changes:
        data = None if row is None else _row(*row)
        buf.append(op, lsn, seq, 1_700_000_000_000_000 + lsn, 1, data, None, None if old is None else _row(*old))
    write_staging_file(path, buf)
    return str(path)


def _apply(spark: SparkSession, target: Target, files: list[str], offset: int) -> None:
    batch = read_change_batch(spark, files, TABLE, None)
    target.apply_batch(TABLE, batch.changes, batch.truncate_before, offset)


def _contents(target: Target) -> Counter[tuple[Any, ...]]:
    return Counter((r.a, r.b) for r in target.read_table(TABLE).collect())


def _files(tmp_path: Path) -> list[str]:
    return [
        _stage(tmp_path / "1.parquet", [
            ("I", 10, 1, (1, "x"), None), ("I", 10, 2, (1, "x"), None), ("I", 10, 3, (1, "x"), None),
            ("I", 11, 1, (2, "y"), None), ("I", 11, 2, (None, "z"), None),
        ]),
        _stage(tmp_path / "2.parquet", [
            ("D", 20, 1, (1, "x"), None),  # one of three identical rows
            ("U", 20, 2, (1, "x"), (2, "y")),  # becomes identical to them
            ("U", 21, 1, (None, "w"), (None, "z")),  # NULLs identify too
            ("I", 22, 1, (3, None), None), ("D", 22, 2, (3, None), None),  # nets to nothing
            ("U", 23, 1, (4, "u"), (1, "x")),  # one of the (1, x) copies changes
        ]),
        _stage(tmp_path / "3.parquet", [
            ("I", 30, 1, (9, "old"), None), ("T", 31, 1, None, None),
            ("I", 32, 1, (5, "a"), None), ("I", 32, 2, (5, "a"), None), ("D", 33, 1, (5, "a"), None),
        ]),
    ]


AFTER_1 = Counter({(1, "x"): 3, (2, "y"): 1, (None, "z"): 1})
AFTER_2 = Counter({(1, "x"): 2, (None, "w"): 1, (4, "u"): 1})
AFTER_3 = Counter({(5, "a"): 1})


def test_iceberg_applies_each_change_once_across_replays_and_crashes(spark: SparkSession, iceberg: IcebergTarget,
                                                                     tmp_path: Path) -> None:
    target = iceberg
    target.ensure_table(TABLE)
    files = _files(tmp_path)
    _apply(spark, target, files[:1], 1)
    _apply(spark, target, files[:1], 1)  # a crash after the commit, before the cursor advanced
    assert _contents(target) == AFTER_1
    name = target.table_name(TABLE)
    # A batch that only adds rows is appended: no MERGE, whose scan of the table would follow its size.
    assert [r[0] for r in spark.sql(f"SELECT operation FROM {name}.snapshots").collect()] == ["append"]
    apply = keyless.KeylessApply(spark)
    jtable = apply.iceberg_table(name)
    assert apply.applied_position(jtable) == Position(11, 2)
    # A crash between the intent for file 2 and its MERGE: the intent is there, the data is not.
    current = jtable.currentSnapshot().snapshotId()
    keyless._set(jtable, {keyless.INTENT_SNAPSHOT: str(current), keyless.INTENT_POSITION: "23/1",
                          keyless.APPLIED_POSITION: "11/2"})
    assert apply.applied_position(apply.iceberg_table(name)) == Position(11, 2)
    # A compaction in between is not mistaken for the batch's commit.
    spark.sql(f"CALL {target.settings.catalog_name}.system.rewrite_data_files(table => 'public.bag', "
              "options => map('rewrite-all', 'true'))")
    assert apply.applied_position(apply.iceberg_table(name)) == Position(11, 2)
    _apply(spark, target, files[1:2], 2)
    assert _contents(target) == AFTER_2
    assert apply.applied_position(apply.iceberg_table(name)) == Position(23, 1)
    _apply(spark, target, files[1:3], 3)  # file 2 replayed, cut differently: only file 3 is new
    assert _contents(target) == AFTER_3
    _apply(spark, target, files[1:3], 3)
    assert _contents(target) == AFTER_3
