"""Where ``apply.consistency: transaction`` cuts the staged log (``run.cuts.cut_offset``), on a real
PostgreSQL state store: at a flush's end, even when a table's batch is capped, and splitting a flush
only when one flush of a table is more than a batch."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from headrace.config import ApplyConfig
from headrace.core.schema import Column, ColumnType, TableSchema, TypeKind
from headrace.log.index import StagedFile
from headrace.materialize.apply import CursorCache
from headrace.run.cuts import cut_offset
from headrace.state.cuts import CutStore
from headrace.state.store import StateStore, TableRow
from tests.statestore import fresh_state

A = TableSchema(31, "public", "a", (Column("id", ColumnType(TypeKind.LONG, "bigint"), 20),), ("id",))
B = TableSchema(32, "public", "b", (Column("id", ColumnType(TypeKind.LONG, "bigint"), 20),), ("id",))


class _Lake:
    """What ``cut_offset`` asks of a target: whether it caps batches (the cursors come from the cache)."""

    caps_batches = True
    stores_cursor = False


@pytest.fixture
def state(source_dsn: str) -> Iterator[StateStore]:
    with fresh_state(source_dsn, f"cut_{uuid.uuid4().hex[:8]}", A, B) as store:
        yield store


def _flush(state: StateStore, lsn: int, *tables: TableSchema) -> list[int]:
    files = [StagedFile(t.oid, f"/staging/{uuid.uuid4().hex}.parquet", 10, 1000, lsn, lsn + 5, t) for t in tables]
    return state.log_index.register(files, captured_lsn=lsn + 10)


def _cut(state: StateStore, **apply: int) -> tuple[int, bool]:
    target, cursors = _Lake(), CursorCache()
    rows: list[TableRow] = [r for r in state.tables()]
    for row in rows:
        cursors.put(target, row, 0)  # type: ignore[arg-type]
    return cut_offset(state, target, rows, state.log_index.tails(), cursors, ApplyConfig(**apply))  # type: ignore[arg-type]


def test_the_cut_is_the_newest_flush_when_every_batch_reaches_it(state: StateStore) -> None:
    _flush(state, 100, A, B)
    last = _flush(state, 200, A, B)
    assert _cut(state) == (last[-1], True)


def test_a_capped_table_moves_the_cut_back_to_a_flush_end(state: StateStore) -> None:
    first = _flush(state, 100, A, B)
    second = _flush(state, 200, A, B)
    # One file per batch: A takes its file of the first flush, so both stop at that flush's end.
    assert _cut(state, max_batch_files=1) == (first[-1], True)
    # A third flush holds two files of A (a spill): three files per batch reach into it but not
    # through it, so the cut is the end of the flush before.
    _flush(state, 300, A, A, B)
    assert _cut(state, max_batch_files=3) == (second[-1], True)


def test_one_flush_over_the_cap_is_split(state: StateStore) -> None:
    offsets = _flush(state, 100, A, A, A, B)
    assert _cut(state, max_batch_files=2) == (offsets[1], False)


def test_the_newest_cut_names_each_tables_snapshot(source_dsn: str) -> None:
    """What maintenance keeps from expiry (``run.maintenance.cut_policy``): the newest cut's snapshot of a
    table, none for a table it does not name."""
    with CutStore(source_dsn, f"cut_{uuid.uuid4().hex[:8]}") as cuts:
        assert cuts.named("`c`.`public`.`a`") is None
        cuts.record(10, 100, {"`c`.`public`.`a`": 1, "`c`.`public`.`b`": 2})
        cuts.record(20, 200, {"`c`.`public`.`a`": 3, "`c`.`public`.`b`": 2})
        assert (cuts.named("`c`.`public`.`a`"), cuts.named("`c`.`public`.`b`")) == (3, 2)
        assert cuts.named("`c`.`public`.`z`") is None


class _Outage:
    """``OutageWatch.explains``: whether the error is a server gone (here: as told)."""

    def __init__(self, gone: bool) -> None:
        self.gone = gone

    def explains(self, exc: BaseException) -> bool:
        return self.gone


class _Across:
    commits_across_tables = True


def test_a_cut_that_failed_transiently_is_applied_again_whole_after_a_backoff() -> None:
    from headrace.core.errors import TerminalError, TransientError
    from headrace.run.cuts import CutRetries

    retries = CutRetries(_Outage(False))  # type: ignore[arg-type]
    first, second, third = object(), object(), object()
    assert retries.due()
    refused = TransientError("CommitFailedException: Requirement failed: branch main has changed")
    assert retries.retried(_Across(), first, refused, "public.a", 2)  # type: ignore[arg-type]
    assert retries.retried(_Across(), first, refused, "public.b", 2)  # type: ignore[arg-type]  # decided once
    assert (retries.failures, retries.due()) == (1, False)  # waits out its backoff
    assert not retries.retried(_Across(), second, TerminalError("bad value"), "public.a", 2)  # type: ignore[arg-type]
    assert retries.failures == 1  # the tables fail as a table's batch does
    retries.committed()
    assert retries.failures == 0
    gone = CutRetries(_Outage(True))  # type: ignore[arg-type]
    assert not gone.retried(_Across(), third, refused, "public.a", 2)  # type: ignore[arg-type]  # the run waits
    alone = _Across()
    alone.commits_across_tables = False  # each table committed on its own: its own retry
    assert not CutRetries(_Outage(False)).retried(alone, third, refused, "public.a", 2)  # type: ignore[arg-type]
