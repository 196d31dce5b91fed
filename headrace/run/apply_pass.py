"""One pass of the apply loop over every table, and whether a run started ``--until-caught-up`` is done.

Each table that applies changes (or is due for a retry) gets its next batch. A table that fails
goes to ERRORED and the others go on; an error that comes from an outage (a server went away)
is not the table's: it is raised, and the run waits for the server (``run.outage``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from headrace.config import PipelineConfig
from headrace.core.errors import TerminalError
from headrace.core.interfaces import Target
from headrace.lineage.emitter import Lineage
from headrace.logs import event
from headrace.materialize.apply import CursorCache, apply_next, current_cursor
from headrace.materialize.initial_copy import FailHandler
from headrace.run.maintenance import MaintenanceSchedule
from headrace.run.observer import RunObserver
from headrace.run.outage import OutageWatch
from headrace.state.lifecycle import RETRY_BUDGET, TableState
from headrace.state.store import StateStore, TableRow

if TYPE_CHECKING:  # pyspark loads only when a Spark job runs
    from pyspark.sql import SparkSession

log = logging.getLogger("headrace.pipeline")


@dataclass
class RunStats:
    """Counters the run loop keeps for progress lines and (later) metrics."""

    batches: int = 0
    rows_applied: dict[str, int] = field(default_factory=dict)
    rows_copied: dict[str, int] = field(default_factory=dict)


class ApplyPass:
    """Applies the next batch of every table that is due, reporting each to the observers."""

    def __init__(self, config: PipelineConfig, outage: OutageWatch, fail: FailHandler, observer: RunObserver,
                 maintenance: MaintenanceSchedule, lineage: Lineage, stats: RunStats) -> None:
        self.config = config
        self.outage = outage
        self.fail = fail
        self.observer = observer
        self.maintenance = maintenance
        self.lineage = lineage
        self.stats = stats
        self.cursors = CursorCache()  # the target's cursors, read once per table (and after a failure)
        self.settled = False  # at the last pass every table was STREAMING or PAUSED: the loop may wait long

    def run(self, spark: SparkSession, state: StateStore, target: Target, captured_lsn: int) -> bool:
        """One pass; True when a batch was applied.

        A quiet table costs no query of its own: one query gives every table's newest staged
        offset, and a table whose cursor (kept in memory, ``CursorCache``) is there is skipped.
        """
        did_work = False
        now = datetime.now(timezone.utc)
        rows = state.tables()
        tails = state.log_index.tails()
        self.settled = all(r.state in (TableState.STREAMING, TableState.PAUSED) for r in rows)
        for row in rows:
            retry = retry_apply(row, now)
            if not (row.state.applies_changes or retry):
                self.cursors.forget(row.oid)  # a copy or a failure may move it before the table applies again
                continue
            if self.maintenance.busy(row.oid):
                continue  # compacted right now (run.maintenance): applied when the pass ends
            cursor = None if retry else self.cursors.get(target, row)
            if cursor is not None and tails.get(row.oid, 0) <= cursor:
                applied = None  # nothing staged above the cursor
            else:
                try:
                    applied = apply_next(spark, state, target, row, self.config.apply.max_batch_files,
                                         self.config.schema_changes, self.config.values, self.cursors)
                except Exception as exc:
                    self.cursors.forget(row.oid)  # the target may have committed the batch, or not
                    if not isinstance(exc, TerminalError) and self.outage.explains(exc):
                        raise  # a server went away: the run waits for it; the table did nothing wrong
                    self.fail(state, row, exc, row.resume_state or row.state)
                    continue
            if applied is not None:
                did_work = True
                self.stats.batches += 1
                self.maintenance.batch_applied(row.oid)
                self.observer.batch_applied(state, row, applied)
                self.lineage.batch_applied(state, row, applied)
                self.stats.rows_applied[row.qualified_name] = (
                    self.stats.rows_applied.get(row.qualified_name, 0) + applied.rows_in
                )
                if row.state is TableState.ERRORED:
                    state.recovered(row.oid, row.resume_state or TableState.CATCHUP)
            if (applied is None or applied.drained) and row.state in (TableState.CATCHUP, TableState.ERRORED) \
                    and past_snapshot(row, captured_lsn):
                state.caught_up(row.oid)
                event(log, "table.streaming", table=row.qualified_name)
        return did_work


def past_snapshot(row: TableRow, captured_lsn: int) -> bool:
    """Capture has registered everything up to the table's copy position."""
    return row.snapshot_lsn is None or captured_lsn >= row.snapshot_lsn


def retry_apply(row: TableRow, now: datetime) -> bool:
    """An ERRORED table whose apply is due for another try."""
    return (row.state is TableState.ERRORED and row.resume_state is not None
            and row.resume_state.applies_changes and row.retry_at is not None and row.retry_at <= now)


def caught_up(state: StateStore, target: Target, captured_lsn: int, start_lsn: int,
              cursors: CursorCache | None = None) -> tuple[bool, list[str]]:
    """(every change committed before ``start_lsn`` is applied, the tables that failed for good)."""
    rows = state.tables()
    failed = [r.qualified_name for r in rows
              if r.waits_for_operator or (r.state is TableState.ERRORED and r.error_count >= RETRY_BUDGET)]
    if failed:
        return False, failed
    if captured_lsn < start_lsn:
        return False, []
    for row in rows:
        if row.state is not TableState.STREAMING:
            return False, []
        # Caught up = every change committed before the start is applied; later ones may wait.
        if current_cursor(state, target, row, cursors) < state.log_index.last_offset(row.oid, before_lsn=start_lsn):
            return False, []
    return True, []
