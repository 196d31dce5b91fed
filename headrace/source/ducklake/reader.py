"""Read a DuckLake table's changes between snapshots (``ducklake_table_changes``) and pinned scans.

The lake is attached to a DuckDB connection the caller owns (the fan-out hub). Routing values are
pushed into DuckDB as an ``IN`` list, so only the rows a group of destinations needs reach Arrow.
Snapshot ids are global to the lake: a range may contain snapshots of other tables, which simply
yield no rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa

from headrace.core.errors import ConfigError, TransientError
from headrace.core.names import quote_ident
from headrace.targets.ducklake.extension import fetch_arrow

INTEGER_TYPES = {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT",
                 "UINTEGER", "UBIGINT"}
STRING_TYPES = {"VARCHAR"}


@dataclass(frozen=True, slots=True)
class SourceColumn:
    """A column of the source table and its DuckDB type."""

    name: str
    type: str


class DuckLakeTableSource:
    """One table of a lake attached as ``alias``."""

    def __init__(self, con: duckdb.DuckDBPyConnection, alias: str, schema: str, table: str) -> None:
        self.con = con
        self.alias = alias
        self.schema = schema
        self.table = table

    @property
    def qualified(self) -> str:
        return f"{self.alias}.{quote_ident(self.schema)}.{quote_ident(self.table)}"

    @property
    def shown(self) -> str:
        return f"{self.schema}.{self.table}"

    def latest_snapshot(self) -> int:
        """The lake's newest snapshot id (each call sees commits made since the last one)."""
        row = self._run(f"SELECT id FROM {self.alias}.current_snapshot()").fetchone()
        assert row is not None
        return int(row[0])

    def columns(self) -> list[SourceColumn]:
        """The table's columns as of now; errors name the table when it is missing."""
        try:
            rows = self.con.execute(f"DESCRIBE {self.qualified}").fetchall()
        except duckdb.CatalogException as exc:
            raise ConfigError(
                f"source table {self.shown} does not exist in the source lake: check source.ducklake.table "
                f"({str(exc).splitlines()[0]})"
            ) from exc
        return [SourceColumn(str(r[0]), str(r[1])) for r in rows]

    def table_exists_at(self, snapshot: int) -> bool:
        """Whether the table existed at ``snapshot`` (seeding scans need it)."""
        try:
            self.con.execute(f"SELECT 1 FROM {self.qualified} AT (VERSION => {int(snapshot)}) LIMIT 0")
        except duckdb.Error:
            return False
        return True

    def changes(self, start: int, end: int, field: str, values: Sequence[str | int]) -> pa.Table:
        """Changes in snapshots ``start..end`` (both inclusive) whose routing value is in ``values``."""
        if not values or start > end:
            return fetch_arrow(self._run(f"SELECT * FROM {self._changes_sql(0, 0)} LIMIT 0"))
        sql = (
            f"SELECT * FROM {self._changes_sql(start, end)} "
            f"WHERE {quote_ident(field)} IN ({', '.join('?' * len(values))})"
        )
        return fetch_arrow(self._run(sql, list(values)))

    def scan(self, snapshot: int, field: str, values: Sequence[str | int]) -> pa.Table:
        """The table's rows at ``snapshot`` whose routing value is in ``values`` (seeding)."""
        sql = (
            f"SELECT * FROM {self.qualified} AT (VERSION => {int(snapshot)}) "
            f"WHERE {quote_ident(field)} IN ({', '.join('?' * len(values))})"
        )
        return fetch_arrow(self._run(sql, list(values)))

    def count_unrouted(self, start: int, end: int, field: str, values: Sequence[str | int]) -> int:
        """Change rows in ``start..end`` whose routing value is NULL or routes to no destination."""
        if start > end:
            return 0
        self.con.register("hr_routing_values", pa.table({"v": list(values)}) if values else pa.table(
            {"v": pa.array([], pa.string())}))
        try:
            row = self._run(
                f"SELECT count(*) FROM {self._changes_sql(start, end)} "
                f"WHERE {quote_ident(field)} IS NULL OR {quote_ident(field)} NOT IN (SELECT v FROM hr_routing_values)"
            ).fetchone()
        finally:
            self.con.unregister("hr_routing_values")
        return int(row[0]) if row else 0

    def _changes_sql(self, start: int, end: int) -> str:
        return (
            f"ducklake_table_changes('{self.alias}', '{self.schema}', '{self.table}', {int(start)}, {int(end)})"
        )

    def _run(self, sql: str, params: list[Any] | None = None) -> duckdb.DuckDBPyConnection:
        try:
            return self.con.execute(sql, params or [])
        except duckdb.IOException as exc:
            raise TransientError(
                f"reading source table {self.shown} failed: {str(exc).splitlines()[0]}; "
                "check the source catalog is reachable (will retry)"
            ) from exc
