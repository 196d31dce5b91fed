"""Garbage collection of the staged log: files every reader is past are deleted.

The only reader of a table's entries is that table's materializer, so an entry at or below the
table's applied cursor is never read again, whatever the table's state: a table being copied again
(PENDING, SNAPSHOT) keeps its cursor and reads the entries above it once the copy is done.

The run loop removes the entries (``applied_entries``, a few queries) and a ``Collector`` deletes their
files on a thread of its own, many at once on an object store (``StagingStore.delete_many``). The
loop deleted them itself until 2026-11-28: on S3 (moto on loopback) a collection of 814 files took
9.4 s, one DELETE after another, and for those seconds no batch of any table started or ended; it
was the whole of DuckLake's freshness p99 on S3 (10.4 s against 1.4 s on local disk).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor

from headrace.core.interfaces import Target
from headrace.log.store import StagingStore
from headrace.logs import event
from headrace.materialize.apply import CursorCache, current_cursor
from headrace.state.store import StateStore

log = logging.getLogger("headrace.materialize")


class Collector:
    """Deletes the files of the entries every table has applied, off the run loop's thread: one
    collection at a time; files it could not delete (the store away) are tried again with the next."""

    def __init__(self, staging: StagingStore) -> None:
        self.staging = staging
        self._thread: ThreadPoolExecutor | None = None  # made at the first collection, gone at close
        self._running: Future[None] | None = None
        self._left: list[str] = []  # files a deletion failed on (their entries are gone already)

    def step(self, state: StateStore, target: Target, cursors: CursorCache | None = None) -> bool:
        """Remove the applied entries and start deleting their files, unless the last collection's
        deletes are still under way; whether a collection started."""
        if self._running is not None and not self._running.done():
            return False
        locations = self._left + applied_entries(state, target, cursors)
        self._left = []
        if locations:
            if self._thread is None:
                self._thread = ThreadPoolExecutor(1, thread_name_prefix="staging-gc")
            self._running = self._thread.submit(self._delete, locations)
        return True

    def _delete(self, locations: list[str]) -> None:
        started = time.monotonic()
        try:
            self._left = self.staging.delete_many(locations)
        except Exception as exc:  # housekeeping never stops the run; nothing of it is lost either
            log.debug("staging GC deferred: %s", str(exc).strip().splitlines()[:1])
            self._left = locations
        removed = len(locations) - len(self._left)
        if removed:
            event(log, "staging.collected", files=removed, seconds=round(time.monotonic() - started, 3))
        if self._left:
            event(log, "staging.collect_deferred", logging.WARNING, files=len(self._left),
                  then="deleted with the next collection")

    def close(self) -> None:
        """Wait for the deletes under way (a run after this one makes a new thread)."""
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None


def applied_entries(state: StateStore, target: Target, cursors: CursorCache | None = None) -> list[str]:
    """Remove the log entries every table has applied; the locations of their files.

    The cursor is the target's when it keeps one (DuckLake commits it with the data, so it may be
    a batch ahead of ``mat_cursor``), else the state's. Entries first, files after: a crash in
    between leaves files no entry names (the start-up sweep removes them), never an entry whose
    file is gone.
    """
    locations: list[str] = []
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
        locations += state.log_index.collect_entries(row.oid, cursor)
    return locations


def collect_table(state: StateStore, staging: StagingStore, oid: int, through: int) -> int:
    """Delete one table's log entries up to ``through``, then their files; return the file count.

    Rows first: a crash in between leaves files no entry names (the start-up sweep removes them),
    never an entry whose file is gone.
    """
    locations = state.log_index.collect_entries(oid, through)
    staging.delete_many(locations)
    return len(locations)
