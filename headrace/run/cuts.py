"""``apply.consistency: transaction``: the streaming tables' next batches, cut at one point of the log.

A source transaction that wrote several tables is staged as one file per table in the same flush,
and a flush registers its files in one state transaction. The log index read in one query (one
snapshot) therefore holds whole flushes only, and every table's entries up to the last offset of a
flush hold exactly the source transactions committed before that flush's end: a consistent cut.
Applied in one target transaction (``Target.cut``), that cut is what readers see, all or nothing.

Where the cut falls: at the newest registered offset, unless a table's batch stops short of it (its
``max_batch_files`` or row cap, or a new shape: one batch holds one schema). Then the cut moves back
to the end of the last flush whose entries of that table the batch holds whole, so every table stops
at the same transaction. When that would leave the short table nothing (one flush over the caps, or a shape
change inside a flush), the cut falls right after the short table's batch instead: that flush's
transactions then appear in two steps (the run logs ``apply.cut_split``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from headrace.config import ApplyConfig
from headrace.core.interfaces import Target
from headrace.logs import event
from headrace.materialize.apply import CursorCache, current_cursor, next_batch
from headrace.materialize.error_boundary import classify
from headrace.run.outage import OutageWatch
from headrace.state.lifecycle import TABLE_RETRY
from headrace.state.store import StateStore, TableRow

log = logging.getLogger("headrace.pipeline")


def cut_offset(state: StateStore, target: Target, rows: Sequence[TableRow], tails: dict[int, int],
               cursors: CursorCache, apply: ApplyConfig) -> tuple[int, bool]:
    """The offset the next cut of ``rows`` (streaming tables with staged entries) ends at, and
    whether it ends at a flush's end (False: it splits one, see the module docstring)."""
    cut = max(tails.values())
    max_rows = apply.batch_rows(target.caps_batches)
    best, whole = cut, True
    for row in rows:
        cursor = current_cursor(state, target, row, cursors)
        entries = next_batch(state, row, cursor, apply.max_batch_files, max_rows if row.schema.key else None, cut)
        if not entries or entries[-1].offset >= min(cut, tails[row.oid]):
            continue  # takes all it has up to the cut
        first, last = entries[0].offset, entries[-1].offset
        start, end = state.log_index.flush_bounds(last)
        left_out = state.log_index.entries(row.oid, last, 1, cut)[0].offset  # its first entry not taken
        if left_out > end:
            point, at_flush = end, True  # its batch holds all it has in that flush: cut at the flush's end
        elif start - 1 >= first:
            point, at_flush = start - 1, True  # back to the end of the flush before
        else:
            point, at_flush = last, False  # one flush is more than a batch: split it
        if point < best:
            best, whole = point, at_flush
    return best, whole


class CutRetries:
    """A cut whose batches failed together (a target committing across tables: the multi-table commit
    refused, a conflicting commit to one of its tables, the catalog busy or gone for a moment). A
    transient failure leaves every table of the cut as it was (STREAMING, its cursor read again from
    the target) and the whole cut is planned and applied again after a backoff, however often: were
    its tables failed one by one, each would retry on its own and a transaction they share would
    become visible table by table. Any other failure fails the tables as a table's batch does."""

    def __init__(self, outage: OutageWatch) -> None:
        self.outage = outage  # an outage's error is the run's to wait out, not the cut's
        self.failures = 0  # in a row
        self._not_before = 0.0
        self._decided: tuple[object, bool] | None = None  # the last failed cut, and whether it is retried

    def due(self) -> bool:
        """Whether a cut may be dispatched now (a failed one waits out its backoff)."""
        return time.monotonic() >= self._not_before

    def retried(self, target: Target, cut: object, exc: Exception, table: str, tables: int) -> bool:
        """``cut`` failed with ``exc`` (seen harvesting ``table``, one of its ``tables``): True when it is
        applied again whole (the caller then only forgets the table's cursor); asked once per table
        of the cut, decided at the first."""
        if self._decided is not None and self._decided[0] is cut:
            return self._decided[1]
        failure = classify(exc, table)
        retried = target.commits_across_tables and failure.kind == "transient" and not self.outage.explains(exc)
        self._decided = (cut, retried)
        if retried:
            self.failures += 1
            delay = TABLE_RETRY.delay(self.failures)
            self._not_before = time.monotonic() + delay
            event(log, "apply.cut_retry", logging.WARNING, tables=tables, attempt=self.failures,
                  retry_in_seconds=round(delay, 1),
                  error=f"the cut's commit of {tables} tables failed and is applied again whole in"
                        f" {delay:.0f} s: {failure.message}")
        return retried

    def committed(self) -> None:
        """A cut committed: the next failure backs off from the start."""
        self.failures = 0
        self._decided = None
