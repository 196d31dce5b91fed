"""The consistent point of a comparison: a source snapshot at a known position, and the target
pinned once it has applied everything before that position.

PostgreSQL: the snapshot a temporary logical slot exports (as the initial copy takes it): it holds
exactly the transactions that committed before the slot's consistent point, the same boundary the
staged log's positions use. The exporting connection closes (dropping the slot) as soon as the
reading transaction has imported the snapshot.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql

from headrace.core.errors import HeadraceError
from headrace.core.position import format_lsn
from headrace.source.postgres.replication import SESSION_OPTIONS, ExportedSnapshot, emit_heartbeat
from headrace.state.lifecycle import TableState
from headrace.state.store import StateStore, TableRow


class VerifyError(HeadraceError):
    """verify could not run (exit 2): the sentence says why and what to do."""


@contextmanager
def source_snapshot(dsn: str) -> Iterator[tuple[psycopg.Connection[Any], int]]:
    """A connection inside a REPEATABLE READ transaction at an exported snapshot, and its position."""
    conn = psycopg.connect(dsn, autocommit=True, options=SESSION_OPTIONS)
    try:
        with ExportedSnapshot(dsn) as snap:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snap.snapshot_name)))
            position = snap.lsn
        yield conn, position
    finally:
        conn.close()


def _waiting_for(state: StateStore, rows: list[TableRow], position: int) -> tuple[dict[int, str], set[int]]:
    """Tables (oids) whose target does not yet hold everything committed before ``position``, and
    why; and those of them that will not get there without the operator (paused, or failed with no
    retry planned)."""
    captured = state.captured_lsn()
    if captured < position:
        return {r.oid: f"capture is at {format_lsn(captured)}" for r in rows}, set()
    pending = state.conn.execute(
        "SELECT l.table_oid, count(*) AS n FROM _headrace.log_index l"
        " LEFT JOIN _headrace.mat_cursor c ON c.pipeline = l.pipeline AND c.table_oid = l.table_oid"
        " WHERE l.pipeline = %s AND l.log_offset > coalesce(c.log_offset, 0) AND l.min_lsn < %s"
        " GROUP BY l.table_oid", (state.pipeline, position)).fetchall()
    behind = {int(r["table_oid"]): int(r["n"]) for r in pending}
    current = {r.oid: r for r in state.tables()}
    out, stuck = {}, set()
    for row in rows:
        now = current.get(row.oid)
        if now is None:
            out[row.oid] = "no longer replicated"
            stuck.add(row.oid)
        elif now.state not in (TableState.STREAMING, TableState.CATCHUP):
            out[row.oid] = f"the table is {now.state.value}" + (f" ({now.error})" if now.error else "")
            if now.state is TableState.PAUSED or now.waits_for_operator:
                stuck.add(row.oid)
        elif behind.get(row.oid):
            out[row.oid] = f"{behind[row.oid]} staged files before it are not applied yet"
    return out, stuck


def wait_for_target(dsn: str, state: StateStore, rows: list[TableRow], position: int,
                    seconds: float) -> dict[int, str]:
    """Wait until each table's target holds every change committed before ``position``; return the
    tables (oids) that did not within ``seconds``, each with a sentence saying why and what to do.
    A table that cannot get there without the operator (paused, failed for good) is not waited for.

    A heartbeat message moves capture past ``position`` even when the tables are idle.
    """
    deadline = time.monotonic() + seconds
    beat = 0.0
    while True:
        if time.monotonic() >= beat:
            with psycopg.connect(dsn, autocommit=True) as conn:
                emit_heartbeat(conn)
            beat = time.monotonic() + 2.0
        behind, stuck = _waiting_for(state, rows, position)
        if set(behind) <= stuck or time.monotonic() >= deadline:
            return {oid: (f"the target did not reach the source's position {format_lsn(position)}"
                          f"{'' if oid in stuck else f' within {seconds:g} s'} ({why}): verify compares a running"
                          " pipeline; start `headrace run`, resume the table, or wait longer with --wait")
                    for oid, why in behind.items()}
        time.sleep(0.2)
