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
from headrace.core.schema import Column, ColumnType, TableSchema, TypeKind
from headrace.log.index import StagedFile
from headrace.materialize.apply import next_batch
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
