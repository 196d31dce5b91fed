"""Each tracked MySQL table's name as the binlog last showed it, kept in state (``_headrace.mysql_table_names``).

A table's id is the hash of its first name (``catalog.table_id``), so after ``RENAME TABLE`` only
state can tell where the table went. Capture stages a schema only with rows: a rename followed by
no row change before a stop would leave state with the old name, and the restarted stream (resuming
past the statement) would never see the table again. So the stream records a table's new name when
it hands capture the rename (before capture can register a position past it), and a copy records the
name it copied (a table dropped and created again); start-up and the next stream read them back.

The same connection holds a session advisory lock (``running_lock``) while the stream is open: a
MySQL replica leaves nothing on the server that says which pipeline reads the binlog (no slot), so
``headrace drop`` / ``reset`` look for this lock in state to refuse a running pipeline.

A record written just before a crash that capture had not registered is harmless: the stream
resumes before the statement and reads the rename again. The rows of this table belong to the
pipeline (column ``pipeline``), so ``headrace drop`` and ``reset`` remove them with the others.
"""

from __future__ import annotations

import zlib
from typing import Any

import psycopg

from headrace.core.names import TableName

DDL = """
CREATE TABLE IF NOT EXISTS _headrace.mysql_table_names (
    pipeline text NOT NULL,
    table_oid bigint NOT NULL,
    schema_name text NOT NULL,
    table_name text NOT NULL,
    position bigint NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, table_oid)
)"""


def running_lock(pipeline: str) -> tuple[int, int]:
    """The advisory lock (two int4 keys) a running stream of ``pipeline`` holds in the state database."""
    digest = zlib.crc32(f"headrace-mysql:{pipeline}".encode())
    return 0x6D79, digest - 2**32 if digest >= 2**31 else digest  # 0x6D79: "my"


def running_pid(conn: psycopg.Connection[Any], pipeline: str) -> int | None:
    """The state server's backend pid of a running stream of ``pipeline`` (its lock), or None."""
    first, second = running_lock(pipeline)
    row = conn.execute("SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = %s::int::oid"
                       " AND objid = %s::int::oid AND objsubid = 2 AND granted AND database ="
                       " (SELECT oid FROM pg_database WHERE datname = current_database())",
                       (first, second)).fetchone()
    return int(_tuple(row)[0]) if row is not None else None


class TableNames:
    """Records tables' names for one pipeline, on its own state connection, which holds the pipeline's
    running lock while the stream is open (``open``)."""

    def __init__(self, state_dsn: str, pipeline: str) -> None:
        self._dsn = state_dsn
        self.pipeline = pipeline
        self._conn: psycopg.Connection[Any] | None = None

    def open(self) -> None:
        """Connect and take the running lock (best effort: a second run of the pipeline does not get it)."""
        if self._conn is None or self._conn.broken:
            self._conn = psycopg.connect(self._dsn, autocommit=True)
            self._conn.execute("SET synchronous_commit = on")
            self._conn.execute("SELECT pg_try_advisory_lock(%s, %s)", running_lock(self.pipeline))

    def record(self, oid: int, name: TableName, position: int) -> None:
        """Table ``oid`` is called ``name`` from binlog ``position`` on (durable when this returns)."""
        self.open()
        assert self._conn is not None
        self._conn.execute(DDL)
        self._conn.execute(
            "INSERT INTO _headrace.mysql_table_names (pipeline, table_oid, schema_name, table_name, position)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (pipeline, table_oid) DO UPDATE SET"
            " schema_name = EXCLUDED.schema_name, table_name = EXCLUDED.table_name, position = EXCLUDED.position,"
            " recorded_at = now()", (self.pipeline, oid, name.schema, name.name, position))

    def recorded(self) -> dict[int, TableName]:
        """The names recorded so far (``recorded_names``), read on this connection (``open`` first)."""
        assert self._conn is not None
        return recorded_names(self._conn, self.pipeline)

    def close(self) -> None:
        """Close the connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def recorded_names(conn: psycopg.Connection[Any], pipeline: str) -> dict[int, TableName]:
    """The names recorded for ``pipeline`` (id -> name); {} before the first record."""
    row = conn.execute("SELECT to_regclass('_headrace.mysql_table_names')").fetchone()
    if row is None or _tuple(row)[0] is None:
        return {}
    rows = conn.execute("SELECT table_oid, schema_name, table_name FROM _headrace.mysql_table_names"
                        " WHERE pipeline = %s", (pipeline,)).fetchall()
    return {int(r[0]): TableName(r[1], r[2]) for r in (_tuple(r) for r in rows)}


def _tuple(row: Any) -> tuple[Any, ...]:
    return tuple(row.values()) if isinstance(row, dict) else tuple(row)
