"""Per-destination cursors, kept in the source lake's catalog database.

The rows live in plain tables of the catalog database (DuckDB file or Postgres) next to DuckLake's
own metadata tables, not in a DuckLake table: a cursor write must not create a source snapshot, or
the source would never look caught up. A cursor is advanced only after its destination committed;
the destination lake also records the snapshot it applied (see ``destination.py``), which wins
when the two disagree after a crash.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from headrace.materialize.error_boundary import translate

CURSOR_TABLE = "headrace_fanout_cursor"
INSTANCE_TABLE = "headrace_fanout_instance"


@dataclass(frozen=True, slots=True)
class CursorRow:
    """One destination's progress as stored."""

    destination_id: str
    instance_id: str
    last_snapshot: int
    rows_read: int
    rows_written: int
    rows_upserted: int
    rows_deleted: int
    errors: int
    last_error: str | None
    updated_at: str | None


@dataclass(frozen=True, slots=True)
class ApplyCounts:
    """Rows one apply read and wrote, added to the cursor's running totals."""

    read: int = 0
    upserted: int = 0
    deleted: int = 0

    @property
    def written(self) -> int:
        return self.upserted + self.deleted


class CursorStore:
    """Cursor rows of one pipeline in the catalog database attached as ``__ducklake_metadata_<alias>``."""

    def __init__(self, con: duckdb.DuckDBPyConnection, source_alias: str, pipeline: str) -> None:
        self.con = con
        self.meta = f"__ducklake_metadata_{source_alias}"
        self.pipeline = pipeline

    def ensure(self) -> None:
        """Create the two tables if missing."""
        self._run(
            f"CREATE TABLE IF NOT EXISTS {self.meta}.{CURSOR_TABLE} (pipeline VARCHAR, destination_id VARCHAR, "
            "instance_id VARCHAR, last_snapshot BIGINT, rows_read BIGINT, rows_written BIGINT, "
            "rows_upserted BIGINT, rows_deleted BIGINT, errors BIGINT, last_error VARCHAR, "
            "updated_at TIMESTAMPTZ)"
        )
        self._run(
            f"CREATE TABLE IF NOT EXISTS {self.meta}.{INSTANCE_TABLE} (pipeline VARCHAR, instance_id VARCHAR, "
            "unrouted_rows BIGINT, unrouted_through BIGINT, pool_evictions BIGINT, updated_at TIMESTAMPTZ)"
        )

    def installed(self) -> bool:
        """Whether ``ensure`` ever ran on this catalog."""
        try:
            self.con.execute(f"SELECT 1 FROM {self.meta}.{CURSOR_TABLE} LIMIT 0")
        except duckdb.CatalogException:
            return False
        return True

    def load(self) -> dict[str, CursorRow]:
        """Every cursor of the pipeline, by destination id."""
        rows = self._run(
            "SELECT destination_id, instance_id, last_snapshot, rows_read, rows_written, rows_upserted, "
            f"rows_deleted, errors, last_error, CAST(updated_at AS VARCHAR) FROM {self.meta}.{CURSOR_TABLE} "
            "WHERE pipeline = ?",
            [self.pipeline],
        ).fetchall()
        return {str(r[0]): CursorRow(*r) for r in rows}

    def advance(self, destination_id: str, instance_id: str, snapshot: int, counts: ApplyCounts) -> None:
        """Move the cursor to ``snapshot``, add the counts, clear the last error."""
        updated = self._run(
            f"UPDATE {self.meta}.{CURSOR_TABLE} SET instance_id = ?, last_snapshot = ?, "
            "rows_read = rows_read + ?, rows_written = rows_written + ?, rows_upserted = rows_upserted + ?, "
            "rows_deleted = rows_deleted + ?, last_error = NULL, updated_at = now() "
            "WHERE pipeline = ? AND destination_id = ?",
            [instance_id, snapshot, counts.read, counts.written, counts.upserted, counts.deleted,
             self.pipeline, destination_id],
        ).fetchone()
        if not updated or not updated[0]:
            self._run(
                f"INSERT INTO {self.meta}.{CURSOR_TABLE} VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0, NULL, now())",
                [self.pipeline, destination_id, instance_id, snapshot, counts.read, counts.written,
                 counts.upserted, counts.deleted],
            )

    def record_error(self, destination_id: str, instance_id: str, message: str) -> None:
        """Count a failed attempt and keep its message (the cursor does not move)."""
        updated = self._run(
            f"UPDATE {self.meta}.{CURSOR_TABLE} SET instance_id = ?, errors = errors + 1, last_error = ?, "
            "updated_at = now() WHERE pipeline = ? AND destination_id = ?",
            [instance_id, message[:2000], self.pipeline, destination_id],
        ).fetchone()
        if not updated or not updated[0]:
            # Failed before its first apply: a row with no snapshot yet (-1) carries the error.
            self._run(
                f"INSERT INTO {self.meta}.{CURSOR_TABLE} VALUES (?, ?, ?, -1, 0, 0, 0, 0, 1, ?, now())",
                [self.pipeline, destination_id, instance_id, message[:2000]],
            )

    def load_instance(self, instance_id: str) -> tuple[int, int | None, int]:
        """(unrouted rows, snapshot they were counted through, pool evictions) of an instance."""
        row = self._run(
            f"SELECT unrouted_rows, unrouted_through, pool_evictions FROM {self.meta}.{INSTANCE_TABLE} "
            "WHERE pipeline = ? AND instance_id = ?",
            [self.pipeline, instance_id],
        ).fetchone()
        return (0, None, 0) if row is None else (int(row[0]), None if row[1] is None else int(row[1]), int(row[2]))

    def save_instance(self, instance_id: str, unrouted: int, through: int | None, evictions: int) -> None:
        """Store the instance's running totals."""
        updated = self._run(
            f"UPDATE {self.meta}.{INSTANCE_TABLE} SET unrouted_rows = ?, unrouted_through = ?, "
            "pool_evictions = ?, updated_at = now() WHERE pipeline = ? AND instance_id = ?",
            [unrouted, through, evictions, self.pipeline, instance_id],
        ).fetchone()
        if not updated or not updated[0]:
            self._run(
                f"INSERT INTO {self.meta}.{INSTANCE_TABLE} VALUES (?, ?, ?, ?, ?, now())",
                [self.pipeline, instance_id, unrouted, through, evictions],
            )

    def load_instances(self) -> list[dict[str, object]]:
        """Every instance row of the pipeline (for status)."""
        rows = self._run(
            f"SELECT instance_id, unrouted_rows, unrouted_through, pool_evictions, CAST(updated_at AS VARCHAR) "
            f"FROM {self.meta}.{INSTANCE_TABLE} WHERE pipeline = ? ORDER BY instance_id",
            [self.pipeline],
        ).fetchall()
        keys = ("instance_id", "unrouted_rows", "unrouted_through", "pool_evictions", "updated_at")
        return [dict(zip(keys, r, strict=True)) for r in rows]

    def _run(self, sql: str, params: list[object] | None = None) -> duckdb.DuckDBPyConnection:
        try:
            return self.con.execute(sql, params or [])
        except duckdb.Error as exc:  # the source catalog unreachable (transient) or not writable
            raise translate(exc, "the fan-out cursors in the source catalog") from exc
