"""Tables that come and go: discovery of new tables, dropped tables, and tables dropped and created again.

pgoutput says nothing about CREATE or DROP TABLE, so the run loop asks the catalog every
``source.discovery_seconds``:

- a tracked oid missing from ``pg_class`` was dropped. The WAL insert position read *after* seeing
  it missing is past the DROP's commit, so once capture has registered everything up to that
  position, every change the table ever had is staged; when those are applied, the table leaves the
  pipeline (its state rows go) and its target table is kept or dropped (``schema_changes.drop_table``).
- a dropped table whose name now belongs to another oid was recreated: the old oid leaves at once
  (its staged changes are never applied: the new table's copy replaces the target's rows) and the
  new table is tracked and copied into the same target table (``schema_changes.recreated_table``).
- with ``source.schemas`` / ``all_tables``, an untracked table in those schemas is new: it is
  tracked through the same path as the API's add-table (capture first, then the publication, then
  a copy under a snapshot exported afterwards, so no change before or after is lost); one that
  cannot be replicated is noted as refused, with the reason, and assessed again at the next pass.

The catalog reads are the source's ``catalog_watch`` capability. MySQL's (``source/mysql/watch.py``)
reports no table gone (its binlog stream stops dropped tables itself) and lists new tables the same
way; a table dropped and created again there keeps its id, so it comes as ``extra["recreated"]`` and
is copied again in place.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from headrace.capture.loop import Capture
from headrace.config import PipelineConfig
from headrace.core.errors import RequestError, SchemaChangeError, TableRefused
from headrace.core.interfaces import Target
from headrace.core.schema import TableSchema
from headrace.log.store import StagingStore
from headrace.logs import event
from headrace.materialize.apply import current_cursor
from headrace.materialize.evolve import remap_error, remapped_columns
from headrace.materialize.initial_copy import FailHandler
from headrace.materialize.retention import collect_table
from headrace.run.observer import RunObserver
from headrace.run.tracking import TableTracking
from headrace.source import open_source
from headrace.source.base import Source
from headrace.state.lifecycle import RETRY_BUDGET, TableState
from headrace.state.store import StateStore, TableRow

log = logging.getLogger("headrace.tables")

LAST_OFFSET = 2**63 - 1  # above every staged-log offset


class TableWatch:
    """Follows the source catalog for the run loop (``step`` between copy and apply steps)."""

    def __init__(self, config: PipelineConfig, dsn: str, tracking: TableTracking, observer: RunObserver,
                 fail: FailHandler, capture: Callable[[], Capture | None], target: Callable[[], Target],
                 copy_running: Callable[[], bool], staging: StagingStore, source: Source | None = None) -> None:
        self.config = config
        self.source = source or open_source(config, dsn)
        self.catalog = self.source.catalog_watch()  # None: the source has no catalog to poll
        self.staging = staging
        self.dsn = dsn
        self.tracking = tracking
        self.observer = observer
        self.fail = fail
        self._capture = capture  # None before the run starts capture
        self._target = target  # opened on first use
        self._copy_running = copy_running
        self.dropping: dict[int, int] = {}  # oid -> WAL insert LSN when the drop was observed
        self._retired: dict[int, int] = {}  # old oid of a recreated table -> LSN: sweep late staged rows
        self._refused_recreate: set[int] = set()
        self._leaves: dict[int, set[int]] = {}  # partitioned table -> its leaf partitions at the last poll
        self._next_poll = 0.0
        self._quiet_until = 0.0  # after a failure, nothing until then
        # Waits for (and harvests) a table's apply batch in flight before the watch touches the table.
        self.settle: Callable[[StateStore, int], None] = lambda state, oid: None

    @property
    def next_due(self) -> float:
        """When (``time.monotonic``) the next catalog poll is due."""
        return max(self._next_poll, self._quiet_until)

    @property
    def busy(self) -> bool:
        """Dropped or recreated tables are being finished (the loop keeps its short cadence)."""
        return bool(self.dropping or self._retired)

    def step(self, state: StateStore) -> bool:
        """Finish dropped tables whose changes are all applied; poll the catalog when due.

        A failure (the source unreachable, a target error while dropping a table) is logged and
        tried again at the next poll: it must not stop the tables that are streaming.
        """
        if time.monotonic() < self._quiet_until:
            return False
        try:
            did_work = self._finish_drops(state)
            did_work |= self._stream_errors(state)
            capture = self._capture()
            created = capture is not None and capture.tables_created.is_set()
            if created and capture is not None:
                capture.tables_created.clear()  # before the poll: a table created during it polls again
            if self.catalog is not None and (created or time.monotonic() >= self._next_poll):
                self._next_poll = time.monotonic() + self.config.source.discovery_seconds
                self._poll(state)
            return did_work
        except Exception as exc:
            self._next_poll = self._quiet_until = time.monotonic() + self.config.source.discovery_seconds
            event(log, "tables.watch_failed", logging.WARNING, error=f"{type(exc).__name__}: {exc}".strip(),
                  retry_s=self.config.source.discovery_seconds)
            log.debug("traceback", exc_info=exc)
            return False

    def _stream_errors(self, state: StateStore) -> bool:
        """Tables the change stream stopped (MySQL: a tracked table dropped, as its binlog says): ERRORED
        with the stream's message and, as a schema change, the fix `headrace resync`."""
        capture = self._capture()
        if capture is None or not capture.table_errors:
            return False
        for oid in list(capture.table_errors):
            message = capture.table_errors.pop(oid)
            row = state.table(oid)
            if row is not None and row.state != TableState.ERRORED:
                self.settle(state, oid)
                self.fail(state, row, SchemaChangeError(message), TableState.PENDING)
        return True

    # -- the catalog poll -------------------------------------------------------------------------
    def _poll(self, state: StateStore) -> None:
        source = self.config.source
        rows = state.tables()
        assert self.catalog is not None
        # One snapshot for every read (the watch's): a DROP + CREATE committing between two reads
        # would otherwise look like a new table beside a live one, then like a drop of the old.
        poll = self.catalog.poll({r.oid: r.schema.table_name for r in rows}, source.schemas or None,
                                 source.discovers)
        listed, successors, leaves, lsn = poll.listed, poll.successors, poll.leaves, poll.position
        gone = [r for r in rows if r.oid not in poll.alive]
        tracked = {r.oid for r in rows}
        for row in gone:
            successor = successors[row.oid]
            if successor is not None and successor not in tracked:
                # Recreated, possibly after its drop was seen: its last changes are not applied then.
                self.dropping.pop(row.oid, None)
                self._recreated(state, row, successor, lsn)
            elif row.oid not in self.dropping:
                self.dropping[row.oid] = lsn
                event(log, "table.drop_seen", table=row.qualified_name, oid=row.oid,
                      lsn=self.source.format_position(lsn))
        if self.dropping or self._retired:
            self._heartbeat()
        for oid, name in poll.extra.get("recreated", {}).items():
            self._recreated_in_place(state, oid, name, lsn)
        for row in rows:
            if row.oid in leaves:
                self._partitions_changed(state, row, leaves[row.oid], lsn)
        if not source.discovers:
            return
        handled = {successors[r.oid] for r in gone}
        refused = set()
        for oid, name in listed.items():
            if oid in tracked or oid in handled:
                continue
            schema = self._track(state, oid, name)
            if schema is None:
                refused.add(oid)
                continue
            state.record_ddl(schema.oid, schema.qualified_name, "create_table", "new table: copying", lsn)
            self.observer.ddl_applied("create_table")
            event(log, "table.created", table=schema.qualified_name, oid=schema.oid)
        state.forget_refused(refused)

    def follow_text_columns(self, state: StateStore, conn: Any) -> None:
        """At start-up: tables whose columns the config now maps to another type (``source.columns_as_text``
        changed since they were copied).

        A copy under way starts again in the new shape (nothing was streamed yet). A copied table
        stops with a terminal ``SchemaChangeError`` naming the columns and ``headrace resync``: its
        target columns change type, which needs a new copy, and an edited config re-copying a large
        table by itself would surprise. A paused table is left as it is; the first change applied
        after its resume meets the same error (``plan_changes``).
        """
        tracked = [r for r in state.tables() if r.state is not TableState.PENDING]
        alive = self.source.text_columns_watch(conn, [r.oid for r in tracked])
        for row in tracked:
            if row.oid not in alive:
                continue  # dropped: the catalog poll finishes it
            remapped = remapped_columns(row.schema, self.source.read_table_schema(conn, row.oid))
            if not remapped:
                continue
            columns = ", ".join(after.name for _, after in remapped)
            if row.state is TableState.SNAPSHOT:
                state.copy_restarted(row.oid)
                event(log, "table.copy_restarted", table=row.qualified_name, reason="source.columns_as_text",
                      columns=columns)
            elif row.resume_state is not None and row.resume_state.needs_copy:
                state.copy_restarts_on_resume(row.oid)
            elif row.state is not TableState.PAUSED:
                self.fail(state, row, remap_error(row.schema, remapped), row.resume_state or row.state)

    def _track(self, state: StateStore, oid: int, name: str) -> TableSchema | None:
        """Track a table found in the catalog; None (noted as refused) when it cannot be replicated."""
        try:
            return self.tracking.start_tracking(state, name)
        except RequestError as exc:  # gone meanwhile, or tracked already: nothing to note
            if isinstance(exc, TableRefused) and state.refuse_table(oid, name, str(exc)):
                event(log, "table.refused", logging.WARNING, table=name, oid=oid, reason=str(exc))
            return None

    def _recreated(self, state: StateStore, row: TableRow, new_oid: int, lsn: int) -> None:
        if self.config.schema_changes.recreated_table == "refuse":
            if row.oid not in self._refused_recreate:
                message = (f"table {row.qualified_name} was dropped and recreated (oid {row.oid}, now {new_oid})"
                           " and schema_changes.recreated_table is refuse: remove it (headrace remove-table"
                           f" {row.qualified_name}) and add it again (headrace add-table {row.qualified_name})"
                           " to copy the new table, or set recreated_table: resync")
                state.errored(row.oid, message, kind="terminal", count=RETRY_BUDGET, retry_at=None, resume=None,
                              fix=f"headrace remove-table {row.qualified_name}; headrace add-table "
                                  f"{row.qualified_name}")
                self.observer.table_failed(row.qualified_name, "terminal")
                event(log, "table.recreated_refused", logging.ERROR, table=row.qualified_name, error=message)
                self._refused_recreate.add(row.oid)
            return
        if self._copying(row):
            return  # its copy must end before the new table's replaces the target's rows
        self.settle(state, row.oid)
        # The old table's staged changes must never reach the target: out of the pipeline now, and
        # rows capture registers for it later are swept once capture passes ``lsn``.
        self._forget(state, row.oid)
        self._retired[row.oid] = lsn
        # The copy replaces the target's rows, and the table itself when the new one has another shape.
        schema = self._track(state, new_oid, row.qualified_name)
        detail = (f"oid {row.oid} -> {new_oid}: " + ("copying the new table into the same target table"
                  if schema is not None else "the new table cannot be replicated (see refused tables)"))
        state.record_ddl(new_oid, row.qualified_name, "recreate_table", detail, lsn)
        self.observer.ddl_applied("recreate_table")
        event(log, "table.recreated", table=row.qualified_name, old_oid=row.oid, oid=new_oid,
              resync=schema is not None)

    def _recreated_in_place(self, state: StateStore, oid: int, name: str, lsn: int) -> None:
        """A table dropped and created again that keeps its id (MySQL: the id is its name's hash; the
        stream saw the DROP and the CREATE): copied again into the same target table with
        ``recreated_table: resync``; with ``refuse`` it stays ERRORED with the stream's message."""
        row = state.table(oid)
        if (row is None or self.config.schema_changes.recreated_table == "refuse" or row.state.needs_copy
                or row.state is TableState.PAUSED):
            return
        self.settle(state, oid)
        self.tracking.resync(state, str(oid))  # the copy replaces the target's rows; older changes are skipped
        state.record_ddl(oid, name, "recreate_table", "dropped and created again: copying the new table", lsn)
        self.observer.ddl_applied("recreate_table")
        event(log, "table.recreated", table=name, old_oid=oid, oid=oid, resync=True)

    def _partitions_changed(self, state: StateStore, row: TableRow, leaves: dict[int, bool], lsn: int) -> None:
        """Resync a partitioned table whose rows changed without changes in the stream.

        Detaching or dropping a partition removes its rows from the table, and attaching a table
        with rows adds them, with no DELETE or INSERT in the WAL; new partitions made with
        ``CREATE TABLE ... PARTITION OF`` need nothing (their rows arrive as the table's changes).
        The leaves are compared with those of the last poll, or at a run's first poll with those the
        state store kept from the run before (a partition attached while headrace was stopped); a
        table never polled before only has its leaves recorded.
        """
        known = self._leaves.get(row.oid)
        if known is None and row.partitions is not None:
            known = set(row.partitions)
        copying = self._copying(row)
        if known is not None and not copying:
            removed = known - set(leaves)
            attached = {leaf for leaf, linked_later in leaves.items() if linked_later and leaf not in known}
            if removed or attached:
                detail = (f"partitions detached or dropped: {len(removed)}, attached: {len(attached)};"
                          " copying the table again")
                self.settle(state, row.oid)
                self.tracking.resync(state, str(row.oid))
                state.record_ddl(row.oid, row.qualified_name, "resync_partitions", detail, lsn)
                self.observer.ddl_applied("resync_partitions")
                event(log, "table.partitions_changed", logging.WARNING, table=row.qualified_name,
                      removed=len(removed), attached=len(attached))
        if known is None or not copying:
            self._leaves[row.oid] = set(leaves)
            if row.partitions is None or set(row.partitions) != set(leaves):
                state.record_partitions(row.oid, list(leaves))

    # -- finishing drops ----------------------------------------------------------------------------
    def _finish_drops(self, state: StateStore) -> bool:
        capture = self._capture()
        captured = capture.captured_lsn if capture else 0
        for oid, lsn in list(self._retired.items()):
            if captured >= lsn:
                self._forget(state, oid)
                del self._retired[oid]
        did_work = False
        for oid, lsn in list(self.dropping.items()):
            row = state.table(oid)
            if row is None:  # removed through the API meanwhile
                del self.dropping[oid]
                continue
            policy = self.config.schema_changes.drop_table
            # With drop, its last changes would be applied to a table about to go: skip them.
            if captured < lsn or self._copying(row) or (policy == "keep" and self._still_applying(state, row)):
                continue
            self.settle(state, oid)
            # Never drop a target table another tracked table writes to (the name was taken again).
            shared = [r.qualified_name for r in state.tables() if r.oid != oid
                      and (r.schema.target_schema, r.schema.target_table) == (row.schema.target_schema,
                                                                               row.schema.target_table)]
            if policy == "drop" and not shared:
                self._target().drop_table(row.schema)
            self._forget(state, oid)
            detail = ("target table dropped" if policy == "drop" and not shared else
                      f"target table kept (written by {', '.join(shared)})" if shared else "target table kept")
            state.record_ddl(oid, row.qualified_name, "drop_table", detail, lsn)
            self.observer.ddl_applied("drop_table")
            event(log, "table.dropped", table=row.qualified_name, oid=oid, target=policy,
                  applied_lsn=self.source.format_position(row.applied_lsn) if row.applied_lsn is not None else None)
            del self.dropping[oid]
            did_work = True
        return did_work

    def _still_applying(self, state: StateStore, row: TableRow) -> bool:
        """The table has staged changes left that the loop will still apply (now or at a retry)."""
        resumes = row.resume_state is not None and row.resume_state.applies_changes
        retrying = (row.state is TableState.ERRORED and resumes and not row.waits_for_operator
                    and row.error_count < RETRY_BUDGET)
        paused = row.state is TableState.PAUSED and resumes  # waits for the operator's resume
        if not (row.state.applies_changes or retrying or paused):
            return False
        return current_cursor(state, self._target(), row) < state.log_index.last_offset(row.oid)

    def _copying(self, row: TableRow) -> bool:
        in_copy = row.state.needs_copy or (row.resume_state is not None and row.resume_state.needs_copy)
        return in_copy and self._copy_running()

    def _heartbeat(self) -> None:
        capture = self._capture()
        if capture is not None:
            capture.request_heartbeat()

    def _forget(self, state: StateStore, oid: int) -> None:
        """Stop tracking a table, deleting its staged files (the log rows go first, as in retention)."""
        collect_table(state, self.staging, oid, LAST_OFFSET)
        state.remove_table(oid)



