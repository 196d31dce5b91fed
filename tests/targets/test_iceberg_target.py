"""IcebergTarget against real Iceberg tables in a temp warehouse: snapshot, apply, replay, TOAST."""

from __future__ import annotations

import itertools
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from headrace.core.errors import ConfigError
from headrace.core.position import Position
from headrace.core.schema import Column, ColumnType, TableSchema, TypeKind
from headrace.targets.iceberg.config import IcebergConfig
from headrace.targets.iceberg.target import IcebergTarget

_catalogs = itertools.count()

TABLE = TableSchema(
    oid=11,
    schema="public",
    name="orders",
    columns=(
        Column("id", ColumnType(TypeKind.LONG, "bigint"), 20),
        Column("odd name, `quoted`", ColumnType(TypeKind.STRING, "text"), 25),
        Column("amount", ColumnType(TypeKind.DECIMAL, "numeric(20,4)", 20, 4), 1700),
        Column(
            "tags", ColumnType(TypeKind.LIST, "text[]", element=ColumnType(TypeKind.STRING, "text")), 1009
        ),
    ),
    key=("id",),
)
SNAP_DDL = "id bigint, `odd name, ``quoted``` string, amount decimal(20,4), tags array<string>, _hr_lsn bigint, _hr_seq bigint, _hr_commit_ts timestamp"
BATCH_DDL = SNAP_DDL + ", _hr_op string, _hr_unchanged string"
TS = datetime(2024, 1, 2, 3, 4, 5, 123456)


@pytest.fixture
def target(spark: SparkSession, tmp_path: Path) -> IcebergTarget:
    # A catalog per test: Spark caches a catalog by name, with the warehouse it first saw.
    settings = IcebergConfig(warehouse=str(tmp_path / "wh"), catalog_name=f"hr_test_{next(_catalogs)}")
    return IcebergTarget(spark, settings, pipeline="p")


def _contents(target: IcebergTarget, table: TableSchema = TABLE) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in target.read_table(table).collect())


def _snapshot(spark: SparkSession, target: IcebergTarget) -> None:
    rows = spark.createDataFrame(
        [
            (1, "a", Decimal("1.0000"), ["x", None], 100, 0, None),
            (2, "b", Decimal("12345678901234.5678"), [], 100, 0, None),
            (3, None, None, None, 100, 0, None),
        ],
        SNAP_DDL,
    )
    assert target.write_snapshot(TABLE, rows, Position(100)) == 3


def test_snapshot_replaces_contents(spark: SparkSession, target: IcebergTarget) -> None:
    assert target.ensure_table(TABLE) == "`" + target.settings.catalog_name + "`.`public`.`orders`"
    partial = spark.createDataFrame([(9, "partial", None, None, 50, 0, None)], SNAP_DDL)
    target.write_snapshot(TABLE, partial, Position(50))
    _snapshot(spark, target)  # a retried copy must not append to the earlier attempt
    assert [r[0] for r in _contents(target)] == [1, 2, 3]
    assert _contents(target)[1][2] == Decimal("12345678901234.5678")


def _batch(spark: SparkSession, rows: list[tuple[Any, ...]]) -> DataFrame:
    return spark.createDataFrame(rows, BATCH_DDL)


def test_apply_batch_is_idempotent(spark: SparkSession, target: IcebergTarget) -> None:
    _snapshot(spark, target)
    batch = _batch(
        spark,
        [
            (1, "a2", Decimal("2"), ["y"], 200, 1, TS, "U", None),
            (2, None, None, None, 200, 2, TS, "D", None),
            (4, "new", Decimal("4"), ['"q"'], 200, 3, TS, "I", None),
            (5, None, None, None, 200, 4, TS, "D", None),  # delete of a row the target never had
            (3, "stale", None, None, 90, 1, TS, "U", None),  # older than the snapshot: ignored
        ],
    )
    target.apply_batch(TABLE, batch, None, 1)
    expected = [
        (1, "a2", Decimal("2.0000"), ["y"], 200, 1, TS),
        (3, None, None, None, 100, 0, None),
        (4, "new", Decimal("4.0000"), ['"q"'], 200, 3, TS),
    ]
    assert _contents(target) == expected
    target.apply_batch(TABLE, batch, None, 1)  # replay after a crash before the cursor moved
    assert _contents(target) == expected
    # An older batch replayed after a newer one changes nothing either.
    old = _batch(
        spark, [(1, "old", None, None, 150, 1, TS, "U", None), (4, None, None, None, 150, 2, TS, "D", None)]
    )
    target.apply_batch(TABLE, old, None, 0)
    assert _contents(target) == expected


def test_unchanged_toast_columns_keep_target_value(spark: SparkSession, target: IcebergTarget) -> None:
    _snapshot(spark, target)
    batch = _batch(
        spark,
        [
            (1, "a2", None, None, 200, 1, TS, "U", "amount,tags"),
            (2, "b2", Decimal("7"), None, 200, 2, TS, "U", "tags"),
        ],
    )
    target.apply_batch(TABLE, batch, None, 1)
    rows = _contents(target)
    assert rows[0][:4] == (1, "a2", Decimal("1.0000"), ["x", None])
    assert rows[1][:4] == (2, "b2", Decimal("7.0000"), [])


def test_truncate_before_deletes_older_rows(spark: SparkSession, target: IcebergTarget) -> None:
    _snapshot(spark, target)
    batch = _batch(spark, [(7, "after", None, None, 300, 2, TS, "I", None)])
    target.apply_batch(TABLE, batch, Position(300, 1), 1)
    assert [r[0] for r in _contents(target)] == [7]
    target.apply_batch(TABLE, batch, Position(300, 1), 1)
    assert [r[0] for r in _contents(target)] == [7]


def test_composite_key_and_drop(spark: SparkSession, target: IcebergTarget) -> None:
    table = TableSchema(
        oid=12,
        schema="s1",
        name="pairs",
        columns=(
            Column("a", ColumnType(TypeKind.INT, "int"), 23),
            Column("b", ColumnType(TypeKind.STRING, "text"), 25),
            Column("v", ColumnType(TypeKind.TIMESTAMPTZ, "timestamptz"), 1184),
        ),
        key=("a", "b"),
    )
    ddl = "a int, b string, v timestamp, _hr_lsn bigint, _hr_seq bigint, _hr_commit_ts timestamp"
    snap = spark.createDataFrame([(1, "x", TS, 10, 0, None), (1, "y", TS, 10, 0, None)], ddl)
    target.write_snapshot(table, snap, Position(10))
    batch = spark.createDataFrame(
        [
            (1, "x", None, 20, 1, TS, "D", None),
            (1, "y", TS.replace(year=2030), 20, 2, TS, "U", None),
            (2, "x", TS, 20, 3, TS, "I", None),
        ],
        ddl + ", _hr_op string, _hr_unchanged string",
    )
    target.apply_batch(table, batch, None, 1)
    rows = [(r.a, r.b, r.v.year) for r in target.read_table(table).orderBy("a", "b").collect()]
    assert rows == [(1, "y", 2030), (2, "x", 2024)]
    target.drop_table(table)
    assert not spark.catalog.tableExists(target.table_name(table))


def test_catalog_name_cannot_switch_warehouse(
    spark: SparkSession, target: IcebergTarget, tmp_path: Path
) -> None:
    other = IcebergConfig(warehouse=str(tmp_path / "other"), catalog_name=target.settings.catalog_name)
    with pytest.raises(ConfigError, match="catalog_name"):
        IcebergTarget(spark, other, pipeline="p")
    IcebergTarget(spark, target.settings, pipeline="p")  # the same warehouse again is fine
