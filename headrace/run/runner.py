"""A pipeline run: set up the source, copy what needs copying, and keep every table streaming.

The driver runs capture in a thread and, in its main loop, the Spark jobs: initial copies (in a
thread of their own, ``run.copier``) and apply batches (``run.apply_pass``). Between steps the loop
runs the operator's commands (``run.commands``), follows the source catalog (``run.table_watch``),
watches the slot's WAL (``run.wal_guard``) and maintains tables (``run.maintenance``). One table's
failure puts that table in ERRORED (``run.failure``); the others go on. A server going away is
ridden out (``run.outage``).

The run reports to whoever listens through ``observers`` (``run.observer``) and starts the
``services`` attached to it (the control plane's API) once capture runs; it implements
``run.view.RunView``, all the control plane sees of it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol, cast

from headrace.capture.loop import Capture
from headrace.config import PipelineConfig, redacted_dsn
from headrace.core.errors import TerminalError
from headrace.core.interfaces import Target
from headrace.engines.spark.copy import warm_copy_workers
from headrace.engines.spark.on_demand import SparkOnDemand
from headrace.lineage.emitter import Lineage
from headrace.log.store import StagingStore
from headrace.logs import event
from headrace.materialize.retention import Collector
from headrace.run import startup
from headrace.run.apply_pass import ApplyPass, RunStats, caught_up
from headrace.run.commands import Operations, Request
from headrace.run.copier import Copier
from headrace.run.failure import Failures
from headrace.run.maintenance import MaintenanceSchedule
from headrace.run.observer import Observers
from headrace.run.outage import OutageWatch, ride_out
from headrace.run.table_watch import TableWatch
from headrace.run.tracking import TableTracking
from headrace.run.view import CaptureStatus
from headrace.run.wal_guard import WalGuard
from headrace.source import open_source
from headrace.source.base import LockWaiter, RetainedLog
from headrace.state.lifecycle import TableState
from headrace.state.store import StateStore, TableRow
from headrace.targets.registry import open_target

if TYPE_CHECKING:  # pyspark loads only when a Spark job runs
    from pyspark.sql import SparkSession

log = logging.getLogger("headrace.pipeline")

__all__ = ["Run", "RunStats", "Service"]


class Service(Protocol):
    """Something that runs beside the run loop while it runs (the control plane's HTTP server)."""

    def start(self) -> None:
        """Called once capture runs, before the first loop pass; failing to start must not raise."""

    def stop(self) -> None:
        """Called when the run ends."""


class Run:
    """Everything ``headrace run`` does, for one config."""

    def __init__(self, config: PipelineConfig, spark: SparkSession | None = None) -> None:
        self.config = config
        self.dsn = config.source.resolved_dsn()
        self.state_dsn = config.source.resolved_state_dsn()  # a MySQL source needs a PostgreSQL for state
        self.source = open_source(config, self.dsn)  # PostgreSQL or MySQL, by the DSN's scheme
        self._spark = spark
        if spark is not None and config.uses_object_store:
            from headrace.storage.spark_conf import apply_hadoop_conf

            apply_hadoop_conf(spark)  # a session handed in was started without this config's store
        # What the target and the apply workers get: the session starts when one of them needs it, or
        # ahead of a copy round; a session started here is warmed for the copy's tasks, one handed in is not.
        self.spark_on_demand = SparkOnDemand(lambda: self.spark, None if spark is not None else warm_copy_workers)
        self._target: Target | None = None
        self._target_lock = threading.Lock()
        self.capture: Capture | None = None
        self.stats = RunStats()
        self.observers = Observers()  # who hears of batches, failures, DDL (the control plane's metrics)
        self.services: list[Service] = []  # started and stopped with the run (the control plane's API)
        self.loop_passes = 0  # passes of the run loop so far (tests wait on these, not on time)
        self.outage = OutageWatch.for_config(config, self.dsn, self.state_dsn, self.source)  # gone away, and back
        self.wal_guard = WalGuard(config, self.dsn, self.source)  # WAL the slot keeps; a slot PostgreSQL lost
        self.lineage = Lineage(config, self.dsn)  # OpenLineage events (off unless configured)
        self.maintenance = MaintenanceSchedule(config, self.state_dsn)  # compaction, snapshot expiry
        self.failures = Failures(self._source_user, self.observers)
        self.tracking = TableTracking(config, self.dsn, lambda: self.capture, lambda: self.target, self.source)
        self.operations = Operations(config.name, self.tracking)  # commands, run by the loop between steps
        self.maintenance.on_done = self.operations.wake  # the table it compacted applies again at once
        self.copier = Copier(config, self.dsn, self.state_dsn, self.spark_on_demand, lambda: self.target,
                             self._fail, self.observers, self.source, self.maintenance.copied)
        self.staging = StagingStore.for_pipeline(config.staging.path, config.name)  # staged files, any pyarrow.fs
        self.collector = Collector(self.staging)  # deletes the applied files off the loop's thread
        self.table_watch = TableWatch(config, self.dsn, self.tracking, self.observers, self._fail,
                                      lambda: self.capture, lambda: self.target, lambda: self.copier.running,
                                      self.staging, self.source)
        self.apply_pass = ApplyPass(config, self.outage, self._fail, self.observers, self.maintenance,
                                    self.lineage, self.stats)
        # Batches run on worker threads (apply.concurrency): a finished one wakes the loop to harvest
        # it, and nothing else touches a table whose batch is in flight.
        self.apply_pass.wake = self.operations.wake
        self.maintenance.applying = self.apply_pass.applying
        self.table_watch.settle = self._settle
        self.operations.before_command = self._settle

    # -- set-up ---------------------------------------------------------------------------------
    def check(self) -> list[str]:
        """Every problem that would stop ``run``, for people to read; empty when all is well."""
        return startup.check(self.config, self.source)

    def setup(self) -> StateStore:
        """Create what the pipeline needs, idempotently, and return the state store."""
        return startup.setup(self.config, self.source, self.state_dsn, self.table_watch, self.observers,
                             self.staging)

    @property
    def _source_user(self) -> str | None:
        """The role headrace connects to the source as (named in GRANT fixes)."""
        user = self.source.user()
        return str(user) if user else None

    @property
    def copy_running(self) -> bool:
        """An initial copy round is under way (in its thread)."""
        return self.copier.running

    @property
    def spark(self) -> SparkSession:
        if self._spark is None:
            from headrace.engines.spark.session import build_session

            self._spark = build_session(self.config.spark.master, self.config.spark.conf,
                                        app_name=f"headrace-{self.config.name}",
                                        target_conf=self.config.target.spark_conf(self.config.spark.conf))
        return self._spark

    @property
    def target(self) -> Target:
        with self._target_lock:  # the API and tests read the target from other threads
            if self._target is None:
                spark = cast("SparkSession", self.spark_on_demand)
                self._target = open_target(self.config.target.kind, spark, self.config.target.settings,
                                           self.config.name)
        return self._target

    def _fail(self, state: StateStore, row: TableRow, exc: Exception, resume: TableState) -> None:
        self.failures.fail(state, row, exc, resume)

    # -- run ------------------------------------------------------------------------------------
    def run(self, stop: threading.Event | None = None, until_caught_up: bool = False) -> int:
        """Copy, then stream until ``stop`` is set (or until caught up); return an exit code."""
        stop = stop or threading.Event()
        self.config.api.resolved_token()  # an API off loopback without its token stops here, before set-up
        state = self.setup()
        self.maintenance.after_copies = not until_caught_up
        with self.source.connect() as conn:  # what --until-caught-up waits for
            start_lsn = self.source.current_position(conn)
        rows = state.tables()
        self.capture = Capture(self.config, self.dsn, self.state_dsn, {r.oid: r.schema for r in rows}, self.source)
        capture_stop = threading.Event()
        self.capture.on_staged = self.operations.wake  # staged files end the loop's idle wait
        self.apply_pass.heartbeat = self.capture.request_heartbeat
        thread = threading.Thread(target=self._capture, args=(self.capture, capture_stop), name="capture", daemon=True)
        thread.start()
        for service in self.services:
            service.start()
        event(log, "run.start", pipeline=self.config.name, source=redacted_dsn(self.dsn),
              target=self.config.target.kind, tables=len(rows), until_lsn=self.source.format_position(start_lsn))
        code = 0
        try:
            code = self._loop(state, stop, until_caught_up, start_lsn, thread)
        finally:
            for service in self.services:
                service.stop()
            self.operations.close()
            self.copier.stop()
            capture_stop.set()
            thread.join(timeout=60)
            self.apply_pass.close()  # batches still in flight (after an error) end before their target closes
            self.maintenance.close()  # a pass under way ends before its target closes
            self.collector.close()  # the staged files' deletes under way end
            if self._target is not None:
                self._target.close()
                self._target = None  # reopened on next use (DuckLake allows one attach per process)
            self.lineage.close(state)
            state.close()
            event(log, "run.stop", pipeline=self.config.name)
        return code

    @staticmethod
    def _capture(capture: Capture, stop: threading.Event) -> None:
        """Capture's thread. A failure it cannot retry is logged (``capture.failed``) and kept
        (``Capture.failure``) before it is raised, and the run loop raises it with its sentence once
        the thread has ended: raised out of the thread too, Python would print its traceback."""
        with contextlib.suppress(Exception):
            capture.run(stop)

    def _loop(self, state: StateStore, stop: threading.Event, until_caught_up: bool, start_lsn: int,
              thread: threading.Thread) -> int:
        """The run loop, until ``stop`` (0), caught up (0) or a table failed for good while catching up (1)."""
        assert self.capture is not None
        next_gc = time.monotonic() + self.config.staging.gc_seconds
        interrupted = 0  # consecutive loop steps an outage cut short
        while not stop.is_set():
            self.loop_passes += 1
            self.operations.begin_pass()
            try:
                self.operations.run_pending(state)
                self.wal_guard.step()
                self.lineage.step(state)
                did_work = self.table_watch.step(state)
                if not self.operations.paused:
                    did_work |= self.copier.start(state)
                    did_work |= self.apply_pass.run(cast("SparkSession", self.spark_on_demand), state, self.target,
                                                    self.capture.captured_lsn)
                    did_work |= self.maintenance.step(state, self.target)  # between apply passes
                elif self.apply_pass.in_flight:
                    did_work |= self.apply_pass.harvest(state, self.target)
                if time.monotonic() >= next_gc:
                    self.collector.step(state, self.target, self.apply_pass.cursors)  # deletes on its thread
                    next_gc = time.monotonic() + self.config.staging.gc_seconds
                if until_caught_up:
                    # A batch in flight has not moved its table's cursor, so the check stays true to
                    # what is applied; not waiting for none to be in flight keeps a run under constant
                    # writes from never ending (there is always a next batch).
                    done, failed = caught_up(state, self.target, self.capture.captured_lsn, start_lsn,
                                             self.apply_pass.cursors)
                    if failed:
                        event(log, "run.failed", logging.ERROR, tables=",".join(failed))
                        self._settle(state)
                        return 1
                    if done:
                        event(log, "run.caught_up", captured_lsn=self.source.format_position(self.capture.captured_lsn))
                        self._settle(state)  # the batches in flight end and count
                        return 0
                if not thread.is_alive():
                    if isinstance(self.capture.failure, TerminalError):
                        raise self.capture.failure  # its own class and message: the start-up check's
                    raise TerminalError(f"capture stopped: {self.capture.last_error}")
                if not did_work:
                    self.operations.wait(self._idle_wait(until_caught_up, next_gc))
                if interrupted:
                    event(log, "run.resumed", after_attempts=interrupted)
                    interrupted = 0
            except TerminalError:
                raise
            except Exception as exc:
                # A server restarting, crashing or failing over is not the tables' fault: wait
                # for it, then go on where the loop was (run.outage).
                if stop.is_set() or not self.outage.explains(exc):
                    raise
                interrupted += 1
                self.apply_pass.abandon()  # the batches in flight end before the target is released
                ride_out(self.outage, exc, interrupted, stop, self._release)
        try:
            self._settle(state)  # stopped: the batches in flight end and count
        except Exception as exc:
            if isinstance(exc, TerminalError) or not self.outage.explains(exc):
                raise
            event(log, "run.stop_unsettled", logging.WARNING, error=str(exc)[:500])  # cursors read again at start
        return 0

    def _settle(self, state: StateStore, oid: int | None = None) -> None:
        """Let the table's apply batch in flight (every table's, without ``oid``) end and harvest it:
        before a command, the catalog watch or the end of the run touches the tables."""
        if oid is None and self.apply_pass.in_flight:
            self.apply_pass.settle_all(state, self.target)
        elif oid is not None and self.apply_pass.applying(oid):
            self.apply_pass.settle(state, self.target, oid)

    def _idle_wait(self, until_caught_up: bool, next_gc: float) -> float:
        """How long a pass that found nothing to do waits (staged files and commands end it sooner).

        When every table streams (or is paused) and nothing else is under way, nothing can be due
        before capture stages files (it wakes the loop) or a timed step comes round (the catalog
        poll, the WAL check, staging GC), so the loop sleeps until the first of those, at most
        ``apply.idle_max_seconds``. Otherwise (copies, catch-up, retries, drops, a paused pipeline,
        ``--until-caught-up``) it keeps the short ``apply.idle_sleep_seconds``.
        """
        short = self.config.apply.idle_sleep_seconds
        if (until_caught_up or self.operations.paused or not self.apply_pass.settled or self.copier.running
                or self.table_watch.busy):
            return short
        due = min(self.table_watch.next_due, self.wal_guard.next_due, next_gc) - time.monotonic()
        return max(short, min(due, self.config.apply.idle_max_seconds))

    def _release(self) -> None:
        """Drop what an outage broke: the copy round (its progress is kept per chunk; the next round
        resumes after the last one done) and the target (a broken DuckLake catalog connection)."""
        self.copier.stop()
        with self._target_lock:
            if self._target is not None:
                try:
                    self._target.close()  # a DuckLake catalog connection the outage broke is attached anew
                except Exception as close_exc:
                    log.debug("closing the target after an outage failed", exc_info=close_exc)
                self._target = None

    # -- the view the control plane has of the run (run.view.RunView) ----------------------------------
    @property
    def paused(self) -> bool:
        """The operator paused the whole pipeline (capture goes on; copy and apply wait)."""
        return self.operations.paused

    @property
    def batches_in_flight(self) -> int:
        """Apply batches running on worker threads now (``apply.concurrency`` at most)."""
        return self.apply_pass.in_flight

    def capture_status(self) -> CaptureStatus | None:
        """Capture's connection and last error; None before the run has started it."""
        capture = self.capture
        if capture is None:
            return None
        return CaptureStatus(capture.connected, capture.last_error, capture.storage_error,
                             dict(capture.changes_captured))

    def outage_reasons(self) -> list[str]:
        """One sentence per server the run depends on that does not answer now."""
        return self.outage.reasons()

    def server_up(self, role: str = "source") -> bool:
        """The server last answered the run's probes (or was never found down)."""
        return self.outage.up(role)

    def copy_lock_waiters(self) -> list[LockWaiter]:
        """Source sessions waiting now for a lock the initial copy's reads hold (its watch's last look)."""
        return self.copier.lock_waiters()

    def slot_wal(self) -> RetainedLog | None:
        """The slot's WAL figures read now; None when the slot or the source cannot be seen."""
        return self.wal_guard.current()

    def submit(self, request: Request, timeout: float = 20.0) -> tuple[bool, dict[str, Any]]:
        """Run ``request`` in the run loop: (True, result), or (False, {}) when still queued at ``timeout``."""
        return self.operations.submit(request, timeout)
