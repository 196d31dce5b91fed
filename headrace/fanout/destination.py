"""Apply one range of routed changes to one destination lake, in one DuckLake transaction.

The transaction deletes keys, inserts rows, and records the source snapshot it brings the table to
in ``_headrace.fanout_applied`` inside the same lake. That row makes the apply idempotent: a range
whose end the lake already holds is skipped, and a lake whose recorded snapshot is past the range's
start is refused (``CursorMismatch``) so the caller re-reads from the right place. The cursor in the
source catalog is advanced only afterwards and may lag; the lake's own row wins.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import duckdb
import pyarrow as pa

from headrace.core.errors import HeadraceError
from headrace.core.names import quote_ident
from headrace.fanout.config import DestinationConfig
from headrace.fanout.cursors import ApplyCounts
from headrace.fanout.planner import DestinationChanges
from headrace.materialize.error_boundary import translate
from headrace.source.ducklake.reader import SourceColumn


class CursorMismatch(HeadraceError):
    """The lake holds a different snapshot than the range starts from; ``applied`` is the lake's."""

    def __init__(self, destination_id: str, applied: int | None, expected: int | None) -> None:
        super().__init__(
            f"destination {destination_id} holds source snapshot {applied}, the range starts at {expected}"
        )
        self.applied = applied


class DestinationLake:
    """The routed table and its applied-snapshot row in one attached destination lake."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        alias: str,
        destination: DestinationConfig,
        pipeline: str,
        columns: Sequence[SourceColumn],
        key_columns: Sequence[str],
    ) -> None:
        self.con = con
        self.alias = alias
        self.destination = destination
        self.pipeline = pipeline
        self.columns = list(columns)
        self.key_columns = list(key_columns)
        lake = destination.ducklake
        self.table = f"{alias}.{quote_ident(lake.schema_name)}.{quote_ident(lake.table_name)}"
        self.marker = f"{alias}._headrace.fanout_applied"

    def ensure(self) -> None:
        """Create the table (source columns and types) and the applied-snapshot table if missing."""
        lake = self.destination.ducklake
        cols = ", ".join(f"{quote_ident(c.name)} {c.type}" for c in self.columns)
        # One transaction: one DuckLake commit instead of four.
        self._run("BEGIN")
        try:
            self._run(f"CREATE SCHEMA IF NOT EXISTS {self.alias}.{quote_ident(lake.schema_name)}")
            self._run(f"CREATE TABLE IF NOT EXISTS {self.table} ({cols})")
            self._run(f"CREATE SCHEMA IF NOT EXISTS {self.alias}._headrace")
            self._run(
                f"CREATE TABLE IF NOT EXISTS {self.marker} (pipeline VARCHAR, destination_id VARCHAR, "
                "source_snapshot BIGINT, updated_at TIMESTAMPTZ)"
            )
            self._run("COMMIT")
        except BaseException:
            with contextlib.suppress(duckdb.Error):
                self.con.execute("ROLLBACK")
            raise

    def applied_snapshot(self) -> int | None:
        """The source snapshot the lake's table is at (None: never seeded)."""
        row = self._run(
            f"SELECT max(source_snapshot) FROM {self.marker} WHERE pipeline = ? AND destination_id = ?",
            [self.pipeline, self.destination.id],
        ).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def apply(
        self, start: int | None, end: int, changes: DestinationChanges, replace_all: bool = False
    ) -> ApplyCounts | None:
        """Bring the table from snapshot ``start`` (None: unseeded) to ``end``; None if already there.

        Deletes first, then inserts; ``replace_all`` (seeding) empties the table first.
        """
        self._run("BEGIN")
        try:
            applied = self.applied_snapshot()
            if applied is not None and applied >= end:
                self._run("ROLLBACK")
                return None
            # Behind ``start`` is fine: the cursor skips ranges with nothing for this lake without
            # a commit here. Ahead of it (or unseeded while the cursor says seeded) is not.
            if (applied is None) != (start is None) or (applied is not None and start is not None
                                                         and applied > start):
                raise CursorMismatch(self.destination.id, applied, start)
            if replace_all:
                self._run(f"DELETE FROM {self.table}")
            if changes.delete_keys.num_rows:
                self._delete(changes.delete_keys)
            if changes.upserts.num_rows:
                self._insert(changes.upserts)
            self._run(
                f"DELETE FROM {self.marker} WHERE pipeline = ? AND destination_id = ?",
                [self.pipeline, self.destination.id],
            )
            self._run(
                f"INSERT INTO {self.marker} VALUES (?, ?, ?, now())", [self.pipeline, self.destination.id, end]
            )
            self._run("COMMIT")
        except BaseException:
            # When COMMIT itself failed, DuckDB has already ended the transaction.
            with contextlib.suppress(duckdb.Error):
                self.con.execute("ROLLBACK")
            raise
        return ApplyCounts(read=changes.rows_read, upserted=changes.upserts.num_rows, deleted=changes.removed)

    def _delete(self, keys: pa.Table) -> None:
        self.con.register("hr_delete_keys", keys)
        try:
            match = " AND ".join(f"t.{quote_ident(k)} = k.{quote_ident(k)}" for k in self.key_columns)
            self._run(f"DELETE FROM {self.table} t USING hr_delete_keys k WHERE {match}")
        finally:
            self.con.unregister("hr_delete_keys")

    def _insert(self, rows: pa.Table) -> None:
        self.con.register("hr_upserts", rows)
        try:
            names = ", ".join(quote_ident(c.name) for c in self.columns)
            self._run(f"INSERT INTO {self.table} ({names}) SELECT {names} FROM hr_upserts")
        finally:
            self.con.unregister("hr_upserts")

    def _run(self, sql: str, params: list[object] | None = None) -> duckdb.DuckDBPyConnection:
        try:
            return self.con.execute(sql, params or [])
        except duckdb.Error as exc:
            # Translated at the boundary as a CDC apply's errors are: transient (IO, conflicts) or
            # terminal (the table's shape, a value, a read-only lake), with its root cause.
            lake = self.destination.ducklake
            raise translate(exc, f"destination {self.destination.id} ({lake.table} in {lake.data_path})") from exc
