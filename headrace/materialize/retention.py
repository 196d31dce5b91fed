"""Garbage collection of the staged log: files every reader is past are deleted.

The only reader of a table's entries is that table's materializer, so an entry at or below the
table's applied cursor is never read again, whatever the table's state: a table being copied again
(PENDING, SNAPSHOT) keeps its cursor and reads the entries above it once the copy is done.
"""

from __future__ import annotations

import logging

from headrace.core.interfaces import Target
from headrace.log.store import StagingStore
from headrace.logs import event
from headrace.materialize.apply import CursorCache, current_cursor
from headrace.state.store import StateStore

log = logging.getLogger("headrace.materialize")


def collect_applied(state: StateStore, target: Target, staging: StagingStore,
                    cursors: CursorCache | None = None) -> int:
    """Delete the staged files (and log entries) every table has applied; return the file count.

    The cursor is the target's when it keeps one (DuckLake commits it with the data, so it may be
    a batch ahead of ``mat_cursor``), else the state's.
    """
    removed = 0
    staged = state.log_index.tails()  # a table with no entries left has nothing to collect: no query
    for row in state.tables():
        if row.oid not in staged:
            continue
        try:
            cursor = current_cursor(state, target, row, cursors)
        except Exception as exc:
            # Housekeeping never stops the run: a lake busy with another writer (a SQLite catalog
            # locked by a reader) or a broken table is the apply pass's to report, per table; the
            # files wait for the next collection.
            log.debug("staging GC skips %s: %s", row.qualified_name, str(exc).strip().splitlines()[:1])
            continue
        if cursor <= 0:
            continue
        removed += collect_table(state, staging, row.oid, cursor)
    if removed:
        event(log, "staging.collected", files=removed)
    return removed


def collect_table(state: StateStore, staging: StagingStore, oid: int, through: int) -> int:
    """Delete one table's log entries up to ``through``, then their files; return the file count.

    Rows first: a crash in between leaves files no entry names (the start-up sweep removes them),
    never an entry whose file is gone.
    """
    locations = state.log_index.collect_entries(oid, through)
    for location in locations:
        staging.delete(location)
    return len(locations)
