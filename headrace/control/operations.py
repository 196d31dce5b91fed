"""Operator commands against a running pipeline: pause, resume, resync, add and remove tables.

The API's threads never touch table state themselves: they queue a command, and the run loop
executes it between copy and apply steps (``run_pending``), so a command cannot race a batch that
is being applied. The caller waits for the result, or gets "queued" if the loop is busy for long.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import psycopg

from headrace.core.errors import HeadraceError, SourceError
from headrace.core.names import TableName, TableNameError
from headrace.core.schema import TableSchema
from headrace.logs import event
from headrace.source.postgres.catalog import read_table_schema
from headrace.source.postgres.replication import ensure_publication
from headrace.source.postgres.types import TypeCatalog
from headrace.state.lifecycle import TableState
from headrace.state.store import StateStore, TableRow

if TYPE_CHECKING:
    from headrace.pipeline import Pipeline

log = logging.getLogger("headrace.control")

Command = Callable[[StateStore], dict[str, Any]]


class OperationError(HeadraceError):
    """An operator request that cannot be carried out; ``status`` is the HTTP status to answer."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class Operations:
    """The command queue between the API and the run loop, and the commands themselves."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.paused = False  # the whole pipeline; capture goes on, copy and apply wait
        self._queue: queue.Queue[tuple[Command, Future[dict[str, Any]]]] = queue.Queue()
        self._wake = threading.Event()
        self._running = False

    # -- the queue ------------------------------------------------------------------------------
    def call(self, command: Command, timeout: float = 20.0) -> tuple[bool, dict[str, Any]]:
        """Run ``command`` in the run loop: (True, result), or (False, {}) if still queued at ``timeout``."""
        if not self._running:
            raise OperationError("the pipeline is not running", 503)
        future: Future[dict[str, Any]] = Future()
        self._queue.put((command, future))
        self._wake.set()
        try:
            return True, future.result(timeout)
        except TimeoutError:
            return False, {}

    def run_pending(self, state: StateStore) -> None:
        """Execute queued commands (called by the run loop)."""
        self._running = True
        while True:
            try:
                command, future = self._queue.get_nowait()
            except queue.Empty:
                return
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(command(state))
            except Exception as exc:
                future.set_exception(exc)

    def wait(self, seconds: float) -> None:
        """Sleep in the run loop until ``seconds`` pass or a command arrives."""
        self._wake.wait(seconds)
        self._wake.clear()

    def close(self) -> None:
        """The run loop is ending: fail whatever is still queued."""
        self._running = False
        while True:
            try:
                _command, future = self._queue.get_nowait()
            except queue.Empty:
                return
            if future.set_running_or_notify_cancel():
                future.set_exception(OperationError("the pipeline stopped before the command ran", 503))

    # -- commands (each runs in the run loop) -------------------------------------------------------
    def pause_pipeline(self, state: StateStore) -> dict[str, Any]:
        self.paused = True
        event(log, "pipeline.paused", pipeline=self.pipeline.config.name)
        return {"paused": True}

    def resume_pipeline(self, state: StateStore) -> dict[str, Any]:
        self.paused = False
        event(log, "pipeline.resumed", pipeline=self.pipeline.config.name)
        return {"paused": False}

    def pause_table(self, name: str) -> Command:
        def command(state: StateStore) -> dict[str, Any]:
            row = find_table(state, name)
            if row.state is not TableState.PAUSED:
                resume = {TableState.ERRORED: row.resume_state, TableState.SNAPSHOT: TableState.PENDING}.get(
                    row.state, row.state)
                state.set_state(row.oid, TableState.PAUSED, resume_state=resume or TableState.CATCHUP)
                event(log, "table.paused", table=row.qualified_name, resume_state=(resume or TableState.CATCHUP).value)
            return {"table": row.qualified_name, "state": TableState.PAUSED.value}
        return command

    def resume_table(self, name: str) -> Command:
        """Resume a PAUSED table, or try an ERRORED one again now (after the operator fixed the cause)."""
        def command(state: StateStore) -> dict[str, Any]:
            row = find_table(state, name)
            if row.state is TableState.ERRORED and row.resume_state is None:
                raise OperationError(f"table {row.qualified_name} cannot resume: {row.error}", 409)
            if row.state not in (TableState.PAUSED, TableState.ERRORED):
                raise OperationError(f"table {row.qualified_name} is {row.state.value}, not PAUSED or ERRORED", 409)
            to = row.resume_state or TableState.CATCHUP
            state.set_state(row.oid, to, resume_state=None, error=None, error_count=0, retry_at=None)
            event(log, "table.resumed", table=row.qualified_name, state=to.value)
            return {"table": row.qualified_name, "state": to.value}
        return command

    def resync_table(self, name: str) -> Command:
        def command(state: StateStore) -> dict[str, Any]:
            # Back to PENDING: the run loop copies it again under a new snapshot, write_snapshot
            # replaces the target's rows, and staged changes up to the new copy position are skipped.
            row = find_table(state, name)
            state.set_state(row.oid, TableState.PENDING, snapshot_lsn=None, rows_copied=0, error=None,
                            error_count=0, retry_at=None, resume_state=None)
            event(log, "table.resync", table=row.qualified_name)
            return {"table": row.qualified_name, "state": TableState.PENDING.value}
        return command

    def add_table(self, name: str) -> Command:
        def command(state: StateStore) -> dict[str, Any]:
            schema = self.start_tracking(state, parse_table(name))
            return {"table": schema.qualified_name, "oid": schema.oid, "state": TableState.PENDING.value}
        return command

    def start_tracking(self, state: StateStore, qualified: str | TableName) -> TableSchema:
        """Assess, capture, publish and track table ``qualified`` (PENDING: the run loop copies it).

        Shared by the API's add-table and by discovery. Raises ``OperationError`` when the table is
        missing (404), tracked already (409) or cannot be replicated (422, the problems joined).
        Changes committed before the table is published are not lost: the initial copy reads an
        exported snapshot taken after this, and capture knows the oid before the first change it
        can be sent.
        """
        from headrace.control.assess import assess

        p = self.pipeline
        tracked = state.tables()
        with psycopg.connect(p.dsn, autocommit=True) as conn:
            assessment = assess(conn, [qualified], p.config.publication_name)
            (table,) = assessment["tables"]
            if not table["exists"]:
                raise OperationError("; ".join(table["problems"]) or f"table {qualified} does not exist", 404)
            if any(r.oid == table["oid"] for r in tracked):
                raise OperationError(f"table {table['table']} is replicated already", 409)
            if assessment["problems"]:
                raise OperationError("; ".join(assessment["problems"]), 422)
            schema = read_table_schema(conn, int(table["oid"]), TypeCatalog(conn, p.config.source.text_columns))
            if p.capture is not None:
                p.capture.track(schema)  # before the publication: its first RELATION must be kept
            ensure_publication(conn, p.config.publication_name,
                               published_names(conn, tracked) + [schema.table_name])
        state.add_table(schema)
        event(log, "table.added", table=schema.qualified_name, oid=schema.oid)
        return schema

    def remove_table(self, name: str, drop_target: bool = False) -> Command:
        def command(state: StateStore) -> dict[str, Any]:
            p = self.pipeline
            row = find_table(state, name)
            with psycopg.connect(p.dsn, autocommit=True) as conn:
                remaining = published_names(conn, [r for r in state.tables() if r.oid != row.oid])
                try:
                    ensure_publication(conn, p.config.publication_name, remaining)
                except SourceError as exc:
                    raise OperationError(str(exc), 409) from None
            state.remove_table(row.oid)
            if drop_target:
                p.target.drop_table(row.schema)
            event(log, "table.removed", table=row.qualified_name, dropped_target=drop_target)
            return {"table": row.qualified_name, "removed": True, "dropped_target": drop_target}
        return command


def published_names(conn: psycopg.Connection[Any], rows: list[TableRow]) -> list[TableName]:
    """Current names of the tracked tables that still exist in the source.

    By oid, so a renamed table keeps its place, and a dropped one (not finished yet) drops out.
    """
    found = {oid: TableName(schema, name) for oid, schema, name in conn.execute(
        "SELECT c.oid::int8, n.nspname, c.relname FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = ANY(%s::oid[])",
        ([r.oid for r in rows],)).fetchall()}
    return [found[r.oid] for r in rows if r.oid in found]


def parse_table(name: str) -> TableName:
    """An operator's table name (SQL syntax, a bare name meaning public); 400 when it does not parse."""
    try:
        return TableName.parse(name)
    except TableNameError as exc:
        raise OperationError(str(exc), 400) from None


def find_table(state: StateStore, name: str) -> TableRow:
    """The tracked table called ``name`` (``schema.table`` in SQL syntax, a bare name meaning public,
    or an oid)."""
    rows = state.tables()
    if name.isdigit():
        for row in rows:
            if str(row.oid) == name:
                return row
    wanted = parse_table(name)
    for row in rows:
        if row.schema.table_name == wanted:
            return row
    raise OperationError(f"table {wanted} is not replicated by this pipeline", 404)
