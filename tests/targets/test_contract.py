"""The target contract (``headrace.core.interfaces.Target``), checked on every kind in
``TARGET_KINDS`` against real tables: snapshots, changes, TOAST, stale replays, truncates,
composite keys, keyless multisets and the cursor committed with the data.

Target-specific checks (catalog kinds, files on disk, what plain DuckDB reads) stay in
test_ducklake_target.py and test_iceberg_target.py.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession

from headrace.core.interfaces import Target
from headrace.core.lanes import LaneChoice
from headrace.core.position import Position
from headrace.core.schema import Column, ColumnType, TableSchema, TypeKind
from headrace.core.spark_types import ValueRules
from headrace.engines.driver.batch import batch_schema, read_driver_batch
from headrace.engines.spark.batch import read_change_batch
from headrace.log.codec import read_staging_file
from headrace.log.facts import FileFacts, facts_of
from headrace.targets.ducklake.files import to_arrow
from tests.targets.conftest import assert_cursor, batch_df, rows_of, snapshot_df
from tests.targets.test_keyless_apply import AFTER_1, AFTER_2, AFTER_3
from tests.targets.test_keyless_apply import TABLE as BAG
from tests.targets.test_keyless_apply import _files as keyless_files

TABLE = TableSchema(
    oid=11,
    schema="public",
    name="orders",
    columns=(
        Column("id", ColumnType(TypeKind.LONG, "bigint"), 20),
        Column("odd name, `quoted`", ColumnType(TypeKind.STRING, "text"), 25),
        Column("amount", ColumnType(TypeKind.DECIMAL, "numeric(20,4)", 20, 4), 1700),
        Column("tags", ColumnType(TypeKind.LIST, "text[]", element=ColumnType(TypeKind.STRING, "text")), 1009),
        Column("doc", ColumnType(TypeKind.STRING, "text"), 25),  # stands for a TOAST column
    ),
    key=("id",),
)
# (id, odd name, amount, tags, doc)
SNAPSHOT = [
    (1, "a", Decimal("1.0000"), ["x", None], "big1"),
    (2, "b", Decimal("12345678901234.5678"), [], "big2"),
    (3, None, None, None, "big3"),
]


@pytest.fixture(params=["spark", "driver"])
def lane(request: pytest.FixtureRequest) -> str:
    """The lane a keyed batch reaches the target by: a Spark DataFrame (``apply_batch``), or the Arrow
    table the driver builds (``apply_arrow_batch``, for a target that ``applies_arrow``)."""
    return str(request.param)


def apply(target: Target, lane: str, table: TableSchema, batch: DataFrame, truncate_before: Position | None,
          offset: int) -> LaneChoice:
    """``batch`` applied by ``lane``: the same rows, as a DataFrame or as the driver's Arrow batch."""
    if lane == "spark":
        return target.apply_batch(table, batch, truncate_before, offset)
    if not target.applies_arrow:
        pytest.skip(f"target {target.name} takes no Arrow batches: the Spark lane only")
    shape = batch_schema(table)
    arrow = to_arrow(batch)
    assert set(arrow.column_names) == set(shape.names), "the Spark batch and the driver's differ in columns"
    return target.apply_arrow_batch(table, arrow.select(shape.names).cast(shape), truncate_before, offset)


def _snapshot(spark: SparkSession, target: Target) -> None:
    target.ensure_table(TABLE)
    assert target.write_snapshot(TABLE, snapshot_df(spark, TABLE, SNAPSHOT), Position(100)) == 3


def test_snapshot_replaces_a_partial_copy(spark: SparkSession, target: Target) -> None:
    target.ensure_table(TABLE)
    partial = snapshot_df(spark, TABLE, [(9, "partial", None, None, None)], lsn=50)
    assert target.write_snapshot(TABLE, partial, Position(50)) == 1
    _snapshot(spark, target)  # a retried copy must not append to the earlier attempt
    rows = rows_of(target, TABLE)
    assert {k: v[:5] for k, v in rows.items()} == {r[0]: r for r in SNAPSHOT}
    assert {v[5:] for v in rows.values()} == {(100, 0)}
    assert_cursor(target, TABLE, None)


def test_insert_update_delete_key_change_and_toast(spark: SparkSession, target: Target, lane: str) -> None:
    _snapshot(spark, target)
    batch = batch_df(spark, TABLE, [
        ("I", 200, 0, None, 4, "d", Decimal("4"), ['"q"'], "big4"),
        ("U", 200, 1, "doc", 1, "a2", Decimal("2"), ["y"], None),  # doc unchanged (TOAST): keep big1
        ("D", 200, 2, None, 2, None, None, None, None),
        ("D", 200, 3, None, 3, None, None, None, None),  # key change 3 -> 30: delete old key ...
        ("I", 200, 3, None, 30, None, None, None, "big3"),  # ... insert the new one
        ("D", 200, 4, None, 5, None, None, None, None),  # delete of a row the target never had
    ])
    apply(target, lane, TABLE, batch, None, 10)
    rows = rows_of(target, TABLE)
    assert {k: v[:5] for k, v in rows.items()} == {
        1: (1, "a2", Decimal("2.0000"), ["y"], "big1"),
        4: (4, "d", Decimal("4.0000"), ['"q"'], "big4"),
        30: (30, None, None, None, "big3"),
    }
    assert rows[1][5:] == (200, 1)  # each row carries the position of the change that wrote it
    assert_cursor(target, TABLE, 10)


def test_unchanged_toast_columns_keep_the_target_value(spark: SparkSession, target: Target, lane: str) -> None:
    _snapshot(spark, target)
    batch = batch_df(spark, TABLE, [
        ("U", 200, 1, "amount,tags,doc", 1, "a2", None, None, None),
        ("U", 200, 2, "tags", 2, "b2", Decimal("7"), None, None),
    ])
    apply(target, lane, TABLE, batch, None, 1)
    rows = rows_of(target, TABLE)
    assert rows[1][:5] == (1, "a2", Decimal("1.0000"), ["x", None], "big1")
    assert rows[2][:5] == (2, "b2", Decimal("7.0000"), [], None)


def test_replays_and_stale_changes_change_nothing(spark: SparkSession, target: Target, lane: str) -> None:
    _snapshot(spark, target)
    batch = batch_df(spark, TABLE, [
        ("U", 200, 1, None, 1, "a2", Decimal("2"), ["y"], "x2"),
        ("D", 200, 2, None, 2, None, None, None, None),
        ("I", 200, 3, None, 4, "new", Decimal("4"), None, "z"),
        ("U", 90, 1, None, 3, "stale", None, None, None),  # older than the snapshot: ignored
    ])
    apply(target, lane, TABLE, batch, None, 5)
    first = rows_of(target, TABLE)
    assert first == {
        1: (1, "a2", Decimal("2.0000"), ["y"], "x2", 200, 1),
        3: (3, None, None, None, "big3", 100, 0),
        4: (4, "new", Decimal("4.0000"), None, "z", 200, 3),
    }
    apply(target, lane, TABLE, batch, None, 5)  # replay after a crash before the cursor moved
    assert rows_of(target, TABLE) == first
    assert_cursor(target, TABLE, 5)
    # An older batch replayed after a newer one changes nothing: a change at or before the row's
    # position never overwrites or deletes it.
    old = batch_df(spark, TABLE, [
        ("U", 150, 1, None, 1, "old", None, None, None),
        ("D", 150, 2, None, 4, None, None, None, None),
    ])
    apply(target, lane, TABLE, old, None, 6)
    same = batch_df(spark, TABLE, [("U", 200, 1, None, 1, "same position", None, None, None)])
    apply(target, lane, TABLE, same, None, 6)
    assert rows_of(target, TABLE) == first
    assert_cursor(target, TABLE, 6)
    # Catch-up after a snapshot: an insert of a key the target already holds replaces it.
    apply(target, lane, TABLE, batch_df(spark, TABLE, [("I", 300, 0, None, 3, "c3", None, None, "z3")]), None, 7)
    rows = rows_of(target, TABLE)
    assert rows[3][:5] == (3, "c3", None, None, "z3")
    assert sorted(rows) == [1, 3, 4]


def test_truncate_before_deletes_older_rows(spark: SparkSession, target: Target, lane: str) -> None:
    _snapshot(spark, target)
    batch = batch_df(spark, TABLE, [("I", 300, 2, None, 7, "after", None, None, None)])
    apply(target, lane, TABLE, batch, Position(300, 1), 3)
    assert list(rows_of(target, TABLE)) == [7]
    apply(target, lane, TABLE, batch, Position(300, 1), 3)  # replayed
    assert list(rows_of(target, TABLE)) == [7]
    apply(target, lane, TABLE, batch_df(spark, TABLE, []), Position(400, 0), 4)  # a truncate alone
    assert rows_of(target, TABLE) == {}
    assert_cursor(target, TABLE, 4)


def test_composite_key_and_drop(spark: SparkSession, target: Target, lane: str) -> None:
    ts = dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=dt.timezone.utc)
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
    target.ensure_table(table)
    target.write_snapshot(table, snapshot_df(spark, table, [(1, "x", ts), (1, "y", ts)], lsn=10), Position(10))
    batch = batch_df(spark, table, [
        ("D", 20, 1, None, 1, "x", None),
        ("U", 20, 2, None, 1, "y", ts.replace(year=2030)),
        ("I", 20, 3, None, 2, "x", ts),
    ])
    apply(target, lane, table, batch, None, 1)
    rows = [(r.a, r.b, r.v.year) for r in target.read_table(table).orderBy("a", "b").collect()]
    assert rows == [(1, "y", 2030), (2, "x", 2024)]
    target.drop_table(table)
    assert target.read_cursor(table) is None  # the cursor goes with the table
    target.ensure_table(table)  # created afresh: nothing of the dropped table is left
    assert target.read_table(table).count() == 0


def test_keyless_batches_apply_each_change_once(spark: SparkSession, target: Target, tmp_path: Path,
                                                lane: str) -> None:
    """Multiset deltas from real staging files, built by Spark or by the driver. A replay after a crash
    before the state cursor moved happens only for a target without its own cursor (the run loop
    asks the target first)."""
    if lane == "driver" and not target.applies_arrow:
        pytest.skip(f"target {target.name} takes no Arrow batches: the Spark lane only")
    target.ensure_table(BAG)
    files = keyless_files(tmp_path)

    def apply(paths: list[str], offset: int) -> Counter[tuple[Any, ...]]:
        if lane == "spark":
            batch = read_change_batch(spark, paths, BAG, None)
            target.apply_batch(BAG, batch.changes, batch.truncate_before, offset)
        else:
            facts: list[FileFacts | None] = [_facts(p) for p in paths]
            built = read_driver_batch(paths, BAG, None, ValueRules(), facts)
            assert isinstance(built.changes, pa.Table)
            target.apply_arrow_batch(BAG, built.changes, built.truncate_before, offset)
        return Counter((r.a, r.b) for r in target.read_table(BAG).collect())

    assert apply(files[:1], 1) == AFTER_1
    if not target.stores_cursor:
        assert apply(files[:1], 1) == AFTER_1
    assert_cursor(target, BAG, 1)
    assert apply(files[1:2], 2) == AFTER_2
    assert apply(files[2:3], 3) == AFTER_3
    assert_cursor(target, BAG, 3)


def _facts(path: str) -> FileFacts:
    """A staged file's facts, as capture registers them at its flush."""
    rows = read_staging_file(path)
    return facts_of(*[rows.column(c).to_pylist() for c in ("_op", "_lsn", "_seq", "_unchanged_cols", "_old_key")])
