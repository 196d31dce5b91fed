"""Named lifecycle transitions: what each one sets and what it leaves, on a real PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone

import pytest

from headrace.core.schema import Column, ColumnType, TableSchema, TypeKind
from headrace.run.copier import COPY_FROM
from headrace.state.lifecycle import TableState, next_retry
from headrace.state.store import StateStore, TableRow

T = TableSchema(21, "public", "orders", (Column("id", ColumnType(TypeKind.LONG, "bigint"), 20),), ("id",))


@pytest.fixture
def state(source_dsn: str) -> Iterator[StateStore]:
    store = StateStore(source_dsn, "p")
    store.install()
    store.add_table(T)
    try:
        yield store
    finally:
        store.close()


def _row(state: StateStore) -> TableRow:
    row = state.table(T.oid)
    assert row is not None
    return row


def _fail(state: StateStore, count: int = 1, retry_at: datetime | None = None,
          resume: TableState | None = TableState.CATCHUP) -> None:
    state.errored(T.oid, "connection refused", kind="transient", fix="start the server", count=count,
                  retry_at=retry_at, resume=resume)


def test_the_copy_then_the_stream(state: StateStore) -> None:
    assert _row(state).state is TableState.PENDING
    state.copy_started(T.oid, 1000)
    row = _row(state)
    assert (row.state, row.snapshot_lsn) == (TableState.SNAPSHOT, 1000)
    state.copy_finished(T.oid, 42)
    row = _row(state)
    assert (row.state, row.rows_copied, row.snapshot_lsn) == (TableState.CATCHUP, 42, 1000)
    state.caught_up(T.oid)
    assert _row(state).state is TableState.STREAMING


def test_the_copier_reads_only_the_tables_a_copy_can_start_from(state: StateStore) -> None:
    """``Copier.start`` asks for the rows in ``COPY_FROM`` only."""
    assert [r.oid for r in state.tables(COPY_FROM)] == [T.oid]  # PENDING
    state.copy_started(T.oid, 1000)
    assert [r.state for r in state.tables(COPY_FROM)] == [TableState.SNAPSHOT]
    state.copy_finished(T.oid, 1)
    assert state.tables(COPY_FROM) == [] and [r.oid for r in state.tables()] == [T.oid]
    _fail(state, resume=TableState.SNAPSHOT)
    assert [r.state for r in state.tables(COPY_FROM)] == [TableState.ERRORED]
    state.caught_up(T.oid)
    assert state.tables(COPY_FROM) == []


def test_an_error_is_recorded_whole_and_cleared_whole(state: StateStore) -> None:
    state.copy_started(T.oid, 1000)
    state.copy_finished(T.oid, 1)
    retry_at = next_retry(2)
    state.errored(T.oid, "x" * 5000, kind="transient", fix=None, count=2, retry_at=retry_at,
                  resume=TableState.CATCHUP)
    row = _row(state)
    assert row.state is TableState.ERRORED and row.error == "x" * 2000  # kept to 2000 characters
    assert (row.error_kind, row.error_count, row.retry_at, row.resume_state) == (
        "transient", 2, retry_at, TableState.CATCHUP)
    assert not row.waits_for_operator
    state.recovered(T.oid, TableState.CATCHUP)
    row = _row(state)
    assert (row.state, row.error, row.error_kind, row.error_fix, row.error_count) == (
        TableState.CATCHUP, None, None, None, 0)
    _fail(state, retry_at=None)
    assert _row(state).waits_for_operator and _row(state).error_fix == "start the server"
    state.caught_up(T.oid)  # an errored table that drains its log streams again, error gone
    row = _row(state)
    assert (row.state, row.error, row.error_fix, row.error_count, row.retry_at) == (
        TableState.STREAMING, None, None, 0, None)


def test_pause_and_resume_return_to_the_state_before(state: StateStore) -> None:
    state.copy_started(T.oid, 1000)
    state.copy_finished(T.oid, 1)
    state.paused(T.oid, TableState.CATCHUP)
    assert (_row(state).state, _row(state).resume_state) == (TableState.PAUSED, TableState.CATCHUP)
    state.resumed(T.oid, TableState.CATCHUP)
    row = _row(state)
    assert (row.state, row.resume_state) == (TableState.CATCHUP, None)
    _fail(state, count=3, retry_at=datetime.now(timezone.utc))
    state.resumed(T.oid, TableState.CATCHUP)  # the operator retries an ERRORED table now
    row = _row(state)
    assert (row.state, row.error, row.error_count, row.retry_at, row.resume_state) == (
        TableState.CATCHUP, None, 0, None, None)


def test_a_resync_starts_from_nothing(state: StateStore) -> None:
    state.copy_started(T.oid, 1000)
    state.copy_finished(T.oid, 9)
    _fail(state, count=5, retry_at=next_retry(5))
    state.resync_requested(T.oid)
    row = _row(state)
    assert (row.state, row.snapshot_lsn, row.rows_copied, row.error, row.error_kind, row.error_count,
            row.retry_at, row.resume_state) == (TableState.PENDING, None, 0, None, None, 0, None, None)


def test_a_copy_that_restarts(state: StateStore) -> None:
    state.copy_started(T.oid, 1000)
    state.copy_restarted(T.oid)  # the table's shape changed under the copy
    row = _row(state)
    assert (row.state, row.snapshot_lsn, row.rows_copied) == (TableState.PENDING, None, 0)
    state.copy_started(T.oid, 2000)
    _fail(state, count=1, retry_at=next_retry(1), resume=TableState.SNAPSHOT)
    state.copy_restarts_on_resume(T.oid)  # the state stays; the resumed copy starts over
    row = _row(state)
    assert (row.state, row.resume_state, row.error_count) == (TableState.ERRORED, TableState.PENDING, 1)
