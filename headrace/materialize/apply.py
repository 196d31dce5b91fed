"""The materializer's driver side: pick a table's next staged batch, hand it to the target, advance.

A batch is a run of consecutive log entries of one table written under one schema. The cursor
advances only after the target committed; a target that stores the cursor with its data
(``Target.stores_cursor``) is the authority on where the table stands.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from headrace.config import SchemaChangesConfig, ValuesConfig
from headrace.core.faults import crash_point
from headrace.core.interfaces import Target
from headrace.core.position import Position, format_lsn
from headrace.core.spark_types import value_rules
from headrace.log.index import LogEntry
from headrace.logs import event
from headrace.materialize.batch import read_change_batch
from headrace.materialize.evolve import evolve_table
from headrace.state.store import StateStore, TableRow

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("headrace.materialize")



@dataclass(frozen=True)
class Applied:
    """What one apply step did."""

    table: str
    entries: int
    rows_in: int
    log_offset: int
    applied_lsn: int
    seconds: float
    drained: bool  # the batch reached the end of the table's log as it stood when planned
    ddl: tuple[str, ...] = ()  # schema change kinds applied to the target before this batch
    # (column, reason) -> values the casts changed (``values.infinity: clamp``)
    values_changed: dict[tuple[str, str], int] = field(default_factory=dict)


def current_cursor(state: StateStore, target: Target, row: TableRow) -> int:
    """The table's position in the staged log: from the target when it keeps it, else from state."""
    if target.stores_cursor:
        stored = target.read_cursor(row.schema)
        return max(stored or 0, 0)
    return state.log_index.cursor(row.oid)


def next_batch(state: StateStore, row: TableRow, cursor: int, max_files: int) -> list[LogEntry]:
    """Consecutive entries after ``cursor`` that share one schema."""
    entries = state.log_index.entries(row.oid, cursor, max_files)
    if not entries:
        return []
    first = entries[0].schema
    batch = []
    for entry in entries:
        if entry.schema != first:
            break
        batch.append(entry)
    return batch


def apply_next(spark: SparkSession, state: StateStore, target: Target, row: TableRow,
               max_files: int, policy: SchemaChangesConfig | None = None,
               values: ValuesConfig | None = None) -> Applied | None:
    """Apply the table's next batch; None when the table is caught up with the staged log."""
    cursor = current_cursor(state, target, row)
    tail = state.log_index.last_offset(row.oid)
    entries = next_batch(state, row, cursor, max_files)
    if not entries:
        return None
    started = time.monotonic()
    last = entries[-1]
    # Changes committed before the snapshot's LSN are in the copy. A transaction committing exactly
    # at it is not (the slot decodes it), so keep ordinals >= 1 there; were it in the copy, applying
    # it again would change nothing (positions).
    skip = Position(row.snapshot_lsn, 0) if row.snapshot_lsn is not None else None
    schema, ddl = row.schema, list[str]()
    if entries[0].schema != row.schema and (row.snapshot_lsn is None or last.max_lsn >= row.snapshot_lsn):
        # The table changed shape between the last batch and this one: the target follows first.
        # (Batches wholly before the copy are skipped; the copy already has the newer shape.)
        schema, ddl = evolve_table(state, target, row.schema, entries[0].schema, policy or SchemaChangesConfig(),
                                   entries[0].min_lsn)
        target.ensure_table(schema)
    rules = value_rules(row.qualified_name, target, (values or ValuesConfig()).infinity)
    batch = read_change_batch(spark, [e.path for e in entries], schema, skip, rules)
    target.apply_batch(schema, batch.changes, batch.truncate_before, last.offset)
    if (trunc := batch.truncate_before) is not None:
        state.record_ddl(row.oid, row.qualified_name, "truncate", f"TRUNCATE at {format_lsn(trunc.lsn)}", trunc.lsn)
        ddl.append("truncate")
    crash_point("apply.after_target_commit")
    state.log_index.advance(row.oid, last.offset, last.max_lsn, batch.rows_in)
    applied = Applied(row.qualified_name, len(entries), batch.rows_in, last.offset, last.max_lsn,
                      time.monotonic() - started, drained=last.offset >= tail, ddl=tuple(ddl),
                      values_changed=batch.values_changed)
    event(log, "apply.batch", table=applied.table, files=applied.entries, rows=applied.rows_in,
          log_offset=applied.log_offset, applied_lsn=format_lsn(applied.applied_lsn),
          seconds=round(applied.seconds, 3))
    return applied
