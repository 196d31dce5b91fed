"""verify's PostgreSQL side: a snapshot a temporary logical slot exports (as the initial copy takes
it), which holds exactly the transactions that committed before the slot's consistent point, the
same boundary the staged log's positions use; and tuple versions (``tableoid:ctid:xmin``) that say
whether a row changed since. The exporting connection closes (dropping the slot) as soon as the
reading transaction has imported the snapshot.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql

from headrace.core.names import quote_ident
from headrace.core.position import format_lsn
from headrace.core.schema import TableSchema, TypeKind
from headrace.source.postgres import catalog
from headrace.source.postgres.replication import SESSION_OPTIONS, ExportedSnapshot, emit_heartbeat
from headrace.source.postgres.types import TypeCatalog
from headrace.state.store import TableRow
from headrace.verify.canon import Dialect
from headrace.verify.point import SourcePoint
from headrace.verify.sides import Ranges, SourceSide

_VERSION = "tableoid::bigint || ':' || ctid::text || ':' || xmin::text"


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def key_literal(kind: TypeKind, text: str) -> str | None:
    """PostgreSQL SQL for a key column's value from its compared text (None: no way back)."""
    if kind in (TypeKind.TIMESTAMP, TypeKind.TIMESTAMPTZ):
        if not text.lstrip("-").isdigit():
            return _literal(text)  # infinity, -infinity
        epoch = "TIMESTAMPTZ 'epoch'" if kind is TypeKind.TIMESTAMPTZ else "TIMESTAMP 'epoch'"
        return f"({epoch} + {int(text)} * interval '1 microsecond')"
    if kind is TypeKind.BINARY:
        return f"decode({_literal(text)}, 'hex')"
    if kind is TypeKind.LIST:
        return None
    return _literal(text)  # PostgreSQL's own text, or a form its input takes (floats' 15e-1), coerced


class PostgresSide(SourceSide):
    """PostgreSQL on one connection: in a REPEATABLE READ transaction that imported an exported
    snapshot, or (``versions``) as it is now."""

    dialect: Dialect = "postgres"

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def relation(self, table: TableSchema) -> str:
        return f"{quote_ident(table.schema)}.{quote_ident(table.name)}"

    def extra_columns(self) -> list[str]:
        return ["tableoid::bigint", "ctid::text", "xmin::text"]

    def fetch(self, query: str) -> list[tuple[Any, ...]]:
        return self.conn.execute(sql.SQL(query)).fetchall()  # type: ignore[arg-type]

    def key_filter(self, table: TableSchema, ranges: Ranges) -> str:
        return self.keys_in(table, ranges, lambda column, text: key_literal(column.type.kind, text))

    def versions(self, table: TableSchema, ranges: Ranges) -> dict[str, set[str]]:
        return self.versions_of(table, ranges, _VERSION)


class PostgresPoint(SourcePoint):
    """A PostgreSQL source at ``dsn``; ``text_columns`` as the pipeline reads its types."""

    errors = (psycopg.Error,)

    def __init__(self, dsn: str, text_columns: Any) -> None:
        self.dsn = dsn
        self.text_columns = text_columns

    @contextmanager
    def current(self) -> Iterator[SourceSide]:
        with psycopg.connect(self.dsn, autocommit=True, options=SESSION_OPTIONS) as conn:
            yield PostgresSide(conn)

    @contextmanager
    def snapshot(self) -> Iterator[tuple[SourceSide, int]]:
        conn = psycopg.connect(self.dsn, autocommit=True, options=SESSION_OPTIONS)
        try:
            with ExportedSnapshot(self.dsn) as snap:
                conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snap.snapshot_name)))
                position = snap.lsn
            yield PostgresSide(conn), position
        finally:
            conn.close()

    def estimates(self, side: SourceSide, rows: list[TableRow]) -> dict[int, int]:
        assert isinstance(side, PostgresSide)
        found = side.conn.execute("SELECT oid::bigint, greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = ANY(%s)",
                                  ([r.oid for r in rows],)).fetchall()
        return {int(o): int(n) for o, n in found}

    def shape(self, side: SourceSide, row: TableRow) -> TableSchema:
        assert isinstance(side, PostgresSide)
        return catalog.read_table_schema(side.conn, row.oid, TypeCatalog(side.conn, self.text_columns))

    def heartbeat(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            emit_heartbeat(conn)

    def format_position(self, position: int) -> str:
        return format_lsn(position)

