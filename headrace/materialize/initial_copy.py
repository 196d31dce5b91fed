"""Initial copies: consistent, chunked, parallel, resumable, and beside the stream (not before it).

A copy round takes the source's copy snapshot (PostgreSQL: one exported snapshot, from a temporary
slot), splits each table into chunks (PostgreSQL: ctid page ranges) and copies groups of chunks as
Spark jobs (tasks read under the snapshot), recording each finished group in
``_headrace.snapshot_progress``. It runs in its own thread, so the other tables keep streaming.

A source whose chunks each take their own snapshot (MySQL: ``START TRANSACTION WITH CONSISTENT
SNAPSHOT`` per chunk) gives each row its chunk's position; the round's position is one read before
any chunk, so it is at or before all of them, and the rows converge by the position rule as in the
resume below (a key lies in one chunk's range, so a fresh copy still appends).

Resuming after a crash or stop: the exported snapshot died with the session that held it, so the
chunks still to do are copied under a new snapshot (LSN L2) and merged into the target by key with
the position rule, instead of appended. The table keeps the oldest finished chunk's LSN (L1) as its
snapshot LSN, so every change after L1 is applied afterwards: a row copied at L1 takes the changes
after L1; a row copied at L2 has them already and skips them (its position is later). Rows that
moved between chunks while no snapshot held them still end right, because the merge keeps one row
per key and the log holds every change after L1.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F

from headrace.config import PipelineConfig, SchemaChangesConfig
from headrace.core.errors import SourceError
from headrace.core.faults import crash_point
from headrace.core.filesink import FileSink
from headrace.core.interfaces import Target
from headrace.core.lanes import Lane
from headrace.core.position import Position
from headrace.core.schema import HR_OP, HR_UNCHANGED, TableSchema
from headrace.core.spark_types import value_rules
from headrace.engines.chunks import driver_rows, prefetched, read_by, takes_files
from headrace.engines.spark.copy import ValueCounts, chunk_dataframe
from headrace.logs import event
from headrace.materialize.apply import current_cursor
from headrace.materialize.copy_lanes import SparkWarmth
from headrace.materialize.copy_watch import CopyAbandoned, CopyWatch
from headrace.materialize.file_copy import FileCopy, FileCopyEnd, report_progress
from headrace.materialize.lanes import small_copy_lane
from headrace.materialize.permits import Permits
from headrace.outage_signs import lost_connection
from headrace.source import open_source
from headrace.source.base import ChunkRead, CopySnapshot, Source
from headrace.state.lifecycle import TableState
from headrace.state.progress import ProgressStore
from headrace.state.store import StateStore, TableRow

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("headrace.snapshot")

FailHandler = Callable[[StateStore, TableRow, Exception, TableState], None]
CHECK_JOIN_SECONDS = 1.0  # how often the round looks whether a copy thread it waits for was given up on


class InitialCopy:
    """Copies the tables that need it, one round per call of ``run``."""

    def __init__(self, config: PipelineConfig, dsn: str, state_dsn: str, spark: SparkSession,
                 target: Target | Callable[[], Target], on_error: FailHandler, stop: threading.Event,
                 on_values_changed: Callable[[str, ValueCounts], None] | None = None,
                 source: Source | None = None, warmth: SparkWarmth | None = None,
                 stuck: dict[int, threading.Thread] | None = None,
                 on_copied: Callable[[int], None] = lambda oid: None) -> None:
        """``spark`` may be a stand-in that starts the session on first use, and ``target`` a function
        opening the target (which may start it too): the round takes its snapshot and plans meanwhile.
        ``warmth`` (None: nothing to warm): on a cluster, a copy about to write files has the session
        warmed in the background for its tasks; in local mode the driver's threads copy every group
        (``copy_lanes.CopyLanes``). ``stuck``: the copy threads given up on (``CopyWatch``), by table,
        shared with the rounds before and after this one. ``on_copied``: a table whose copy the target
        wants maintained at once (``Target.copy_finished``), by oid."""
        self.config = config
        self.dsn = dsn
        self.source = source or open_source(config, dsn)
        self.state_dsn = state_dsn
        self.spark = spark
        self._target = target
        self.warmth = warmth
        self.on_error = on_error
        self.stop = stop
        self.on_values_changed = on_values_changed
        self.on_copied = on_copied
        self.rows_copied: dict[str, int] = {}
        self.watch = CopyWatch(self.source, config.snapshot, self._stalled, {} if stuck is None else stuck)

    @property
    def target(self) -> Target:
        """The target, opened at first use (by the copy's thread, once the snapshot is taken)."""
        if callable(self._target) and not isinstance(self._target, Target):
            self._target = self._target()
        return self._target

    def run(self, oids: list[int]) -> None:
        """Copy the given tables under one exported snapshot.

        A server going away ends the round quietly: the run loop waits for it, and the next round
        resumes each table after its last chunk recorded as done, as after a crash.
        """
        try:
            self._round(oids)
        except Exception as exc:
            if not lost_connection(exc):
                raise
            event(log, "snapshot.interrupted", logging.WARNING, error=str(exc).strip().splitlines()[0][:500]
                  if str(exc).strip() else type(exc).__name__)

    def _round(self, oids: list[int]) -> None:
        state = StateStore(self.state_dsn, self.config.name)
        try:
            slot = f"{self.config.slot_name}_copy"[:63]
            with ExitStack() as stack:
                exporting = time.monotonic()
                try:
                    snap = stack.enter_context(self.source.copy_snapshot(slot))
                except Exception as exc:  # no snapshot, no copy: each table of the round fails (retried or not)
                    for oid in oids:
                        self._failed(state, oid, exc)
                    return
                event(log, "snapshot.exported", tables=len(oids), seconds=round(time.monotonic() - exporting, 2),
                      snapshot_lsn=self.source.format_position(snap.position))
                self.watch.start()
                stack.callback(self.watch.close)
                self._copy_all(oids, snap)
        finally:
            state.close()

    def _copy_all(self, oids: list[int], snap: CopySnapshot) -> None:
        """Copy the tables, several at once, within ``snapshot.max_connections`` source connections.

        A session holding an exported snapshot (``snap.token``) counts as one of them. Each worker
        thread has its own state connections (a psycopg connection serves one thread at a time);
        Spark runs the workers' jobs side by side.
        """
        limit = self.config.snapshot.max_connections
        permits = Permits(max(1, limit - (1 if snap.token is not None else 0)))
        stores: dict[threading.Thread, tuple[StateStore, ProgressStore]] = {}
        local = threading.local()
        lost = threading.Event()  # a server went away: the whole round stops, to be resumed

        def copy_one(oid: int) -> None:
            if self.stop.is_set() or lost.is_set():
                return
            if not hasattr(local, "stores"):
                local.stores = (StateStore(self.state_dsn, self.config.name),
                                ProgressStore(self.state_dsn, self.config.name))
                stores[threading.current_thread()] = local.stores
            state, progress = local.stores
            row = state.table(oid)
            if row is None:
                return
            self.watch.began(oid, row.qualified_name)
            try:
                self._copy(state, progress, row, snap, permits)
            except CopyAbandoned:
                return  # the watch failed the table already; this thread must touch nothing more
            except Exception as exc:  # one table's failure must not stop the others
                if self.watch.given_up(threading.current_thread()):
                    return  # the watch failed the table already (its reads ended: this is their error)
                if lost_connection(exc):
                    lost.set()
                    raise  # not the table's failure: the whole round waits for the server
                self._failed(state, oid, self.watch.explain(oid, exc))
            finally:
                self.watch.ended(oid)

        todo = list(oids)
        errors: list[BaseException] = []

        def work() -> None:
            while True:
                try:
                    oid = todo.pop(0)
                except IndexError:
                    return
                try:
                    copy_one(oid)
                except BaseException as exc:  # raised again by the round, below
                    errors.append(exc)

        # Daemon threads, not a pool: a copy thread the watch gave up on (stuck, CopyWatch) must not
        # hold the round, nor the process at its exit.
        workers = [threading.Thread(target=work, name=f"initial-copy_{i}", daemon=True)
                   for i in range(max(1, min(len(oids), self.config.snapshot.tables_at_once)))]
        try:
            for worker in workers:
                worker.start()
            for worker in workers:
                while worker.is_alive() and not self.watch.given_up(worker):
                    worker.join(CHECK_JOIN_SECONDS)
        finally:
            permits.close_parked()
            for thread, (state, progress) in stores.items():
                if not self.watch.given_up(thread):  # a stuck thread may be inside them
                    progress.close()
                    state.close()
        for error in errors:
            raise error

    def _stalled(self, oid: int, exc: Exception) -> None:
        """Fail a table whose copy the watch gave up on (from the watch's thread)."""
        state = StateStore(self.state_dsn, self.config.name)
        try:
            self._failed(state, oid, exc)
        finally:
            state.close()

    def _failed(self, state: StateStore, oid: int, exc: Exception) -> None:
        """Hand a table's copy failure to the run loop, with the state its copy resumes from.

        A copy that failed before planning its chunks (still PENDING) starts afresh: resuming from
        SNAPSHOT would trust chunks an earlier copy left done.
        """
        row = state.table(oid)
        if row is None:
            return
        if row.state is TableState.ERRORED:
            resume = row.resume_state or TableState.SNAPSHOT
        else:
            resume = TableState.PENDING if row.state is TableState.PENDING else TableState.SNAPSHOT
        self.on_error(state, row, exc, resume)

    def _copy(self, state: StateStore, progress: ProgressStore, row: TableRow, snap: CopySnapshot,
              permits: Permits) -> None:
        snapshot_lsn = snap.position
        schema = row.schema
        name = schema.qualified_name
        chunks = progress.chunks(row.oid)
        # A keyless table cannot merge re-copied rows by key (duplicates are legitimate): start over.
        # A copy retried after failing before it planned (resume_state PENDING) starts over too.
        fresh = row.state is TableState.PENDING or (row.state is TableState.ERRORED
                                                     and row.resume_state is TableState.PENDING)
        resume = not fresh and any(c.done for c in chunks) and bool(schema.key)
        if resume:
            table_lsn = min(c.snapshot_lsn for c in chunks if c.done and c.snapshot_lsn is not None)
        else:
            with permits.take(1), self.source.connect() as conn:
                self.watch.progressed(row.oid)  # the wait for a permit is not the copy's stall
                # The shape as of the snapshot: the table may have changed since it was added (a
                # resync after an ALTER the target could not follow, a rename, a new column).
                schema = schema_at_snapshot(self.source, conn, row.schema, snap, self.config.schema_changes)
                chunks = progress.plan(row.oid, self.source.plan_chunks(conn, schema))
            if schema != row.schema or schema.target_as != row.schema.target_as:
                state.set_schema(schema)
            table_lsn = snapshot_lsn
        state.copy_started(row.oid, table_lsn)
        todo = [c for c in chunks if not c.done]
        reader = self.source.chunk_reader(schema, snap, self.config.snapshot.binary_copy)
        files = not resume and len(todo) >= 2 and takes_files(schema, reader)  # else the Spark path
        ahead = self._copy_sink_ahead(schema) if files else None
        if ahead is None and (resume or len(todo) != 1):
            # A resume's merge needs the table. A one-chunk table's write creates it (write_snapshot
            # ensures it; written on the driver, in the same commit as its rows).
            self.target.ensure_table(schema)
        done_rows = sum(c.rows or 0 for c in chunks if c.done)
        event(log, "snapshot.start", table=name, chunks=len(chunks), chunks_todo=len(todo), resume=resume,
              snapshot_lsn=self.source.format_position(snapshot_lsn))
        started = time.monotonic()
        position = Position(snapshot_lsn, 0)
        sink = ahead
        if sink is None and files:
            sink = self.target.copy_sink(schema, True)  # None: the target takes no files (the Spark path)
        if sink is not None:
            copied = FileCopy(self, progress, row.oid, schema, reader, position, permits).run(
                sink, ahead is not None, todo, (len(chunks) - len(todo), len(chunks), done_rows, started))
            if copied is FileCopyEnd.STOPPED:
                return  # progress is kept; the next run resumes here
            if copied is not FileCopyEnd.TO_SPARK:
                done_rows += copied
                todo = []
        table_rows = 0
        group_size = permits.total
        for start in range(0, len(todo), group_size):
            if self.stop.is_set():
                event(log, "snapshot.paused", table=name, chunks_done=len(chunks) - len(todo) + start)
                return  # progress is kept; the next run resumes here
            group = todo[start:start + group_size]
            counted: list[Callable[[], ValueCounts]] = []
            positions: list[Callable[[], int | None]] = []
            reader = self.source.chunk_reader(schema, snap, self.config.snapshot.binary_copy)
            ranges = [(c.start_page, c.end_page) for c in group]
            with ExitStack() as held:
                after = None
                if len(todo) == 1:
                    # A one-chunk table is read here, holding its connection only for the read, not
                    # for the Spark job that writes it: small tables then copy many at a time.
                    reader = self._prefetch(schema, snap, reader, ranges[0], permits)
                    if not resume:
                        after = self._write_on_driver(schema, reader, position, replace=start == 0)
                else:
                    held.enter_context(permits.take(len(group)))  # the job's tasks read the chunks
                    self.watch.progressed(row.oid)
                if after is None:
                    df = chunk_dataframe(self.spark, schema, reader, ranges, position,
                                         value_rules(name, self.target, self.config.values.infinity),
                                         counted.append, positions.append if not schema.key else None)
                if resume:
                    rows = self._merge(state, row, schema, df)
                else:
                    if after is None:
                        after = self.target.write_snapshot(schema, df, position, replace=start == 0)
                    rows, table_rows = after - table_rows, after
            self.values_changed(name, counted)
            for seen in positions:
                # A keyless table's changes cannot converge by key: its one chunk's own snapshot
                # position is the table's, so the changes it already holds are not applied again.
                if (chunk_position := seen()) is not None and chunk_position != table_lsn:
                    table_lsn = chunk_position
                    state.copy_started(row.oid, table_lsn)
            crash_point("snapshot.after_chunk")
            self.watch.progressed(row.oid)
            progress.mark_done(row.oid, group, snapshot_lsn, rows)
            done_rows += rows
            report_progress(name, len(chunks) - len(todo) + start + len(group), len(chunks), done_rows, started)
        crash_point("snapshot.after_write")
        self.watch.progressed(row.oid)
        if self.target.copy_finished(schema):
            self.on_copied(row.oid)
        state.copy_finished(row.oid, done_rows)
        self.rows_copied[name] = done_rows
        secs = time.monotonic() - started
        event(log, "snapshot.done", table=name, rows=done_rows, chunks=len(chunks), seconds=round(secs, 2),
              rows_per_s=int(done_rows / secs) if secs else 0)

    def _prefetch(self, schema: TableSchema, snap: CopySnapshot, reader: ChunkRead, chunk: tuple[int, int],
                  permits: Permits) -> ChunkRead:
        """``reader`` with its one chunk read now on the driver (``prefetched``): through a session the
        round's small tables share (``Permits.session``) where the source has them, else on a
        connection of its own."""
        opener = self.source.chunk_session(snap, self.config.snapshot.binary_copy)
        if opener is None:
            with permits.take(1):
                self.watch.progressed(schema.oid)
                read = prefetched(reader, *chunk)
        else:
            with permits.session(opener) as session:
                self.watch.progressed(schema.oid)
                read = read_by(session, schema, reader, *chunk)
        self.watch.progressed(schema.oid)
        return read

    def _write_on_driver(self, schema: TableSchema, reader: ChunkRead, position: Position, replace: bool
                         ) -> int | None:
        """Write a chunk read on the driver with no Spark job, where the target can (``copies_arrow``)
        and the values need none of Spark's casts (``driver_rows``); None: the caller runs the Spark job."""
        if small_copy_lane(self.config.engine, self.target.copies_arrow).lane is not Lane.DRIVER:
            return None  # no rows built for a target that cannot take them, nor with engine: spark
        rows = driver_rows(schema, reader, position)
        if rows is None:
            return None
        return self.target.write_snapshot_arrow(schema, rows, replace=replace)

    def _copy_sink_ahead(self, schema: TableSchema) -> FileSink | None:
        """Where a fresh copy's tasks write Parquet before the target is open: the sink its table's
        creation will give (``TargetPlugin.copy_sink_ahead``; ``file_copy`` checks it at the first
        commit), or None: the table's own (``Target.copy_sink``), once the target has made the table."""
        return self.config.target.plugin.copy_sink_ahead(self.config.target.settings, schema)

    def values_changed(self, name: str, counted: list[Callable[[], ValueCounts]]) -> None:
        """Report the values the casts changed, once the write that counted them ran."""
        for read in counted:
            if (changed := read()) and self.on_values_changed is not None:
                self.on_values_changed(name, changed)

    def _merge(self, state: StateStore, row: TableRow, schema: TableSchema, df: DataFrame) -> int:
        """Merge re-copied chunks by key with the position rule (they may overlap copied rows)."""
        df = df.withColumn(HR_OP, F.lit("U")).withColumn(HR_UNCHANGED, F.lit(None).cast("string")).persist()
        try:
            rows = df.count()
            self.target.apply_batch(schema, df, None, current_cursor(state, self.target, row))
        finally:
            df.unpersist()
        return rows


def schema_at_snapshot(source: Source, conn: Any, tracked: TableSchema, snap: CopySnapshot,
                       policy: SchemaChangesConfig) -> TableSchema:
    """Table ``tracked.oid`` as the copy snapshot sees it, keeping its target name if renamed."""
    schema = source.schema_at(conn, tracked.oid, snap)
    if schema is None:
        raise SourceError(f"table {tracked.qualified_name} (oid {tracked.oid}) no longer exists in the source")
    renamed = (schema.schema, schema.name) != (tracked.schema, tracked.name)
    if renamed and policy.rename_table == "keep":
        return replace(schema, target_as=(tracked.target_schema, tracked.target_table))
    return replace(schema, target_as=None if renamed else tracked.target_as)
