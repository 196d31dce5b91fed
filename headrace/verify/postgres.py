"""verify's PostgreSQL side: a snapshot a temporary logical slot exports (as the initial copy takes
it), which holds exactly the transactions that committed before the slot's consistent point, the
same boundary the staged log's positions use; and tuple versions (``tableoid:ctid:xmin``) that say
whether a row changed since. The exporting connection closes (dropping the slot) as soon as the
reading transaction has imported the snapshot.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
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
from headrace.verify.sides import Checksums, Ranges, SourceSide, added

MIN_PART_PAGES = 1024  # 8 MiB: a smaller table is summed in one query
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


def _fetch(conn: psycopg.Connection[Any], query: str) -> list[tuple[Any, ...]]:
    return conn.execute(sql.SQL(query)).fetchall()  # type: ignore[arg-type]


class PostgresSide(SourceSide):
    """PostgreSQL on one connection: in a REPEATABLE READ transaction that imported an exported
    snapshot, or (``versions``) as it is now."""

    dialect: Dialect = "postgres"

    def __init__(self, conn: psycopg.Connection[Any], helpers: tuple[psycopg.Connection[Any], ...] = ()) -> None:
        self.conn = conn
        self.helpers = helpers  # more connections in the same snapshot: a table's checksums in parts

    def checksums(self, table: TableSchema, ranges: Ranges, bits: int) -> Checksums:
        """Checksums in parts of the table's pages (a TID range scan each, on its own connection, at
        once): PostgreSQL computes the row hashes of one query on one core."""
        conns = (self.conn, *self.helpers)
        pages = self._pages(table) if self.helpers else 0
        if pages < len(conns) * MIN_PART_PAGES:
            return super().checksums(table, ranges, bits)
        step = pages // len(conns)
        parts = []
        for i in range(len(conns)):
            low = f"ctid >= '({i * step},0)'::tid"
            high = f" AND ctid < '({(i + 1) * step},0)'::tid" if i < len(conns) - 1 else ""  # the last: to the end
            parts.append(f"(SELECT * FROM {self.relation(table)} WHERE {low}{high}) p")

        def part(i: int) -> Checksums:
            return self.checksums_of(parts[i], table, ranges, bits, functools.partial(_fetch, conns[i]))

        with ThreadPoolExecutor(len(conns), thread_name_prefix="verify-source") as pool:
            return added(list(pool.map(part, range(len(conns)))))

    def _pages(self, table: TableSchema) -> int:
        row = self.conn.execute("SELECT pg_relation_size(%s::regclass) / current_setting('block_size')::int",
                                (self.relation(table),)).fetchone()
        return int(row[0]) if row else 0

    def relation(self, table: TableSchema) -> str:
        return f"{quote_ident(table.schema)}.{quote_ident(table.name)}"

    def extra_columns(self) -> list[str]:
        return ["tableoid::bigint", "ctid::text", "xmin::text"]

    def fetch(self, query: str) -> list[tuple[Any, ...]]:
        return _fetch(self.conn, query)

    def key_filter(self, table: TableSchema, ranges: Ranges) -> str:
        return self.keys_in(table, ranges, lambda column, text: key_literal(column.type.kind, text))

    def versions(self, table: TableSchema, ranges: Ranges) -> dict[str, set[str]]:
        return self.versions_of(table, ranges, _VERSION)


class PostgresPoint(SourcePoint):
    """A PostgreSQL source at ``dsn``; ``text_columns`` as the pipeline reads its types."""

    errors = (psycopg.Error,)

    def __init__(self, dsn: str, text_columns: Any, connections: int = 1) -> None:
        self.dsn = dsn
        self.text_columns = text_columns
        self.connections = connections  # in the snapshot (at most the copy's: snapshot.max_connections)

    @contextmanager
    def current(self) -> Iterator[SourceSide]:
        with psycopg.connect(self.dsn, autocommit=True, options=SESSION_OPTIONS) as conn:
            yield PostgresSide(conn)

    @contextmanager
    def snapshot(self) -> Iterator[tuple[SourceSide, int]]:
        with ExitStack() as stack:
            conns = [stack.enter_context(psycopg.connect(self.dsn, autocommit=True, options=SESSION_OPTIONS))
                     for _ in range(self.connections)]
            with ExportedSnapshot(self.dsn) as snap:
                for conn in conns:
                    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                    conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snap.snapshot_name)))
                position = snap.lsn
            yield PostgresSide(conns[0], tuple(conns[1:])), position

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

