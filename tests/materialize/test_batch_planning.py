"""How a table's next apply batch is cut from its staged log (``next_batch``), on a real PostgreSQL
state store: at most ``apply.max_batch_files`` files, one schema, and no more staged rows than
``apply.max_batch_rows`` (on DuckLake by default ``apply.driver_batch_rows``: a backlog drains as a
row of driver batches instead of one Spark batch of everything staged)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace

import pytest

from headrace.config import ApplyConfig
from headrace.core.lanes import Lane, LaneChoice
from headrace.core.schema import Column, ColumnType, TableSchema, TypeKind
from headrace.core.spark_types import ValueRules
from headrace.log.facts import FileFacts
from headrace.log.index import LogEntry, StagedFile
from headrace.materialize.apply import PlannedBatch, next_batch, plan_following
from headrace.run.read_ahead import ReadAhead
from headrace.state.store import StateStore, TableRow
from headrace.targets.ducklake.target import DuckLakeTarget
from headrace.targets.iceberg.target import IcebergTarget
from tests.statestore import fresh_state

KEYED = TableSchema(21, "public", "keyed", (Column("id", ColumnType(TypeKind.LONG, "bigint"), 20),), ("id",))


@pytest.fixture
def state(source_dsn: str) -> Iterator[StateStore]:
    with fresh_state(source_dsn, f"plan_{uuid.uuid4().hex[:8]}", KEYED) as store:
        yield store


def _stage(state: StateStore, rows: list[int], schema: TableSchema = KEYED) -> TableRow:
    files = [StagedFile(schema.oid, f"/staging/{i}.parquet", n, n * 100, i * 10 + 1, i * 10 + 5, schema)
             for i, n in enumerate(rows)]
    state.log_index.register(files, captured_lsn=len(rows) * 10 + 10)
    row = state.table(KEYED.oid)
    assert row is not None
    return row


def test_a_batch_takes_files_up_to_the_row_cap_but_always_one(state: StateStore) -> None:
    row = _stage(state, [40, 30, 50, 500, 10])
    assert [e.rows for e in next_batch(state, row, 0, 200)] == [40, 30, 50, 500, 10]  # no cap
    assert [e.rows for e in next_batch(state, row, 0, 200, max_rows=100)] == [40, 30]  # 40+30+50 > 100
    assert [e.rows for e in next_batch(state, row, 0, 200, max_rows=120)] == [40, 30, 50]  # exactly the cap
    assert [e.rows for e in next_batch(state, row, 0, 2, max_rows=1000)] == [40, 30]  # the file cap still holds
    third = next_batch(state, row, 0, 200)[2].offset
    assert [e.rows for e in next_batch(state, row, third, 200, max_rows=100)] == [500]  # one file over the cap


def test_a_batch_ends_at_a_schema_change_whatever_the_cap(state: StateStore) -> None:
    wider = replace(KEYED, columns=(*KEYED.columns, Column("v", ColumnType(TypeKind.INT, "integer"), 23)))
    row = _stage(state, [10, 10])
    state.log_index.register([StagedFile(KEYED.oid, "/staging/w.parquet", 10, 1000, 100, 105, wider)], 110)
    assert [e.schema for e in next_batch(state, row, 0, 200, max_rows=1000)] == [KEYED, KEYED]


def test_the_row_cap_and_the_driver_bound_by_target() -> None:
    default = ApplyConfig()
    duck, ice = DuckLakeTarget.caps_batches, IcebergTarget.caps_batches
    assert default.driver_batch_rows == 200_000  # one default, in the config model
    assert default.batch_rows(duck) == 200_000 and default.batch_rows(ice) == 200_000
    assert ApplyConfig(driver_batch_rows=0).batch_rows(duck) is None  # driver batches off: no cap
    set_ = ApplyConfig(driver_batch_rows=5, max_batch_rows=1000)
    assert set_.batch_rows(ice) == 1000


def _facts_staged(state: StateStore, rows: list[int], schema: TableSchema = KEYED) -> TableRow:
    first = state.log_index.last_offset(KEYED.oid) or 0
    files = [StagedFile(schema.oid, f"/staging/{first + i}.parquet", n, n * 100, (first + i) * 10 + 1,
                        (first + i) * 10 + 5, schema, FileFacts(inserts=n)) for i, n in enumerate(rows)]
    state.log_index.register(files, captured_lsn=(first + len(rows)) * 10 + 10)
    row = state.table(KEYED.oid)
    assert row is not None
    return row


def _in_flight(row: TableRow, entries: list[LogEntry], cursor: int = 0) -> PlannedBatch:
    return PlannedBatch(row, cursor, entries[-1].offset, entries, row.schema, None, ValueRules(), (), 0.0,
                        LaneChoice(Lane.DRIVER, "fits", "staged rows <= apply.driver_batch_rows"))


def test_the_batch_after_one_in_flight_is_planned_only_when_full(state: StateStore) -> None:
    """``plan_following`` (``run.read_ahead``): the next batch, planned while the one before commits,
    only when more is staged beyond it (planned later it would hold the same files) and in the table's
    shape as it stands; never for a batch built by Spark."""
    target = DuckLakeTarget.__new__(DuckLakeTarget)  # its class's answers only (applies_arrow)
    row = _facts_staged(state, [50, 50, 50, 50, 50])
    tail = state.log_index.last_offset(KEYED.oid)
    first = _in_flight(row, next_batch(state, row, 0, 200, max_rows=100))
    second = plan_following(state, target, row, first, tail, 200, max_rows=100)
    assert second is not None and [e.rows for e in second.entries] == [50, 50]
    assert second.cursor == first.entries[-1].offset and second.build.lane is Lane.DRIVER and second.skip is None
    assert plan_following(state, target, row, second, tail, 200, max_rows=100) is None  # the last, not full
    assert plan_following(state, target, row, first, tail, 200, max_rows=200) is None  # takes the rest: not full
    spark_built = replace(first, build=LaneChoice(Lane.SPARK, "size", "too big"))
    assert plan_following(state, target, row, spark_built, tail, 200, max_rows=100) is None
    wider = replace(KEYED, columns=(*KEYED.columns, Column("v", ColumnType(TypeKind.INT, "integer"), 23)))
    assert plan_following(state, target, replace(row, schema=wider), first, tail, 200, max_rows=100) is None


def test_a_batch_read_ahead_is_taken_only_at_the_cursor_and_shape_it_was_planned_at(state: StateStore) -> None:
    row = _facts_staged(state, [10, 10])
    entries = next_batch(state, row, 0, 200)
    ahead = ReadAhead()
    try:
        for cursor, taken_row, taken in ((0, row, True), (1, row, False), (0, replace(row, snapshot_lsn=7), False)):
            ahead.start(_in_flight(row, entries))
            got = ahead.take(taken_row, cursor)
            assert (got is not None) is taken, (cursor, taken_row)
            assert got is None or got[0].read_ahead
            assert ahead.take(row, 0) is None  # taken or dropped, never twice
    finally:
        ahead.close()


def test_the_log_is_read_ahead_once_for_each_new_tail() -> None:
    ahead = ReadAhead()
    assert ahead.worth_planning(7, 10) and not ahead.worth_planning(7, 10)  # nothing staged since
    assert ahead.worth_planning(7, 11)  # a flush since
    ahead.drop(7)
    assert ahead.worth_planning(7, 11)  # forgotten with the table
    ahead.close()
