"""A pipeline run: set up the source, copy what needs copying, and keep every table streaming.

The driver runs capture in a thread and, in its main loop, the Spark jobs: initial copies and apply
batches. One table's failure puts that table in ERRORED; the others go on. A transient error is
retried with backoff, a terminal one waits for the operator (``headrace.materialize.failure``).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from headrace.capture.loop import Capture
from headrace.config import PipelineConfig, redacted_dsn
from headrace.control.metrics import PipelineMetrics
from headrace.control.operations import Operations, published_names
from headrace.core.errors import SourceError, TerminalError
from headrace.core.interfaces import Target
from headrace.core.names import TableName
from headrace.core.position import format_lsn, parse_lsn
from headrace.core.schema import TableSchema
from headrace.lineage.emitter import Lineage
from headrace.logs import event
from headrace.maintenance import MaintenanceSchedule
from headrace.materialize.apply import apply_next, current_cursor
from headrace.materialize.failure import classify
from headrace.materialize.initial_copy import InitialCopy
from headrace.materialize.retention import collect_applied
from headrace.outage import OutageWatch
from headrace.source.postgres.catalog import (
    check_source,
    columns_as_text_problems,
    list_tables,
    read_table_schema,
    table_problems,
)
from headrace.source.postgres.replication import ensure_publication, ensure_slot
from headrace.source.postgres.types import TypeCatalog
from headrace.source.postgres.wal_guard import WalGuard
from headrace.state.invariants import check_slot, check_staged_files, check_tables
from headrace.state.lifecycle import RETRY_BUDGET, TableState, next_retry
from headrace.state.progress import DDL as PROGRESS_DDL
from headrace.state.store import StateStore, TableRow
from headrace.table_watch import TableWatch
from headrace.targets.registry import open_target

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("headrace.pipeline")


@dataclass
class RunStats:
    """Counters the run loop keeps for progress lines and (later) metrics."""

    batches: int = 0
    rows_applied: dict[str, int] = field(default_factory=dict)
    rows_copied: dict[str, int] = field(default_factory=dict)


class Pipeline:
    """Everything ``headrace run`` does, for one config."""

    def __init__(self, config: PipelineConfig, spark: SparkSession | None = None) -> None:
        self.config = config
        self.dsn = config.source.resolved_dsn()
        self.state_dsn = config.source.state_dsn or self.dsn
        self._spark = spark
        self._target: Target | None = None
        self._target_lock = threading.Lock()
        self.capture: Capture | None = None
        self.stats = RunStats()
        self._copier: threading.Thread | None = None
        self._copy_stop = threading.Event()
        self.metrics = PipelineMetrics(self)
        self.operations = Operations(self)  # API commands, run by the loop between steps
        self.table_watch = TableWatch(self)  # tables created, dropped and recreated in the source
        self.api_address: str | None = None  # host:port the control API serves on, while running
        self.loop_passes = 0  # passes of the run loop so far (tests wait on these, not on time)
        self.outage = OutageWatch.for_config(config, self.dsn, self.state_dsn)  # servers gone away, and back
        self.wal_guard = WalGuard(config, self.dsn)  # WAL the slot keeps; a slot PostgreSQL invalidated
        self.lineage = Lineage(config, self.dsn)  # OpenLineage events (off unless configured)
        self.maintenance = MaintenanceSchedule(config, self.state_dsn)  # compaction, snapshot expiry

    # -- set-up ---------------------------------------------------------------------------------
    def check(self) -> list[str]:
        """Every problem that would stop ``run``, for people to read; empty when all is well."""
        try:
            with psycopg.connect(self.dsn, connect_timeout=10) as conn:
                source = self.config.source
                return (check_source(conn, list(source.tables), self.config.publication_name)
                        + columns_as_text_problems(conn, sorted(source.text_columns)))
        except psycopg.OperationalError as exc:
            return [f"cannot connect to the source {redacted_dsn(self.dsn)}: {str(exc).strip()}"]

    def setup(self) -> StateStore:
        """Create what the pipeline needs, idempotently, and return the state store."""
        problems = self.check()
        if problems:
            raise SourceError("the source is not ready:\n" + "\n".join(f"  - {p}" for p in problems))
        state = StateStore(self.state_dsn, self.config.name)
        state.install()
        state.conn.execute(PROGRESS_DDL)  # start-up checks and their remedies name it
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            sysid = str(conn.execute("SELECT system_identifier FROM pg_control_system()").fetchone()[0])  # type: ignore[index]
            meta = state.meta()
            if meta and meta["system_identifier"] != sysid:
                raise SourceError(
                    f"pipeline {self.config.name} was set up on another PostgreSQL cluster "
                    f"(system identifier {meta['system_identifier']}, now {sysid}): use a new pipeline "
                    "name, or drop the _headrace rows of this pipeline to start over"
                )
            names = self._configured_tables(conn, state)
            types = TypeCatalog(conn, self.config.source.text_columns)
            schemas = [read_table_schema(conn, name, types) for name in names]
            # Refuse to run on state the source or the staging store no longer matches.
            check_slot(conn, state, self.config.slot_name)
            for old, new in check_tables(state, schemas, self.config.schema_changes.recreated_table):
                self._resync_recreated(state, old, new)
            check_staged_files(state)
            self.table_watch.follow_text_columns(state, conn, types)  # source.columns_as_text changed
            # Tables added through the API or discovered stay published across restarts, by oid: a
            # dropped one drops out, and a recreated one is published only once it is tracked.
            published = list(dict.fromkeys(names + published_names(conn, state.tables())))
            ensure_publication(conn, self.config.publication_name, published)
            slot_lsn = ensure_slot(conn, self.config.slot_name)
        state.ensure_meta(sysid, self.config.slot_name, self.config.publication_name, slot_lsn)
        tracked = {row.oid: row for row in state.tables()}
        for schema in schemas:
            if schema.oid not in tracked:
                state.add_table(schema)
                event(log, "table.added", table=schema.qualified_name, oid=schema.oid)
                if meta is not None and self.config.source.discovers:  # created while headrace was down
                    state.record_ddl(schema.oid, schema.qualified_name, "create_table", "new table: copying")
                    self.metrics.ddl_applied("create_table")
        return state

    def _configured_tables(self, conn: psycopg.Connection[Any], state: StateStore) -> list[TableName]:
        """The tables the config names; with schemas / all_tables, those found that can be replicated.

        A discovered table that cannot be replicated does not stop the others: it is noted as
        refused (``status`` shows why) and assessed again by each discovery pass.
        """
        source = self.config.source
        if not source.discovers:
            return source.table_names
        tracked = {r.oid for r in state.tables()}
        names: list[TableName] = []
        refused = set()
        for oid, name in list_tables(conn, source.schemas or None).items():
            problems = [] if oid in tracked else table_problems(conn, name, self.config.publication_name)
            if problems:
                refused.add(oid)
                if state.refuse_table(oid, name, "; ".join(problems)):
                    event(log, "table.refused", logging.WARNING, table=name, oid=oid, reason="; ".join(problems))
            else:
                names.append(TableName.parse(name))
        state.forget_refused(refused)
        return names

    def _resync_recreated(self, state: StateStore, old: TableRow, new: TableSchema) -> None:
        """Start-up found ``old`` dropped and created again as ``new``: forget the old, copy the new.

        The copy replaces the target table's rows (and the table, if the new one has another shape).
        """
        state.remove_table(old.oid)  # its staged changes belong to the old table: never applied
        detail = f"oid {old.oid} -> {new.oid}, found at start-up: copying the new table into the same target table"
        state.record_ddl(new.oid, new.qualified_name, "recreate_table", detail)
        self.metrics.ddl_applied("recreate_table")
        event(log, "table.recreated", logging.WARNING, table=new.qualified_name, old_oid=old.oid, oid=new.oid,
              resync=True)

    @property
    def _source_user(self) -> str | None:
        """The role headrace connects to the source as (named in GRANT fixes)."""
        user = conninfo_to_dict(self.dsn).get("user")
        return str(user) if user else None

    @property
    def copy_running(self) -> bool:
        """An initial copy round is under way (in its thread)."""
        return self._copier is not None and self._copier.is_alive()

    @property
    def spark(self) -> SparkSession:
        if self._spark is None:
            from headrace.spark import build_session

            self._spark = build_session(self.config.spark.master, self.config.spark.conf,
                                        app_name=f"headrace-{self.config.name}",
                                        target_conf=self.config.target.spark_conf(self.config.spark.conf))
        return self._spark

    @property
    def target(self) -> Target:
        with self._target_lock:  # the API and tests read the target from other threads
            if self._target is None:
                self._target = open_target(self.config.target.kind, self.spark, self.config.target.settings,
                                           self.config.name)
        return self._target

    # -- run ------------------------------------------------------------------------------------
    def run(self, stop: threading.Event | None = None, until_caught_up: bool = False) -> int:
        """Copy, then stream until ``stop`` is set (or until caught up); return an exit code."""
        stop = stop or threading.Event()
        self.config.api.resolved_token()  # an API off loopback without its token stops here, before set-up
        state = self.setup()
        # The insert position, not pg_current_wal_lsn() (the write position): under asynchronous
        # commit a committed transaction's record can still be past the write position.
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            start_lsn = parse_lsn(conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])  # type: ignore[index]
        rows = state.tables()
        self.capture = Capture(self.config, self.dsn, self.state_dsn, {r.oid: r.schema for r in rows})
        capture_stop = threading.Event()
        thread = threading.Thread(target=self.capture.run, args=(capture_stop,), name="capture", daemon=True)
        thread.start()
        from headrace.control.api import start_api

        server = start_api(self)
        self.api_address = server.address if server else None
        event(log, "run.start", pipeline=self.config.name, source=redacted_dsn(self.dsn),
              target=self.config.target.kind, tables=len(rows), until_lsn=format_lsn(start_lsn))
        code = 0
        next_gc = time.monotonic() + self.config.staging.gc_seconds
        interrupted = 0  # consecutive loop steps an outage cut short
        try:
            while not stop.is_set():
                self.loop_passes += 1
                try:
                    self.operations.run_pending(state)
                    self.wal_guard.step()
                    self.lineage.step(state)
                    did_work = self.table_watch.step(state)
                    if not self.operations.paused:
                        did_work |= self._copy_pending(state)
                        did_work |= self._apply_all(state)
                        did_work |= self.maintenance.step(state, self.target)  # between apply passes
                    if time.monotonic() >= next_gc:
                        collect_applied(state, self.target)
                        next_gc = time.monotonic() + self.config.staging.gc_seconds
                    if until_caught_up:
                        done, failed = self._caught_up(state, start_lsn)
                        if failed:
                            event(log, "run.failed", logging.ERROR, tables=",".join(failed))
                            code = 1
                            break
                        if done:
                            event(log, "run.caught_up", captured_lsn=format_lsn(self.capture.captured_lsn))
                            break
                    if not thread.is_alive():
                        if isinstance(self.capture.failure, TerminalError):
                            raise self.capture.failure  # its own class and message: the start-up check's
                        raise TerminalError(f"capture stopped: {self.capture.last_error}")
                    if not did_work:
                        self.operations.wait(self.config.apply.idle_sleep_seconds)
                    if interrupted:
                        event(log, "run.resumed", after_attempts=interrupted)
                        interrupted = 0
                except TerminalError:
                    raise
                except Exception as exc:
                    # A server restarting, crashing or failing over is not the tables' fault: wait
                    # for it, then go on where the loop was (headrace.outage).
                    if stop.is_set() or not self.outage.explains(exc):
                        raise
                    interrupted += 1
                    self._ride_out(exc, interrupted, stop)
        finally:
            if server is not None:
                server.stop()
            self.operations.close()
            self._stop_copier()
            capture_stop.set()
            thread.join(timeout=60)
            if self._target is not None:
                self._target.close()
                self._target = None  # reopened on next use (DuckLake allows one attach per process)
            self.lineage.close(state)
            self.maintenance.close()
            state.close()
            event(log, "run.stop", pipeline=self.config.name)
        return code

    def _ride_out(self, exc: Exception, attempt: int, stop: threading.Event) -> None:
        """Wait until every server answers again, dropping the connections the outage broke.

        Logged once per outage (``run.interrupted`` here, ``run.resumed`` by the loop), not per attempt.
        """
        if attempt == 1:
            self.outage.outages += 1
            event(log, "run.interrupted", logging.WARNING, error=_first_line(exc))
        else:
            log.debug("still interrupted (attempt %d): %s", attempt, _first_line(exc))
        self._stop_copier()  # its progress is kept per chunk; the next round resumes after the last one done
        with self._target_lock:
            if self._target is not None:
                try:
                    self._target.close()  # a DuckLake catalog connection the outage broke is attached anew
                except Exception as close_exc:
                    log.debug("closing the target after an outage failed", exc_info=close_exc)
                self._target = None
        if self.outage.wait_until_up(stop):
            # Every server answers, yet the step failed: wait before the next one rather than spin.
            stop.wait(self.outage.backoff.delay(attempt - 1))

    def _copy_pending(self, state: StateStore) -> bool:
        """Start a copy round, in its own thread, for the tables that need one.

        Copies run beside the apply loop, so the other tables keep streaming meanwhile.
        """
        if self._copier is not None and self._copier.is_alive():
            return False
        now = datetime.now(timezone.utc)
        todo = [r.oid for r in state.tables() if r.state.needs_copy or _retry_copy(r, now)]
        if not todo:
            return False
        copy = InitialCopy(self.config, self.dsn, self.state_dsn, self.spark, self.target, self._fail,
                           self._copy_stop, self.metrics.values_changed)
        self._copier = threading.Thread(target=copy.run, args=(todo,), name="initial-copy", daemon=True)
        self._copier.start()
        return True

    def _stop_copier(self) -> None:
        """Let a running copy finish its current chunk group; what is left resumes next run."""
        self._copy_stop.set()
        if self._copier is not None:
            self._copier.join()
            self._copier = None
        self._copy_stop = threading.Event()

    def _apply_all(self, state: StateStore) -> bool:
        did_work = False
        now = datetime.now(timezone.utc)
        for row in state.tables():
            if not (row.state.applies_changes or _retry_apply(row, now)):
                continue
            try:
                applied = apply_next(self.spark, state, self.target, row, self.config.apply.max_batch_files,
                                     self.config.schema_changes, self.config.values)
            except Exception as exc:
                if not isinstance(exc, TerminalError) and self.outage.explains(exc):
                    raise  # a server went away: the run waits for it (``_ride_out``); the table did nothing wrong
                self._fail(state, row, exc, resume=row.resume_state or row.state)
                continue
            if applied is not None:
                did_work = True
                self.stats.batches += 1
                self.maintenance.batch_applied(row.oid)
                self.metrics.batch_applied(state, row, applied)
                self.lineage.batch_applied(state, row, applied)
                self.stats.rows_applied[row.qualified_name] = (
                    self.stats.rows_applied.get(row.qualified_name, 0) + applied.rows_in
                )
                if row.state is TableState.ERRORED:
                    state.set_state(row.oid, row.resume_state or TableState.CATCHUP, error=None, error_count=0)
            if (applied is None or applied.drained) and row.state in (TableState.CATCHUP, TableState.ERRORED) \
                    and self._past_snapshot(row):
                state.set_state(row.oid, TableState.STREAMING, error=None, error_count=0, retry_at=None)
                event(log, "table.streaming", table=row.qualified_name)
        return did_work

    def _past_snapshot(self, row: TableRow) -> bool:
        """Capture has registered everything up to the table's copy position."""
        captured = self.capture.captured_lsn if self.capture else 0
        return row.snapshot_lsn is None or captured >= row.snapshot_lsn

    def _fail(self, state: StateStore, row: TableRow, exc: Exception, resume: TableState) -> None:
        """Put the table in ERRORED: transient errors retry with backoff, terminal ones wait for the operator.

        An error no rule classifies (``unknown``) is retried ``RETRY_BUDGET`` times, then waits too:
        retrying forever what may need a person only hides it.
        """
        failure = classify(exc, row.qualified_name, self._source_user)
        count = row.error_count + 1
        retries = failure.kind == "transient" or (failure.kind == "unknown" and count < RETRY_BUDGET)
        retry_at = next_retry(count) if retries else None
        fix = failure.fix if retry_at is None else None
        state.set_state(row.oid, TableState.ERRORED, error=failure.message[:2000], error_count=count,
                        retry_at=retry_at, resume_state=resume, error_kind=failure.kind, error_fix=fix)
        self.metrics.table_failed(row.qualified_name, failure.kind)
        event(log, "table.errored", logging.ERROR, table=row.qualified_name, kind=failure.kind,
              error=failure.message, attempt=count, retry_at=retry_at.isoformat() if retry_at else None, fix=fix)
        # An unclassified error's traceback is the operator's only lead; the others say enough.
        log.log(logging.WARNING if failure.kind == "unknown" else logging.DEBUG, "traceback", exc_info=exc)

    def _caught_up(self, state: StateStore, start_lsn: int) -> tuple[bool, list[str]]:
        assert self.capture is not None
        rows = state.tables()
        failed = [r.qualified_name for r in rows
                  if r.waits_for_operator or (r.state is TableState.ERRORED and r.error_count >= RETRY_BUDGET)]
        if failed:
            return False, failed
        if self.capture.captured_lsn < start_lsn:
            return False, []
        for row in rows:
            if row.state is not TableState.STREAMING:
                return False, []
            # Caught up = every change committed before the start is applied; later ones may wait.
            if current_cursor(state, self.target, row) < state.last_offset(row.oid, before_lsn=start_lsn):
                return False, []
        return True, []


def _retry_copy(row: TableRow, now: datetime) -> bool:
    return (row.state is TableState.ERRORED and row.resume_state is not None and row.resume_state.needs_copy
            and row.retry_at is not None and row.retry_at <= now)


def _retry_apply(row: TableRow, now: datetime) -> bool:
    return (row.state is TableState.ERRORED and row.resume_state is not None
            and row.resume_state.applies_changes and row.retry_at is not None and row.retry_at <= now)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
