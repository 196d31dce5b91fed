"""One pass of the apply loop over every table, and whether a run started ``--until-caught-up`` is done.

Each table that applies changes (or is due for a retry) gets its next batch. Batches of different
tables run at the same time (``apply.concurrency``), at most one per table: the run loop's thread
plans a batch (cursor, files, schema change DDL: everything that touches the state store, whose one
connection is not for several threads) and a worker thread runs its Spark jobs and the target's
commit; the loop harvests finished batches at its next pass (a finished batch wakes it) and
advances their cursors. A slow table holds back no other: the pass never waits for a batch. While a
table's batch commits, the batch after it is built on the driver when it is full already
(``run.read_ahead``).

A table that fails goes to ERRORED and the others go on; an error that comes from an outage (a
server went away) is not the table's: it is raised, and the run waits for the server (``run.outage``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from headrace.config import PipelineConfig
from headrace.core.batch import ChangeBatch
from headrace.core.errors import TerminalError
from headrace.core.interfaces import Target
from headrace.lineage.emitter import Lineage
from headrace.logs import event
from headrace.materialize.apply import (
    Applied,
    CursorCache,
    Executed,
    PlannedBatch,
    current_cursor,
    execute_batch,
    finish_batch,
    plan_batch,
    plan_following,
)
from headrace.materialize.initial_copy import FailHandler
from headrace.run.cuts import CutRetries, cut_offset
from headrace.run.maintenance import MaintenanceSchedule
from headrace.run.observer import RunObserver
from headrace.run.outage import OutageWatch
from headrace.run.read_ahead import ReadAhead
from headrace.state.cuts import CutStore
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


@dataclass
class _Cut:
    """A cut in flight (``consistency: transaction``): its offset, its tables, the snapshot ids the
    target named at it (filled on the worker), and the tables not harvested yet."""

    through: int
    reach: int  # the source position the cut reaches: the commit of its last transaction
    members: list[TableRow]
    changed: set[int]
    # oid -> (target name, snapshot id) of the changed tables, noted on their workers
    snapshots: dict[int, tuple[str, int | None]] = field(default_factory=dict)
    waiting: set[int] = field(default_factory=set)
    failed: bool = False
    whole: bool = False  # every batch of it in one target commit (``Target.cut``), not table by table


@dataclass(frozen=True)
class _InFlight:
    planned: PlannedBatch
    future: Future[list[Executed]]  # a cut's batches (``consistency: transaction``), or this one alone
    captured_lsn: int  # capture's position when the batch was planned (for the STREAMING transition)
    index: int = 0  # this batch's place in what the future gives
    cut: _Cut | None = None


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
        self.wake: Callable[[], None] = lambda: None  # a batch finished: ends the run loop's idle wait
        self.heartbeat: Callable[[], None] = lambda: None  # asks capture for one (``_transition``)
        self._in_flight: dict[int, _InFlight] = {}  # oid -> its batch on a worker thread (loop thread only)
        self._dispatched: dict[int, int] = {}  # oid -> pass of its last dispatch: the longest-waiting go first
        self._passes = 0
        self._lanes: dict[int, tuple[object, ...]] = {}  # each table's last recorded lanes (record_lanes)
        self._pool: ThreadPoolExecutor | None = None
        self._ahead = ReadAhead()  # each table's next batch, built while its batch in flight commits
        self._cuts: CutStore | None = None  # Iceberg's consistent cuts (``consistency: transaction``)
        self._at_cut: dict[int, tuple[str, int | None]] = {}  # oid -> (target name, snapshot id) at the last cut
        self._last_cut: set[int] = set()  # the tables of the last cut recorded
        self._cut_retries = CutRetries(outage)  # a cut that failed together, applied again whole

    @property
    def in_flight(self) -> int:
        """Batches on worker threads, not harvested yet."""
        return len(self._in_flight)

    def applying(self, oid: int) -> bool:
        """The table has a batch in flight: nothing else may touch its target table or state until
        it is harvested (``settle``)."""
        return oid in self._in_flight

    def run(self, spark: SparkSession, state: StateStore, target: Target, captured_lsn: int) -> bool:
        """One pass: harvest finished batches, then dispatch the due tables that have none in flight;
        True when a batch was applied (harvested).

        A quiet table costs no query of its own: one query gives every table's newest staged
        offset, and a table whose cursor (kept in memory, ``CursorCache``) is there is skipped.
        """
        did_work = self.harvest(state, target)
        self._passes += 1
        now = datetime.now(timezone.utc)
        rows = state.tables()
        tails = state.log_index.tails()
        self.settled = all(r.state in (TableState.STREAMING, TableState.PAUSED) for r in rows)
        limit = self._concurrency(target)
        cut = set[int]()
        if self.config.apply.consistency == "transaction":
            cut = self._dispatch_cut(spark, state, target, rows, tails, captured_lsn)
        for row in sorted(rows, key=lambda r: self._dispatched.get(r.oid, 0)):
            if row.oid in self._in_flight or row.oid in cut:
                self._read_ahead(state, target, row, tails.get(row.oid))
                continue  # one batch per table: the next is dispatched once this one is harvested
            retry = retry_apply(row, now)
            if not (row.state.applies_changes or retry):
                self.cursors.forget(row.oid)  # a copy or a failure may move it before the table applies again
                continue
            if self.maintenance.busy(row.oid):
                continue  # compacted right now (run.maintenance): applied when the pass ends
            cursor = None if retry else self.cursors.get(target, row)
            planned, built = None, None
            tail = tails.get(row.oid)
            # Nothing ever staged (a table just copied, quiet since): no batch, whatever the cursor,
            # so it is not read (on DuckLake, a query of the lake per table).
            if tail is not None and (cursor is None or tail > cursor):
                if len(self._in_flight) >= limit:
                    continue  # every worker busy: a finished batch wakes the loop for this one
                try:
                    planned, built = self._ahead.take(row, cursor) or (self._plan(state, target, row), None)
                except Exception as exc:
                    self._failed(state, row, exc)
                    continue
            if planned is None:
                self._transition(state, row, None, captured_lsn)  # nothing staged above the cursor
                continue
            self._submit(spark, target, [planned], captured_lsn, built=built)
            if limit == 1:
                did_work |= self.harvest(state, target, wait=True)  # one table after another
        return did_work

    def _concurrency(self, target: Target) -> int:
        """``apply.concurrency``, or unset the target's own (``Target.apply_concurrency``)."""
        return self.config.apply.concurrency or target.apply_concurrency

    def _plan(self, state: StateStore, target: Target, row: TableRow, through: int | None = None) -> PlannedBatch | None:
        """The table's next batch under the pipeline's settings (``through``: no entry past this cut)."""
        config, apply = self.config, self.config.apply
        return plan_batch(state, target, row, apply.max_batch_files, config.schema_changes, config.values,
                          self.cursors, apply.driver_batch_rows, apply.batch_rows(target.caps_batches),
                          config.engine, through, config.history)

    def _read_ahead(self, state: StateStore, target: Target, row: TableRow, tail: int | None) -> None:
        """Plan and start building the batch after the table's batch in flight, if full (``run.read_ahead``)."""
        flight = self._in_flight.get(row.oid)
        if flight is None or flight.cut is not None or tail is None or tail <= flight.planned.entries[-1].offset \
                or not row.state.applies_changes or not self._ahead.worth_planning(row.oid, tail):
            return
        config, apply = self.config, self.config.apply
        planned = plan_following(state, target, row, flight.planned, tail, apply.max_batch_files, config.values,
                                 apply.driver_batch_rows, apply.batch_rows(target.caps_batches), config.engine)
        if planned is not None:
            self._ahead.start(planned)

    def _submit(self, spark: SparkSession, target: Target, batches: list[PlannedBatch], captured_lsn: int,
                cut: _Cut | None = None, built: Future[ChangeBatch] | None = None) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._concurrency(target), "headrace-apply")
        future = self._pool.submit(_execute, spark, target, batches, cut, built)
        for index, planned in enumerate(batches):
            self._dispatched[planned.row.oid] = self._passes
            self._in_flight[planned.row.oid] = _InFlight(planned, future, captured_lsn, index, cut)
        future.add_done_callback(lambda _done: self.wake())

    def _dispatch_cut(self, spark: SparkSession, state: StateStore, target: Target, rows: list[TableRow],
                      tails: dict[int, int], captured_lsn: int) -> set[int]:
        """``apply.consistency: transaction``: the streaming tables' next batches up to one cut
        (``run.cuts``), built and committed together on one worker; the tables it holds (all the
        streaming ones: none applies on its own meanwhile)."""
        streaming = [r for r in rows if r.state is TableState.STREAMING]
        members = {r.oid for r in streaming}
        if any(oid in self._in_flight for oid in members) or not self._cut_retries.due():
            return members  # the last cut is still being applied, or failed and waits to be applied again
        due = [r for r in streaming if (tail := tails.get(r.oid)) is not None
               and ((cursor := self.cursors.get(target, r)) is None or tail > cursor)]
        if not due or any(self.maintenance.busy(r.oid) for r in due):
            return members  # nothing staged, or a table is being compacted: the cut waits for it
        through, whole = cut_offset(state, target, due, tails, self.cursors, self.config.apply)
        batches = []
        for row in due:
            try:
                planned = self._plan(state, target, row, through)
            except Exception as exc:
                self._failed(state, row, exc)
                continue
            if planned is not None:
                batches.append(planned)
        if batches:
            if not whole:
                event(log, "apply.cut_split", logging.WARNING, through=through, tables=len(batches),
                      reason="one flush holds more than a batch (or a shape change): its transactions land in"
                             " two commits")
            changed = {p.row.oid for p in batches}
            reach = max(p.entries[-1].max_lsn for p in batches)
            cut = _Cut(through, reach, streaming, changed, waiting=set(changed))
            if target.commits_across_tables:
                self._submit(spark, target, batches, captured_lsn, cut)  # built and committed on one worker
            else:
                for planned in batches:  # each table commits on its own worker; the cut is named after the last
                    self._submit(spark, target, [planned], captured_lsn, cut)
        return members

    def _cut_harvested(self, state: StateStore, target: Target, cut: _Cut, oid: int, applied: Applied | None) -> None:
        """One table of ``cut`` harvested (``applied`` None: it failed); the last one reports the cut and
        records it for a target that names snapshots (Iceberg), unless one of them failed."""
        cut.waiting.discard(oid)
        cut.failed |= applied is None
        if cut.waiting or cut.failed:
            return
        self._cut_retries.committed()
        self.observer.cut_committed(cut.whole)
        if not target.names_snapshots:
            return
        self._at_cut.update(cut.snapshots)
        for row in cut.members:  # the tables without a batch in the cut: as at the last cut, if in it
            if row.oid not in cut.snapshots and row.oid not in self._last_cut:
                self._at_cut[row.oid] = target.snapshot_at(row.schema)  # new to cuts (copied, resynced)
        self._last_cut = {r.oid for r in cut.members}
        # a table never written has no snapshot to travel to
        snapshots = {name: at for name, at in (self._at_cut[r.oid] for r in cut.members) if at is not None}
        if self._cuts is None:
            self._cuts = CutStore(state.dsn, self.config.name)
        try:
            self._cuts.record(cut.through, cut.reach, snapshots, cut.whole)
        except Exception:
            self._cuts.close()  # an outage broke it: the next cut opens another (this one is not named)
            self._cuts = None
            raise
        event(log, "apply.cut", through=cut.through, tables=len(snapshots),
              commit="one commit" if cut.whole else "table by table")

    def harvest(self, state: StateStore, target: Target, wait: bool = False) -> bool:
        """Finish the batches whose target commit ended (``wait``: every batch in flight): advance cursors,
        report, fail the table (a cut failed together: ``CutRetries``); True when a batch was applied.
        Raises an outage's error after forgetting that table's cursor (the others stay in flight)."""
        if wait:
            wait_for([f.future for f in self._in_flight.values()])
        did_work = False
        for oid, flight in list(self._in_flight.items()):
            if not flight.future.done():
                continue
            del self._in_flight[oid]
            row = flight.planned.row
            try:
                applied = finish_batch(state, target, flight.planned, flight.future.result()[flight.index],
                                       self.cursors)
            except Exception as exc:
                if (cut := flight.cut) is not None:
                    self._cut_harvested(state, target, cut, oid, None)
                    if self._cut_retries.retried(target, cut, exc, row.qualified_name, len(cut.changed)):
                        self.cursors.forget(oid)  # the cut is planned again from what the target holds
                        continue
                self._failed(state, row, exc)
                continue
            if flight.cut is not None:
                self._cut_harvested(state, target, flight.cut, oid, applied)
            did_work = True
            self._applied(state, row, applied)
            self._transition(state, row, applied, flight.captured_lsn)
        return did_work

    def settle(self, state: StateStore, target: Target, oid: int) -> None:
        """Wait for the table's batch in flight, if any, and harvest it (before a drop, a resync)."""
        self._ahead.drop(oid)
        if (flight := self._in_flight.get(oid)) is not None:
            wait_for([flight.future])
            self.harvest(state, target)

    def settle_all(self, state: StateStore, target: Target) -> None:
        """Wait for every batch in flight and harvest them (before an operator's command runs)."""
        if self._in_flight:
            self.harvest(state, target, wait=True)

    def abandon(self) -> None:
        """Wait for every batch in flight and drop what they did without advancing (an outage, an error
        ending the run): each cursor is read again; a batch committed is applied again, changing nothing."""
        wait_for([f.future for f in self._in_flight.values()])
        for oid in self._in_flight:
            self.cursors.forget(oid)
        self._in_flight.clear()
        self._ahead.drop()

    def close(self) -> None:
        """The run ends: no batch in flight any more (``abandon`` what is left), workers stopped."""
        self.abandon()
        self._ahead.close()
        if self._cuts is not None:
            self._cuts.close()
            self._cuts = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _failed(self, state: StateStore, row: TableRow, exc: Exception) -> None:
        self.cursors.forget(row.oid)  # the target may have committed the batch, or not
        self._ahead.drop(row.oid)
        if not isinstance(exc, TerminalError) and self.outage.explains(exc):
            raise exc  # a server went away: the run waits for it; the table did nothing wrong
        self.fail(state, row, exc, row.resume_state or row.state)

    def _applied(self, state: StateStore, row: TableRow, applied: Applied) -> None:
        self.stats.batches += 1
        self.maintenance.batch_applied(row.oid)
        self.observer.batch_applied(state, row, applied)
        self.lineage.batch_applied(state, row, applied)
        lanes = (applied.build.lane, applied.build.reason, applied.apply.lane, applied.apply.reason)
        if self._lanes.get(row.oid) != lanes:  # status shows them; written only when they change
            state.record_lanes(row.oid, applied.lanes)
            self._lanes[row.oid] = lanes
        self.stats.rows_applied[row.qualified_name] = self.stats.rows_applied.get(row.qualified_name, 0) + applied.rows_in
        if row.state is TableState.ERRORED:
            state.recovered(row.oid, row.resume_state or TableState.CATCHUP)

    def _transition(self, state: StateStore, row: TableRow, applied: Applied | None, captured_lsn: int) -> None:
        if (applied is None or applied.drained) and row.state in (TableState.CATCHUP, TableState.ERRORED):
            if past_snapshot(row, captured_lsn):
                state.caught_up(row.oid)
                event(log, "table.streaming", table=row.qualified_name)
            else:  # on a quiet source, capture passes the copy's position at its next heartbeat: now
                self.heartbeat()


_worker = threading.local()


def _execute(spark: SparkSession, target: Target, batches: list[PlannedBatch], cut: _Cut | None,
             built: Future[ChangeBatch] | None = None) -> list[Executed]:
    """``execute_batch`` on an apply worker, its Spark jobs in a FAIR pool of its own (set once the session
    runs: ``engines.spark.on_demand``). With ``cut`` (``consistency: transaction``): on a target committing
    across tables, every batch of the cut, committed together; else one table's; snapshot ids noted.
    ``built``: the one batch's driver build, read ahead (``run.read_ahead``)."""
    if not getattr(_worker, "pool_set", False) and getattr(spark, "started", True):
        from headrace.engines.spark.session import use_pool

        use_pool(spark, threading.current_thread().name)
        _worker.pool_set = True
    if cut is None:
        return [execute_batch(spark, target, planned, built) for planned in batches]
    if target.commits_across_tables:
        with target.cut([r.schema for r in cut.members], cut.changed) as commit:
            executed = [execute_batch(spark, target, planned) for planned in batches]
        cut.whole = commit.whole
    else:
        executed = [execute_batch(spark, target, planned) for planned in batches]  # one table's, beside the others'
    for planned in batches if target.names_snapshots else []:
        cut.snapshots[planned.row.oid] = target.snapshot_at(planned.row.schema)
    return executed


def past_snapshot(row: TableRow, captured_lsn: int) -> bool:
    """Capture has registered everything up to the table's copy position."""
    return row.snapshot_lsn is None or captured_lsn >= row.snapshot_lsn


def retry_apply(row: TableRow, now: datetime) -> bool:
    """An ERRORED table whose apply is due for another try."""
    return (row.state is TableState.ERRORED and row.resume_state is not None and row.resume_state.applies_changes
            and row.retry_at is not None and row.retry_at <= now)


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
        # (Nothing staged before the start: caught up, without reading the cursor.)
        before = state.log_index.last_offset(row.oid, before_lsn=start_lsn)
        if before and current_cursor(state, target, row, cursors) < before:
            return False, []
    return True, []
