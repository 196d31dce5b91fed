"""Start-up invariants: refuse to run on state that no longer matches the source or the staging store.

Each check raises ``SourceError`` naming what happened, which object, and what to do. Running on
regardless would silently lose or misplace changes: a slot moved past what we registered skipped
changes, a dropped slot lost WAL, a recreated table is a different table, a lost staged file is a
gap in the log.
"""

from __future__ import annotations

from typing import Any

import psycopg

from headrace.core.errors import SourceError
from headrace.core.position import format_lsn
from headrace.core.schema import TableSchema
from headrace.log.store import StagingStore
from headrace.source.postgres.wal_guard import lost_message
from headrace.state.store import StateStore, TableRow

_TABLE_STATE = ("tables", "mat_cursor", "log_index", "snapshot_progress")


def forget_pipeline_sql(pipeline: str) -> str:
    """SQL that drops a pipeline's state, so the next run copies every table afresh."""
    return " ".join(f"DELETE FROM _headrace.{t} WHERE pipeline = '{pipeline}';"
                    for t in ("pipeline_meta", *_TABLE_STATE))


def forget_table_sql(pipeline: str, oid: int) -> str:
    """SQL that drops one table's state, so the next run adds it again and copies it afresh."""
    return " ".join(f"DELETE FROM _headrace.{t} WHERE pipeline = '{pipeline}' AND table_oid = {oid};"
                    for t in _TABLE_STATE)


def check_slot(conn: psycopg.Connection[Any], state: StateStore, slot: str) -> None:
    """The slot is where this pipeline left it: not dropped, not advanced, not recreated.

    The slot may legitimately be anywhere up to ``acked_lsn`` (capture records that bound before
    each confirmation); beyond it, someone else consumed or advanced the slot, or recreated it.
    """
    meta = state.meta()
    if meta is None:
        return  # first run: the slot is created (or adopted) now
    captured = int(meta["captured_lsn"])
    acked = max(captured, int(meta.get("acked_lsn") or 0))
    row = conn.execute("SELECT confirmed_flush_lsn - '0/0'::pg_lsn, wal_status FROM pg_replication_slots"
                       " WHERE slot_name = %s", (slot,)).fetchone()
    forget = forget_pipeline_sql(state.pipeline)
    if row is not None and row[1] == "lost":
        raise SourceError(lost_message(state.pipeline, slot))
    if row is None:
        raise SourceError(
            f"replication slot {slot} of pipeline {state.pipeline} no longer exists (dropped, or lost with a "
            f"failover), so the changes after {format_lsn(captured)} are gone from the WAL: the target can no "
            f"longer be kept exact. Copy every table again: drop this pipeline's state ({forget}) and run again; "
            "the copies replace the target tables (`headrace reset -c <pipeline file> --yes` does the same)"
        )
    confirmed = int(row[0]) if row[0] is not None else 0
    if confirmed > acked:
        raise SourceError(
            f"replication slot {slot} is at {format_lsn(confirmed)}, beyond the {format_lsn(acked)} pipeline "
            f"{state.pipeline} confirmed: someone else advanced or consumed it, or dropped and recreated it, so "
            f"changes in between were skipped. Copy every table again: drop this pipeline's state ({forget}) and "
            "the slot (SELECT pg_drop_replication_slot('" + slot + "')), then run again (`headrace reset -c <pipeline "
            "file> --yes` does both)"
        )


def check_tables(state: StateStore, schemas: list[TableSchema],
                 recreated_table: str = "refuse") -> list[tuple[TableRow, TableSchema]]:
    """Each configured table is still the one tracked under its name (same ``pg_class`` oid).

    A table dropped and created again under its name (new oid) is refused with
    ``recreated_table="refuse"``; with ``"resync"`` it is returned as (old row, new schema), for the
    caller to resync: the old oid's staged changes belong to the old table and must not be applied.
    """
    tracked = state.tables()
    oids = {row.oid for row in tracked}
    recreated = []
    for schema in schemas:
        if schema.oid in oids:
            continue
        for row in tracked:
            if row.qualified_name == schema.qualified_name:
                if recreated_table == "resync":
                    recreated.append((row, schema))
                    continue
                raise SourceError(
                    f"table {schema.qualified_name} was dropped and recreated (oid {row.oid} in pipeline "
                    f"{state.pipeline}'s state, {schema.oid} now): its staged changes belong to the old table. "
                    f"Forget the old one ({forget_table_sql(state.pipeline, row.oid)}) and run again: the new "
                    "table is copied afresh and its copy replaces the target table (or set "
                    "schema_changes.recreated_table: resync to have that done by itself)"
                )
    return recreated


def check_staged_files(state: StateStore, staging: StagingStore) -> None:
    """Every staged file some table still has to apply is in the staging store."""
    for row in state.tables():
        cursor = state.log_index.cursor(row.oid)
        while True:
            entries = state.log_index.entries(row.oid, cursor, 1000)
            if not entries:
                break
            for entry in entries:
                if not staging.exists(entry.path):
                    raise SourceError(
                        f"staged file {entry.path} (table {row.qualified_name}, log offset {entry.offset}) is "
                        "registered but missing: the staging store lost changes the target has not applied yet. "
                        f"Copy the table again: forget it ({forget_table_sql(state.pipeline, row.oid)}) and run "
                        "again; the copy replaces the target table"
                    )
            cursor = entries[-1].offset
