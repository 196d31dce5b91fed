"""The log index on a real PostgreSQL: registration with the captured position, reading in log
order, the cursor, collection and the backlog measures."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import psycopg
import pytest

from headrace.core.position import Position
from headrace.core.schema import Column, ColumnType, TableSchema, TypeKind
from headrace.log.facts import FileFacts
from headrace.log.index import StagedFile
from headrace.state.lifecycle import TableState
from headrace.state.store import StateStore
from tests.statestore import fresh_state

A = TableSchema(11, "public", "a", (Column("id", ColumnType(TypeKind.LONG, "bigint"), 20),), ("id",))
B = TableSchema(12, "public", "b", A.columns, ("id",))


@pytest.fixture
def state(source_dsn: str) -> Iterator[StateStore]:
    with fresh_state(source_dsn, "p", A, B) as store:
        yield store


def _file(table: TableSchema, n: int, rows: int = 10) -> StagedFile:
    return StagedFile(table.oid, f"/staging/{table.oid}/{n}.parquet", rows, rows * 100, n * 10, n * 10 + 5, table)


def test_a_resume_token_is_registered_with_its_position(state: StateStore) -> None:
    """The source's token (MySQL: the GTID state) goes with the position it spells, never with another."""
    index = state.log_index

    def token() -> str | None:
        meta = state.meta()
        assert meta is not None
        return meta["captured_token"]

    index.register([], captured_lsn=40, token="g40")
    assert token() == "g40"
    index.register([], captured_lsn=40)  # the same position again (a bound): the token stays
    index.register([], captured_lsn=30, token="g30")  # behind: neither moves
    assert state.captured_lsn() == 40 and token() == "g40"
    index.register([_file(A, 1)], captured_lsn=50)  # a later position without one: none, not g40's
    assert token() is None


def test_files_and_the_captured_position_register_together_in_log_order(state: StateStore) -> None:
    index = state.log_index
    offsets = index.register([_file(A, 1), _file(B, 2), _file(A, 3)], captured_lsn=40, acked_lsn=50)
    assert offsets == sorted(offsets) and len(set(offsets)) == 3
    assert state.captured_lsn() == 40
    meta = state.meta()
    assert meta is not None and meta["acked_lsn"] == 50
    index.register([], captured_lsn=30)  # the position never goes back
    assert state.captured_lsn() == 40
    entries = index.entries(A.oid, 0, 10)
    assert [e.offset for e in entries] == [offsets[0], offsets[2]] and entries[0].schema == A
    assert index.entries(A.oid, offsets[0], 10) == entries[1:]
    assert index.entries(A.oid, 0, 1) == entries[:1]
    assert index.entries_through(A.oid, offsets[2], 1) == entries[1:]
    assert index.last_offset(A.oid) == offsets[2]
    assert index.last_offset(A.oid, before_lsn=30) == offsets[0]  # the second file's changes start at 30
    assert index.registered_paths() == {"/staging/11/1.parquet", "/staging/12/2.parquet", "/staging/11/3.parquet"}


def test_a_registration_that_fails_registers_nothing(state: StateStore) -> None:
    bad = StagedFile(A.oid, "/staging/x.parquet", 2**40, 1, 1, 1, A)  # rows overflow the integer column
    with pytest.raises(psycopg.errors.NumericValueOutOfRange):
        state.log_index.register([_file(A, 1), bad], captured_lsn=99)
    assert state.log_index.entries(A.oid, 0, 10) == [] and state.captured_lsn() == 0


def test_the_cursor_only_advances_and_collection_returns_what_is_applied(state: StateStore) -> None:
    index = state.log_index
    first, second, third = index.register([_file(A, 1), _file(A, 2, rows=3), _file(A, 3, rows=4)], 40)
    assert index.cursor(A.oid) == 0 and index.pending_changes() == {A.oid: 17}
    index.advance(A.oid, second, applied_lsn=25, rows=13)
    index.advance(A.oid, first, applied_lsn=15, rows=0)  # a replayed, older batch does not move it back
    assert index.cursor(A.oid) == second
    row = state.table(A.oid)
    assert row is not None and (row.applied_lsn, row.rows_applied) == (25, 13)
    assert index.pending_changes() == {A.oid: 4} and index.pending_totals() == (4, 400)
    assert index.collect_entries(A.oid, second) == ["/staging/11/1.parquet", "/staging/11/2.parquet"]
    assert [e.offset for e in index.entries(A.oid, 0, 10)] == [third]
    state.remove_table(A.oid)  # the table's cursor and entries go with it
    assert index.entries(A.oid, 0, 10) == [] and index.cursor(A.oid) == 0 and state.table(A.oid) is None


def test_the_backlog_bound_leaves_out_tables_that_do_not_apply(state: StateStore) -> None:
    state.log_index.register([_file(A, 1, rows=5), _file(B, 2, rows=7)], 40)
    assert state.log_index.pending_totals() == (12, 1200)
    state.paused(B.oid, TableState.CATCHUP)
    assert state.log_index.pending_totals() == (5, 500)
    state.errored(A.oid, "boom", kind="transient", fix=None, count=1, retry_at=None, resume=TableState.CATCHUP)
    assert state.log_index.pending_totals() == (0, 0)
    assert state.log_index.pending_changes() == {A.oid: 5, B.oid: 7}  # status still shows them


def test_facts_are_registered_with_the_file_and_an_older_index_upgrades(state: StateStore) -> None:
    index = state.log_index
    facts = FileFacts(inserts=3, updates=2, truncates=1, last_truncate=Position(55, 2), unchanged=True)
    index.register([replace(_file(A, 1, rows=6), facts=facts), _file(A, 2)], captured_lsn=40)
    assert [e.facts for e in index.entries(A.oid, 0, 10)] == [facts, None]
    # A state database from before the facts: the column is added at install, old rows read None.
    state.conn.execute("ALTER TABLE _headrace.log_index DROP COLUMN facts")
    assert [e.facts for e in index.entries(A.oid, 0, 10)] == [None, None]
    state.install()
    assert [e.facts for e in index.entries(A.oid, 0, 10)] == [None, None]
    index.register([replace(_file(A, 3, rows=6), facts=facts)], captured_lsn=50)
    assert [e.facts for e in index.entries(A.oid, 0, 10)] == [None, None, facts]
