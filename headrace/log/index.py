"""The log index: which staged files hold a table's changes, in log order, and how far each table applied.

Rows of ``_headrace.log_index`` name staged files (by their location in the staging store) with a
global, increasing ``log_offset``; ``_headrace.mat_cursor`` holds each table's applied offset.
Registering files and the captured position is one transaction: a flush is in the log whole or
not at all, and the slot is confirmed only after it is.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from headrace.core.schema import TableSchema, schema_from_dict, schema_to_dict
from headrace.log.facts import FileFacts

DDL = """
CREATE SEQUENCE IF NOT EXISTS _headrace.log_seq;
CREATE TABLE IF NOT EXISTS _headrace.log_index (
    pipeline     text NOT NULL,
    log_offset   bigint NOT NULL DEFAULT nextval('_headrace.log_seq'),
    table_oid    bigint NOT NULL,
    path         text NOT NULL,
    rows         integer NOT NULL,
    bytes        bigint NOT NULL,
    min_lsn      bigint NOT NULL,
    max_lsn      bigint NOT NULL,
    table_schema jsonb NOT NULL,     -- the table's columns as the rows in the file were written
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, log_offset)
);
-- What capture knew about the file's rows (headrace.log.facts); NULL for files registered before.
ALTER TABLE _headrace.log_index ADD COLUMN IF NOT EXISTS facts jsonb;
CREATE INDEX IF NOT EXISTS log_index_table ON _headrace.log_index (pipeline, table_oid, log_offset);
CREATE TABLE IF NOT EXISTS _headrace.mat_cursor (
    pipeline    text NOT NULL,
    table_oid   bigint NOT NULL,
    log_offset  bigint NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, table_oid)
);
"""

Connection = psycopg.Connection[dict[str, Any]]


@dataclass(frozen=True)
class LogEntry:
    """A staged file registered in the log."""

    offset: int
    table_oid: int
    path: str
    rows: int
    min_lsn: int
    max_lsn: int
    schema: TableSchema
    facts: FileFacts | None = None  # None: registered by a version that did not record them


@dataclass(frozen=True)
class StagedFile:
    """A staged file written by capture, about to be registered."""

    table_oid: int
    path: str
    rows: int
    bytes: int
    min_lsn: int
    max_lsn: int
    schema: TableSchema
    facts: FileFacts | None = None  # what capture knew of the rows (the materializer then needs no scan)


class LogIndex:
    """The staged log's index of one pipeline, over the state store's connection.

    ``connection`` returns the (possibly reopened) connection each time: the index shares the
    state store's, so a registration and the table state it touches commit together.
    """

    def __init__(self, connection: Callable[[], Connection], pipeline: str) -> None:
        self.pipeline = pipeline
        self._connection = connection

    @property
    def conn(self) -> Connection:
        return self._connection()

    # -- capture --------------------------------------------------------------------------------
    def register(self, files: list[StagedFile], captured_lsn: int, acked_lsn: int = 0,
                 token: str | None = None) -> list[int]:
        """Register staged files and the captured position in one transaction; return offsets.

        ``acked_lsn`` is the most the slot is about to be confirmed to (recorded before it is);
        ``token`` the source's resume token at ``captured_lsn`` (``Commit.token``), kept with it.
        """
        offsets = []
        with self.conn.transaction():
            for f in files:
                row = self.conn.execute(
                    "INSERT INTO _headrace.log_index (pipeline, table_oid, path, rows, bytes, min_lsn,"
                    " max_lsn, table_schema, facts) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s) RETURNING log_offset",
                    (self.pipeline, f.table_oid, f.path, f.rows, f.bytes, f.min_lsn, f.max_lsn,
                     json.dumps(schema_to_dict(f.schema)), None if f.facts is None else json.dumps(f.facts.to_json())),
                ).fetchone()
                assert row is not None
                offsets.append(int(row["log_offset"]))
            self.conn.execute(
                "UPDATE _headrace.pipeline_meta SET captured_lsn = greatest(captured_lsn, %s),"
                " captured_token = CASE WHEN %s > captured_lsn THEN %s::text"
                " WHEN %s = captured_lsn THEN coalesce(%s::text, captured_token) ELSE captured_token END,"
                " acked_lsn = greatest(acked_lsn, %s, %s), updated_at = now() WHERE pipeline = %s",
                (captured_lsn, captured_lsn, token, captured_lsn, token, captured_lsn, acked_lsn, self.pipeline),
            )
        return offsets

    def registered_paths(self) -> set[str]:
        """Locations of every staged file in the pipeline's log."""
        rows = self.conn.execute("SELECT path FROM _headrace.log_index WHERE pipeline = %s", (self.pipeline,))
        return {r["path"] for r in rows.fetchall()}

    # -- reading --------------------------------------------------------------------------------
    def entries(self, oid: int, after: int, limit: int, through: int | None = None) -> list[LogEntry]:
        """The table's first ``limit`` entries after offset ``after`` (and at most ``through``), oldest first."""
        rows = self.conn.execute(
            "SELECT * FROM _headrace.log_index WHERE pipeline = %s AND table_oid = %s AND log_offset > %s"
            " AND (%s::bigint IS NULL OR log_offset <= %s::bigint) ORDER BY log_offset LIMIT %s",
            (self.pipeline, oid, after, through, through, limit),
        ).fetchall()
        return [_entry(r) for r in rows]

    def flush_bounds(self, offset: int) -> tuple[int, int]:
        """The first and last offsets of the flush that registered ``offset``: one registering
        transaction, so one ``created_at`` (its ``now()``). Whole flushes hold whole source
        transactions, so every table's entries up to a flush's last offset are a consistent cut."""
        row = self.conn.execute(
            "SELECT min(log_offset) AS lo, max(log_offset) AS hi FROM _headrace.log_index WHERE pipeline = %s"
            " AND created_at = (SELECT created_at FROM _headrace.log_index WHERE pipeline = %s AND log_offset = %s)",
            (self.pipeline, self.pipeline, offset),
        ).fetchone()
        if row is None or row["lo"] is None:
            return offset, offset
        return int(row["lo"]), int(row["hi"])

    def entries_through(self, oid: int, through: int, count: int) -> list[LogEntry]:
        """The last ``count`` entries of the table at or below offset ``through``, oldest first."""
        rows = self.conn.execute(
            "SELECT * FROM _headrace.log_index WHERE pipeline = %s AND table_oid = %s AND log_offset <= %s"
            " ORDER BY log_offset DESC LIMIT %s",
            (self.pipeline, oid, through, count),
        ).fetchall()
        return [_entry(r) for r in reversed(rows)]

    def last_offset(self, oid: int, before_lsn: int | None = None) -> int:
        """The table's newest log offset (only entries holding changes before ``before_lsn``, if given)."""
        row = self.conn.execute(
            "SELECT max(log_offset) AS m FROM _headrace.log_index WHERE pipeline = %s AND table_oid = %s"
            " AND (%s::bigint IS NULL OR min_lsn < %s::bigint)",
            (self.pipeline, oid, before_lsn, before_lsn),
        ).fetchone()
        return int(row["m"]) if row and row["m"] is not None else 0

    def tails(self) -> dict[int, int]:
        """Every table's newest log offset, in one query (tables with no entries left out): the run
        loop skips a table whose cursor is at its tail without a query of its own."""
        rows = self.conn.execute(
            "SELECT table_oid, max(log_offset) AS m FROM _headrace.log_index WHERE pipeline = %s GROUP BY table_oid",
            (self.pipeline,),
        ).fetchall()
        return {int(r["table_oid"]): int(r["m"]) for r in rows}

    def pending_totals(self) -> tuple[int, int]:
        """Staged rows and bytes not yet applied, over the tables that are applying changes.

        ERRORED and PAUSED tables are left out: their backlog waits on disk and must not stop the
        other tables' capture.
        """
        row = self.conn.execute(
            "SELECT coalesce(sum(l.rows), 0) AS n, coalesce(sum(l.bytes), 0) AS b FROM _headrace.log_index l"
            " JOIN _headrace.tables t ON t.pipeline = l.pipeline AND t.table_oid = l.table_oid"
            " LEFT JOIN _headrace.mat_cursor c ON c.pipeline = l.pipeline AND c.table_oid = l.table_oid"
            " WHERE l.pipeline = %s AND l.log_offset > coalesce(c.log_offset, 0)"
            " AND t.state NOT IN ('ERRORED', 'PAUSED')",
            (self.pipeline,),
        ).fetchone()
        assert row is not None
        return int(row["n"]), int(row["b"])

    def pending_changes(self) -> dict[int, int]:
        """Staged rows not yet applied, per table."""
        rows = self.conn.execute(
            "SELECT l.table_oid, sum(l.rows) AS n FROM _headrace.log_index l"
            " LEFT JOIN _headrace.mat_cursor c ON c.pipeline = l.pipeline AND c.table_oid = l.table_oid"
            " WHERE l.pipeline = %s AND l.log_offset > coalesce(c.log_offset, 0) GROUP BY l.table_oid",
            (self.pipeline,),
        ).fetchall()
        return {int(r["table_oid"]): int(r["n"]) for r in rows}

    # -- the materializer's cursor --------------------------------------------------------------
    def cursor(self, oid: int) -> int:
        """The table's applied offset as state records it (0: nothing applied)."""
        row = self.conn.execute(
            "SELECT log_offset FROM _headrace.mat_cursor WHERE pipeline = %s AND table_oid = %s",
            (self.pipeline, oid),
        ).fetchone()
        return int(row["log_offset"]) if row else 0

    def advance(self, oid: int, log_offset: int, applied_lsn: int, rows: int) -> None:
        """Record that the table's target holds everything up to ``log_offset`` (and the table's totals)."""
        with self.conn.transaction():
            self.conn.execute(
                "INSERT INTO _headrace.mat_cursor (pipeline, table_oid, log_offset) VALUES (%s,%s,%s)"
                " ON CONFLICT (pipeline, table_oid) DO UPDATE SET log_offset = greatest("
                "_headrace.mat_cursor.log_offset, excluded.log_offset), updated_at = now()",
                (self.pipeline, oid, log_offset),
            )
            self.conn.execute(
                "UPDATE _headrace.tables SET applied_lsn = greatest(coalesce(applied_lsn, 0), %s),"
                " rows_applied = rows_applied + %s, updated_at = now()"
                " WHERE pipeline = %s AND table_oid = %s",
                (applied_lsn, rows, self.pipeline, oid),
            )

    # -- forgetting -----------------------------------------------------------------------------
    def collect_entries(self, oid: int, through: int) -> list[str]:
        """Drop the table's log entries at or below offset ``through``; return their file locations.

        The rows go first (committed here), the files after, by the caller: a crash in between
        leaves unregistered files, which the orphan sweep at capture start removes.
        """
        rows = self.conn.execute(
            "DELETE FROM _headrace.log_index WHERE pipeline = %s AND table_oid = %s AND log_offset <= %s"
            " RETURNING path",
            (self.pipeline, oid, through),
        ).fetchall()
        return [r["path"] for r in rows]

    def forget_table(self, oid: int) -> None:
        """Drop the table's cursor and entries (its files stay; the caller's transaction, if any)."""
        for table in ("mat_cursor", "log_index"):
            self.conn.execute(
                f"DELETE FROM _headrace.{table} WHERE pipeline = %s AND table_oid = %s", (self.pipeline, oid)
            )


def _entry(r: dict[str, Any]) -> LogEntry:
    return LogEntry(int(r["log_offset"]), int(r["table_oid"]), r["path"], int(r["rows"]), int(r["min_lsn"]),
                    int(r["max_lsn"]), schema_from_dict(r["table_schema"]),
                    FileFacts.from_json(r["facts"]) if r.get("facts") is not None else None)
