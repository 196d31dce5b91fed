"""verify's MySQL/MariaDB side: ``START TRANSACTION WITH CONSISTENT SNAPSHOT``, whose binlog position
MariaDB reports (as each chunk of the initial copy takes it, ``source.mysql.copy``); MySQL 8 reports
none, so verify refuses it with the reason.

MySQL shows no row version (PostgreSQL's ``xmin``), so a row's version is its hash: a row read again
after the pin with the same values counts as unchanged. The one case that fools it: a row deleted
and inserted again with exactly the same values between the point and the target's pin, with the
target holding the delete but not the insert; it is then reported missing, and a second run does
not report it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pymysql

from headrace.core.names import quote_ident
from headrace.core.schema import Column, TableSchema
from headrace.source.mysql import catalog
from headrace.source.mysql.connect import connect
from headrace.source.mysql.copy import snapshot_position
from headrace.source.mysql.position import format_position
from headrace.source.mysql.types import base_type
from headrace.state.store import TableRow
from headrace.verify.canon import MYSQL_SESSION, Dialect
from headrace.verify.point import SourcePoint
from headrace.verify.sides import Ranges, SourceSide

# Key columns found again from their compared text by a plain literal (the server coerces it).
_LITERAL_KEYS = frozenset({"tinyint", "smallint", "mediumint", "int", "bigint", "decimal", "char", "varchar",
                           "tinytext", "text", "mediumtext", "longtext", "enum"})


def _string(text: str) -> str:
    """A MySQL string literal (backslashes escape in MySQL's default mode)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "''") + "'"


def key_literal(column: Column, text: str) -> str | None:
    """MySQL SQL for a key column's value from its compared text (None: found by hash alone)."""
    if base_type(column.type) not in _LITERAL_KEYS:
        return None
    return _string(text)


class MySqlSide(SourceSide):
    """MySQL/MariaDB on one pymysql connection, in a consistent-snapshot transaction or (``versions``)
    as it is now."""

    dialect: Dialect = "mysql"

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def relation(self, table: TableSchema) -> str:
        return f"{quote_ident(table.schema)}.{quote_ident(table.name)}"  # ANSI_QUOTES (MYSQL_SESSION)

    def extra_columns(self) -> list[str]:
        return []  # a row's tag is its hash

    def fetch(self, query: str) -> list[tuple[Any, ...]]:
        with self.conn.cursor() as cur:
            cur.execute(query)
            return list(cur.fetchall())

    def key_filter(self, table: TableSchema, ranges: Ranges) -> str:
        return self.keys_in(table, ranges, key_literal)

    def versions(self, table: TableSchema, ranges: Ranges) -> dict[str, set[str]]:
        now: dict[str, set[str]] = {}
        for row in self.rows(table, ranges):
            now.setdefault(row.ident, set()).add(str(row.tag))
        return now


def _session(dsn: str) -> Any:
    conn = connect(dsn)
    with conn.cursor() as cur:
        cur.execute(MYSQL_SESSION)
    return conn


class MySqlPoint(SourcePoint):
    """A MySQL/MariaDB source at ``dsn``, which the pipeline reads as its server of ``epoch`` (the one
    of its captured position: verify compares the server the pipeline reads now)."""

    errors = (pymysql.MySQLError,)

    def __init__(self, dsn: str, epoch: int) -> None:
        self.dsn = dsn
        self.epoch = epoch  # the server's in the pipeline's positions (``source.mysql.position``)

    @contextmanager
    def current(self) -> Iterator[SourceSide]:
        conn = _session(self.dsn)  # autocommit: each statement reads the newest rows
        try:
            yield MySqlSide(conn)
        finally:
            conn.close()

    @contextmanager
    def snapshot(self) -> Iterator[tuple[SourceSide, int]]:
        conn = _session(self.dsn)
        try:
            with conn.cursor() as cur:
                cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
            yield MySqlSide(conn), snapshot_position(conn, self.epoch)
        finally:
            conn.close()

    def estimates(self, side: SourceSide, rows: list[TableRow]) -> dict[int, int]:
        found = dict(((str(db), str(name)), int(n or 0)) for db, name, n in side.fetch(
            "SELECT TABLE_SCHEMA, TABLE_NAME, TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA IN ("
            + ", ".join(_string(r.schema.schema) for r in rows) + ")"))
        return {r.oid: found.get((r.schema.schema, r.schema.name), 0) for r in rows}

    def shape(self, side: SourceSide, row: TableRow) -> TableSchema:
        assert isinstance(side, MySqlSide)
        return catalog.read_table_schema(side.conn, row.schema.schema, row.schema.name)

    def heartbeat(self) -> None:
        pass  # the server's own heartbeat events move the stream's position

    def format_position(self, position: int) -> str:
        return format_position(position)
