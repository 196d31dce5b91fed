"""Tracking tables: add, remove, pause, resume and resync, the domain side of the operator's commands.

Shared by the control plane's commands (through ``run.commands``) and by the catalog watch
(discovery, recreated tables, partitions). Each raises a domain error a person can act on:
``TableNotFound``, ``CommandConflict`` (tracked already, cannot resume), ``TableRefused`` (the
table cannot be replicated, every problem listed), ``RequestError`` (a name that does not parse).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from headrace.capture.loop import Capture
from headrace.config import PipelineConfig
from headrace.core.errors import CommandConflict, RequestError, SourceError, TableNotFound, TableRefused
from headrace.core.interfaces import Target
from headrace.core.names import TableName, TableNameError
from headrace.core.schema import TableSchema
from headrace.logs import event
from headrace.source import open_source
from headrace.source.base import Source
from headrace.state.lifecycle import TableState
from headrace.state.store import StateStore, TableRow

log = logging.getLogger("headrace.control")


class TableTracking:
    """The run's tables: what adding, removing, pausing, resuming and resyncing one does."""

    def __init__(self, config: PipelineConfig, dsn: str, capture: Callable[[], Capture | None],
                 target: Callable[[], Target], source: Source | None = None) -> None:
        self.config = config
        self.dsn = dsn
        self.source = source or open_source(config, dsn)
        self._capture = capture  # None before the run starts capture
        self._target = target  # opened on first use

    def pause(self, state: StateStore, name: str) -> dict[str, Any]:
        row = find_table(state, name)
        if row.state is not TableState.PAUSED:
            resume = {TableState.ERRORED: row.resume_state, TableState.SNAPSHOT: TableState.PENDING}.get(
                row.state, row.state)
            state.paused(row.oid, resume or TableState.CATCHUP)
            event(log, "table.paused", table=row.qualified_name, resume_state=(resume or TableState.CATCHUP).value)
        return {"table": row.qualified_name, "state": TableState.PAUSED.value}

    def resume(self, state: StateStore, name: str) -> dict[str, Any]:
        """Resume a PAUSED table, or try an ERRORED one again now (after the operator fixed the cause)."""
        row = find_table(state, name)
        if row.state is TableState.ERRORED and row.resume_state is None:
            raise CommandConflict(f"table {row.qualified_name} cannot resume: {row.error}")
        if row.state not in (TableState.PAUSED, TableState.ERRORED):
            raise CommandConflict(f"table {row.qualified_name} is {row.state.value}, not PAUSED or ERRORED")
        to = row.resume_state or TableState.CATCHUP
        state.resumed(row.oid, to)
        event(log, "table.resumed", table=row.qualified_name, state=to.value)
        return {"table": row.qualified_name, "state": to.value}

    def resync(self, state: StateStore, name: str) -> dict[str, Any]:
        # Back to PENDING: the run loop copies it again under a new snapshot, write_snapshot
        # replaces the target's rows, and staged changes up to the new copy position are skipped.
        row = find_table(state, name)
        state.resync_requested(row.oid)
        event(log, "table.resync", table=row.qualified_name)
        return {"table": row.qualified_name, "state": TableState.PENDING.value}

    def add(self, state: StateStore, name: str) -> dict[str, Any]:
        schema = self.start_tracking(state, parse_table(name))
        return {"table": schema.qualified_name, "oid": schema.oid, "state": TableState.PENDING.value}

    def start_tracking(self, state: StateStore, qualified: str | TableName) -> TableSchema:
        """Assess, capture, publish and track table ``qualified`` (PENDING: the run loop copies it).

        Shared by the API's add-table and by discovery. Raises ``TableNotFound`` when the table is
        missing, ``CommandConflict`` when it is tracked already and ``TableRefused`` when it cannot be
        replicated (the problems joined). Changes committed before the table is published are not
        lost: the initial copy reads an exported snapshot taken after this, and capture knows the oid
        before the first change it can be sent.
        """
        tracked = state.tables()
        source = self.source
        with source.connect() as conn:
            assessment = source.assess(conn, [qualified])
            (table,) = assessment["tables"]
            if not table["exists"]:
                raise TableNotFound("; ".join(table["problems"]) or f"table {qualified} does not exist")
            if any(r.oid == table["oid"] for r in tracked):
                raise CommandConflict(f"table {table['table']} is replicated already")
            if assessment["problems"]:
                raise TableRefused("; ".join(assessment["problems"]))
            schema = source.read_table_schema(conn, int(table["oid"]))
            capture = self._capture()
            if capture is not None:
                capture.track(schema)  # before the publication: its first RELATION must be kept
            source.capture_tables(conn, published_names(source, conn, tracked) + [schema.table_name])
        state.add_table(schema)
        event(log, "table.added", table=schema.qualified_name, oid=schema.oid)
        return schema

    def remove(self, state: StateStore, name: str, drop_target: bool = False) -> dict[str, Any]:
        row = find_table(state, name)
        with self.source.connect() as conn:
            remaining = published_names(self.source, conn, [r for r in state.tables() if r.oid != row.oid])
            try:
                self.source.capture_tables(conn, remaining)
            except SourceError as exc:
                raise CommandConflict(str(exc)) from None
        state.remove_table(row.oid)
        if drop_target:
            self._target().drop_table(row.schema)
        event(log, "table.removed", table=row.qualified_name, dropped_target=drop_target)
        return {"table": row.qualified_name, "removed": True, "dropped_target": drop_target}


def published_names(source: Source, conn: Any, rows: list[TableRow]) -> list[TableName]:
    """Current names of the tracked tables that still exist in the source.

    By oid, so a renamed table keeps its place, and a dropped one (not finished yet) drops out.
    """
    return source.current_names(conn, [r.oid for r in rows])


def parse_table(name: str) -> TableName:
    """An operator's table name (SQL syntax, a bare name meaning public); ``RequestError`` when it does
    not parse."""
    try:
        return TableName.parse(name)
    except TableNameError as exc:
        raise RequestError(str(exc)) from None


def find_table(state: StateStore, name: str) -> TableRow:
    """The tracked table called ``name`` (``schema.table`` in SQL syntax, a bare name meaning public,
    or an oid); ``TableNotFound`` when this pipeline does not replicate it."""
    rows = state.tables()
    if name.isdigit():
        for row in rows:
            if str(row.oid) == name:
                return row
    wanted = parse_table(name)
    for row in rows:
        if row.schema.table_name == wanted:
            return row
    raise TableNotFound(f"table {wanted} is not replicated by this pipeline")
