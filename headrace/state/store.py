"""The state store: coordination tables in the ``_headrace`` schema of a PostgreSQL database.

Everything a restart needs lives here: the pipeline's identity and captured position, each table's
lifecycle state, the staged log's index, and each table's materializer cursor. All writes that
must agree with each other happen in one transaction (e.g. registering staged files together with
the captured position).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from headrace.core.schema import TableSchema, schema_from_dict, schema_to_dict
from headrace.state.lifecycle import TableState

DDL = """
CREATE SCHEMA IF NOT EXISTS _headrace;
CREATE TABLE IF NOT EXISTS _headrace.pipeline_meta (
    pipeline          text PRIMARY KEY,
    system_identifier text NOT NULL,
    slot_name         text NOT NULL,
    publication       text NOT NULL,
    captured_lsn      bigint NOT NULL DEFAULT 0,  -- end LSN of the last transaction in the log
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS _headrace.tables (
    pipeline      text NOT NULL,
    table_oid     bigint NOT NULL,
    schema_name   text NOT NULL,
    table_name    text NOT NULL,
    state         text NOT NULL,
    resume_state  text,               -- state to return to after ERRORED or PAUSED
    snapshot_lsn  bigint,
    applied_lsn   bigint,
    rows_copied   bigint NOT NULL DEFAULT 0,
    rows_applied  bigint NOT NULL DEFAULT 0,
    error         text,
    error_count   integer NOT NULL DEFAULT 0,
    retry_at      timestamptz,
    table_schema  jsonb NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, table_oid)
);
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
CREATE INDEX IF NOT EXISTS log_index_table ON _headrace.log_index (pipeline, table_oid, log_offset);
-- Highest position this pipeline may have confirmed to its slot: at least captured_lsn, and the
-- stream's wal_end when psycopg2 forwarded the confirmation past idle WAL. A slot beyond it was
-- advanced by someone else.
ALTER TABLE _headrace.pipeline_meta ADD COLUMN IF NOT EXISTS acked_lsn bigint NOT NULL DEFAULT 0;
-- Schema changes and table events applied to targets (add_column, drop_table, ...): status and audit.
CREATE TABLE IF NOT EXISTS _headrace.ddl_events (
    pipeline    text NOT NULL,
    table_oid   bigint NOT NULL,
    table_name  text NOT NULL,
    kind        text NOT NULL,
    detail      text NOT NULL,
    lsn         bigint,
    applied_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS ddl_events_pipeline ON _headrace.ddl_events (pipeline, applied_at);
CREATE TABLE IF NOT EXISTS _headrace.mat_cursor (
    pipeline    text NOT NULL,
    table_oid   bigint NOT NULL,
    log_offset  bigint NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, table_oid)
);
-- Tables found by discovery (source.schemas / all_tables) that cannot be replicated, and why.
-- Not tracked; assessed again at each discovery pass, so fixing the table gets it replicated.
CREATE TABLE IF NOT EXISTS _headrace.refused_tables (
    pipeline    text NOT NULL,
    table_oid   bigint NOT NULL,
    table_name  text NOT NULL,
    reason      text NOT NULL,
    seen_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, table_oid)
);
-- What an ERRORED table's error is (transient, terminal, unknown) and what fixes it (status, readyz).
ALTER TABLE _headrace.tables ADD COLUMN IF NOT EXISTS error_kind text;
ALTER TABLE _headrace.tables ADD COLUMN IF NOT EXISTS error_fix text;
"""


@dataclass(frozen=True)
class TableRow:
    """One replicated table's row in ``_headrace.tables``."""

    oid: int
    schema: TableSchema
    state: TableState
    resume_state: TableState | None
    snapshot_lsn: int | None
    applied_lsn: int | None
    rows_copied: int
    rows_applied: int
    error: str | None
    error_count: int
    retry_at: datetime | None
    error_kind: str | None = None  # transient, terminal or unknown (headrace.materialize.failure)
    error_fix: str | None = None  # the command or change that fixes a terminal error

    @property
    def qualified_name(self) -> str:
        return self.schema.qualified_name

    @property
    def waits_for_operator(self) -> bool:
        """ERRORED with no retry planned: only an operator's resume or resync brings it back."""
        return self.state is TableState.ERRORED and self.retry_at is None


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


class StateStore:
    """Reads and writes the ``_headrace`` tables of one pipeline. Not thread-safe: one per thread."""

    def __init__(self, dsn: str, pipeline: str) -> None:
        self.pipeline = pipeline
        self._dsn = dsn
        self._conn = self._connect()

    @property
    def conn(self) -> psycopg.Connection[dict[str, Any]]:
        """The connection, opened again if the server dropped the last one (a restart, a failover).

        The call that met the drop has failed already; reconnecting on the next use lets the run
        carry on with the same store once the server answers (``headrace.outage``).
        """
        if self._conn.broken:
            self._conn.close()
            self._conn = self._connect()
        return self._conn

    def _connect(self) -> psycopg.Connection[dict[str, Any]]:
        conn = psycopg.connect(self._dsn, autocommit=True, row_factory=dict_row)
        # A registration lost in a crash of the state server, after the slot was confirmed past it,
        # would lose changes: state commits are durable even where the server's default is not.
        conn.execute("SET synchronous_commit = on")
        return conn

    def close(self) -> None:
        self._conn.close()

    def install(self) -> None:
        """Create the state schema if missing (idempotent)."""
        with self.conn.transaction():
            self.conn.execute("SELECT pg_advisory_xact_lock(hashtext('_headrace.install'))")
            self.conn.execute(DDL)

    def installed(self) -> bool:
        row = self.conn.execute("SELECT to_regclass('_headrace.pipeline_meta') AS r").fetchone()
        return bool(row and row["r"])

    # -- pipeline -------------------------------------------------------------------------------
    def meta(self) -> dict[str, Any] | None:
        return self.conn.execute(
            "SELECT * FROM _headrace.pipeline_meta WHERE pipeline = %s", (self.pipeline,)
        ).fetchone()

    def ensure_meta(self, system_identifier: str, slot: str, publication: str, captured_lsn: int) -> None:
        self.conn.execute(
            "INSERT INTO _headrace.pipeline_meta (pipeline, system_identifier, slot_name, publication,"
            " captured_lsn, acked_lsn) VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (pipeline) DO NOTHING",
            (self.pipeline, system_identifier, slot, publication, captured_lsn, captured_lsn),
        )

    def captured_lsn(self) -> int:
        meta = self.meta()
        return int(meta["captured_lsn"]) if meta else 0

    def register(self, files: list[StagedFile], captured_lsn: int, acked_lsn: int = 0) -> list[int]:
        """Register staged files and the captured position in one transaction; return offsets.

        ``acked_lsn`` is the most the slot is about to be confirmed to (recorded before it is).
        """
        offsets = []
        with self.conn.transaction():
            for f in files:
                row = self.conn.execute(
                    "INSERT INTO _headrace.log_index (pipeline, table_oid, path, rows, bytes, min_lsn,"
                    " max_lsn, table_schema) VALUES (%s,%s,%s,%s,%s,%s,%s,%s) RETURNING log_offset",
                    (self.pipeline, f.table_oid, f.path, f.rows, f.bytes, f.min_lsn, f.max_lsn,
                     json.dumps(schema_to_dict(f.schema))),
                ).fetchone()
                assert row is not None
                offsets.append(int(row["log_offset"]))
            self.conn.execute(
                "UPDATE _headrace.pipeline_meta SET captured_lsn = greatest(captured_lsn, %s),"
                " acked_lsn = greatest(acked_lsn, %s, %s), updated_at = now() WHERE pipeline = %s",
                (captured_lsn, captured_lsn, acked_lsn, self.pipeline),
            )
        return offsets

    # -- tables ---------------------------------------------------------------------------------
    def tables(self) -> list[TableRow]:
        rows = self.conn.execute(
            "SELECT * FROM _headrace.tables WHERE pipeline = %s ORDER BY schema_name, table_name",
            (self.pipeline,),
        ).fetchall()
        return [_table_row(r) for r in rows]

    def table(self, oid: int) -> TableRow | None:
        row = self.conn.execute(
            "SELECT * FROM _headrace.tables WHERE pipeline = %s AND table_oid = %s", (self.pipeline, oid)
        ).fetchone()
        return _table_row(row) if row else None

    def add_table(self, schema: TableSchema) -> None:
        """Start tracking a table in PENDING (no-op if it is tracked already)."""
        self.conn.execute(
            "INSERT INTO _headrace.tables (pipeline, table_oid, schema_name, table_name, state, table_schema)"
            " VALUES (%s,%s,%s,%s,%s,%s) ON CONFLICT DO NOTHING",
            (self.pipeline, schema.oid, schema.schema, schema.name, TableState.PENDING.value,
             json.dumps(schema_to_dict(schema))),
        )

    def set_schema(self, schema: TableSchema) -> None:
        self.conn.execute(
            "UPDATE _headrace.tables SET table_schema = %s, schema_name = %s, table_name = %s,"
            " updated_at = now() WHERE pipeline = %s AND table_oid = %s",
            (json.dumps(schema_to_dict(schema)), schema.schema, schema.name, self.pipeline, schema.oid),
        )

    def set_state(self, oid: int, state: TableState, **fields: Any) -> None:
        """Move a table to ``state``, updating any other columns given (e.g. snapshot_lsn=...)."""
        allowed = {"snapshot_lsn", "applied_lsn", "rows_copied", "error", "error_count", "retry_at",
                   "resume_state", "error_kind", "error_fix"}
        unknown = set(fields) - allowed
        if unknown:
            raise ValueError(f"unknown table fields {unknown}")
        if "error" in fields and fields["error"] is None:  # a cleared error takes its kind and fix along
            fields = {"error_kind": None, "error_fix": None, **fields}
        sets = ["state = %s", "updated_at = now()"]
        params: list[Any] = [state.value]
        for name, value in fields.items():
            sets.append(f"{name} = %s")
            params.append(value.value if isinstance(value, TableState) else value)
        params += [self.pipeline, oid]
        self.conn.execute(
            f"UPDATE _headrace.tables SET {', '.join(sets)} WHERE pipeline = %s AND table_oid = %s", params
        )

    # -- schema change events -------------------------------------------------------------------
    def record_ddl(self, oid: int, table: str, kind: str, detail: str, lsn: int | None = None) -> None:
        """Note a schema change or table event applied to the target (``kind`` as in metrics)."""
        self.conn.execute(
            "INSERT INTO _headrace.ddl_events (pipeline, table_oid, table_name, kind, detail, lsn)"
            " VALUES (%s,%s,%s,%s,%s,%s)",
            (self.pipeline, oid, table, kind, detail, lsn),
        )

    def ddl_counts(self) -> dict[str, int]:
        """How many schema change events of each kind this pipeline applied."""
        rows = self.conn.execute(
            "SELECT kind, count(*) AS n FROM _headrace.ddl_events WHERE pipeline = %s GROUP BY kind",
            (self.pipeline,),
        ).fetchall()
        return {r["kind"]: int(r["n"]) for r in rows}

    def recent_ddl(self, limit: int = 20) -> list[dict[str, Any]]:
        """The latest schema change events, newest first."""
        return self.conn.execute(
            "SELECT table_name, kind, detail, lsn, applied_at FROM _headrace.ddl_events WHERE pipeline = %s"
            " ORDER BY applied_at DESC LIMIT %s",
            (self.pipeline, limit),
        ).fetchall()

    # -- tables discovery refused ---------------------------------------------------------------
    def refuse_table(self, oid: int, table: str, reason: str) -> bool:
        """Note that discovery refused a table; True when this is news (new table or new reason)."""
        row = self.conn.execute(
            "INSERT INTO _headrace.refused_tables (pipeline, table_oid, table_name, reason) VALUES (%s,%s,%s,%s)"
            " ON CONFLICT (pipeline, table_oid) DO UPDATE SET table_name = excluded.table_name,"
            " reason = excluded.reason, seen_at = now()"
            " WHERE (refused_tables.table_name, refused_tables.reason) IS DISTINCT FROM"
            " (excluded.table_name, excluded.reason) RETURNING table_oid",
            (self.pipeline, oid, table, reason),
        ).fetchone()
        return row is not None

    def forget_refused(self, keep: set[int]) -> None:
        """Drop refusal notes of tables not in ``keep`` (replicated now, or gone from the source)."""
        self.conn.execute("DELETE FROM _headrace.refused_tables WHERE pipeline = %s AND NOT table_oid = ANY(%s)",
                          (self.pipeline, list(keep)))

    def refused_tables(self) -> list[dict[str, Any]]:
        """Tables discovery found but cannot replicate: table, oid, reason, seen_at."""
        exists = self.conn.execute("SELECT to_regclass('_headrace.refused_tables') AS r").fetchone()
        if not (exists and exists["r"]):
            return []  # state installed by an older headrace; the next run adds the table
        return self.conn.execute(
            "SELECT table_name AS table, table_oid AS oid, reason, seen_at FROM _headrace.refused_tables"
            " WHERE pipeline = %s ORDER BY table_name", (self.pipeline,)).fetchall()

    # -- staged log and cursors -----------------------------------------------------------------
    def cursor(self, oid: int) -> int:
        row = self.conn.execute(
            "SELECT log_offset FROM _headrace.mat_cursor WHERE pipeline = %s AND table_oid = %s",
            (self.pipeline, oid),
        ).fetchone()
        return int(row["log_offset"]) if row else 0

    def log_entries(self, oid: int, after: int, limit: int) -> list[LogEntry]:
        rows = self.conn.execute(
            "SELECT * FROM _headrace.log_index WHERE pipeline = %s AND table_oid = %s AND log_offset > %s"
            " ORDER BY log_offset LIMIT %s",
            (self.pipeline, oid, after, limit),
        ).fetchall()
        return [
            LogEntry(int(r["log_offset"]), int(r["table_oid"]), r["path"], int(r["rows"]), int(r["min_lsn"]),
                     int(r["max_lsn"]), schema_from_dict(r["table_schema"]))
            for r in rows
        ]

    def log_entries_through(self, oid: int, through: int, count: int) -> list[LogEntry]:
        """The last ``count`` entries of the table at or below offset ``through``, oldest first."""
        rows = self.conn.execute(
            "SELECT * FROM _headrace.log_index WHERE pipeline = %s AND table_oid = %s AND log_offset <= %s"
            " ORDER BY log_offset DESC LIMIT %s",
            (self.pipeline, oid, through, count),
        ).fetchall()
        return [
            LogEntry(int(r["log_offset"]), int(r["table_oid"]), r["path"], int(r["rows"]), int(r["min_lsn"]),
                     int(r["max_lsn"]), schema_from_dict(r["table_schema"]))
            for r in reversed(rows)
        ]

    def remove_table(self, oid: int) -> None:
        """Stop tracking a table: its state row, cursor and staged-log entries go (files stay)."""
        with self.conn.transaction():
            for table in ("tables", "mat_cursor", "log_index"):
                self.conn.execute(
                    f"DELETE FROM _headrace.{table} WHERE pipeline = %s AND table_oid = %s", (self.pipeline, oid)
                )

    def last_offset(self, oid: int, before_lsn: int | None = None) -> int:
        """The table's newest log offset (only entries holding changes before ``before_lsn``, if given)."""
        row = self.conn.execute(
            "SELECT max(log_offset) AS m FROM _headrace.log_index WHERE pipeline = %s AND table_oid = %s"
            " AND (%s::bigint IS NULL OR min_lsn < %s::bigint)",
            (self.pipeline, oid, before_lsn, before_lsn),
        ).fetchone()
        return int(row["m"]) if row and row["m"] is not None else 0

    def advance(self, oid: int, log_offset: int, applied_lsn: int, rows: int) -> None:
        """Record that the table's target holds everything up to ``log_offset``."""
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

    def registered_paths(self) -> set[str]:
        """Paths of every staged file in the pipeline's log."""
        rows = self.conn.execute("SELECT path FROM _headrace.log_index WHERE pipeline = %s", (self.pipeline,))
        return {r["path"] for r in rows.fetchall()}

    def collect_entries(self, oid: int, through: int) -> list[str]:
        """Drop the table's log entries at or below offset ``through``; return their file paths.

        The rows go first (committed here), the files after, by the caller: a crash in between
        leaves unregistered files, which the orphan sweep at capture start removes.
        """
        rows = self.conn.execute(
            "DELETE FROM _headrace.log_index WHERE pipeline = %s AND table_oid = %s AND log_offset <= %s"
            " RETURNING path",
            (self.pipeline, oid, through),
        ).fetchall()
        return [r["path"] for r in rows]

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


def _table_row(r: dict[str, Any]) -> TableRow:
    return TableRow(
        oid=int(r["table_oid"]),
        schema=schema_from_dict(r["table_schema"]),
        state=TableState(r["state"]),
        resume_state=TableState(r["resume_state"]) if r["resume_state"] else None,
        snapshot_lsn=r["snapshot_lsn"],
        applied_lsn=r["applied_lsn"],
        rows_copied=int(r["rows_copied"]),
        rows_applied=int(r["rows_applied"]),
        error=r["error"],
        error_count=int(r["error_count"]),
        retry_at=r["retry_at"],
        error_kind=r.get("error_kind"),
        error_fix=r.get("error_fix"),
    )
