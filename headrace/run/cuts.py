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

from collections.abc import Sequence

from headrace.config import ApplyConfig
from headrace.core.interfaces import Target
from headrace.materialize.apply import CursorCache, current_cursor, next_batch
from headrace.state.store import StateStore, TableRow


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
