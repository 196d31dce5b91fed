"""What a MySQL/MariaDB source's catalog says: tables, their schemas, and a table's identity.

A table is ``database.table`` (``TableName.schema`` is the database). MySQL has no table OID: a
table's identity (``TableSchema.oid``) is ``table_id``, a stable 63-bit hash of its database and
name. It survives server restarts and is the same in every process; a table renamed later keeps
the id of its first name, and a table dropped and created again is told apart by the binlog
stream (``identity.py``), not by the catalog (docs/mysql.md, Schema changes).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from headrace.core.errors import SourceError
from headrace.core.names import TableName
from headrace.core.schema import Column, TableSchema
from headrace.source.mysql.types import added_column_fill, binlog_column_type, column_type

Conn = Any  # a pymysql connection (connect.connect)


def table_id(database: str, table: str) -> int:
    """The identity of ``database.table``: the first 63 bits of its BLAKE2b hash (a positive int64)."""
    digest = hashlib.blake2b(f"{database}\0{table}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def list_tables(conn: Conn, databases: Sequence[str]) -> list[TableName]:
    """The base tables (no views) of ``databases``, sorted."""
    if not databases:
        return []
    marks = ", ".join(["%s"] * len(databases))
    with conn.cursor() as cur:
        cur.execute("SELECT table_schema, table_name FROM information_schema.tables"
                    f" WHERE table_type = 'BASE TABLE' AND table_schema IN ({marks})"
                    " ORDER BY table_schema, table_name", tuple(databases))
        return [TableName(s, n) for s, n in cur.fetchall()]


_COLUMNS = """
SELECT column_name, data_type, column_type, numeric_precision, numeric_scale, datetime_precision,
       character_maximum_length, is_nullable, column_default, extra, ordinal_position
FROM information_schema.columns WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position
"""

_PRIMARY_KEY = """
SELECT column_name FROM information_schema.statistics
WHERE table_schema = %s AND table_name = %s AND index_name = 'PRIMARY' ORDER BY seq_in_index
"""


def read_table_schema(conn: Conn, database: str, table: str) -> TableSchema:
    """The schema of ``database.table`` as the catalog has it now.

    ``key`` is the primary key; a table without one has ``key=()`` and ``replica_identity="f"`` (the
    binlog carries whole rows, so every column identifies a row, as under REPLICA IDENTITY FULL).
    Raises SourceError if the table does not exist.
    """
    with conn.cursor() as cur:
        cur.execute(_COLUMNS, (database, table))
        rows = cur.fetchall()
        if not rows:
            raise SourceError(f"table {TableName(database, table)} does not exist: create it or fix the table list")
        cur.execute(_PRIMARY_KEY, (database, table))
        key = tuple(r[0] for r in cur.fetchall())
    # A column's id (attnum) is its ORDINAL_POSITION here; the binlog stream keeps it across renames
    # (identity.py), and gives a table it first sees the same ids.
    columns = tuple(
        Column(name, column_type(data_type, col_type, precision, scale, dt_precision, length), 0, -1,
               nullable == "YES", int(ordinal))
        for name, data_type, col_type, precision, scale, dt_precision, length, nullable, _default, _extra, ordinal
        in rows
    )
    fills = {r[0]: (r[8], str(r[9] or "")) for r in rows}
    shape = TableSchema(table_id(database, table), database, table, columns, key, "d" if key else "f")
    return with_fills(shape, fills)


def with_fills(shape: TableSchema, defaults: dict[str, tuple[str | None, str]]) -> TableSchema:
    """``shape`` with each column's ``missing``: the value MySQL gives existing rows when the column is
    added (its default; a NOT NULL column without one gets the type's implicit default). Columns
    whose fill is an expression (``CURRENT_TIMESTAMP``, ``UUID()``, generated columns) are listed in
    ``extra["unknown_fill"]``: a target cannot know what the existing rows got. ``defaults`` maps a
    column name to its ``information_schema.columns`` ``(COLUMN_DEFAULT, EXTRA)``; columns not in it
    keep no fill."""
    columns, unknown = [], []
    for column in shape.columns:
        if column.name not in defaults:
            columns.append(column)
            continue
        default, extra = defaults[column.name]
        known, text = added_column_fill(column, default, extra)
        if not known:
            unknown.append(column.name)
        columns.append(replace(column, missing=text))
    extra_info = {**shape.extra, "unknown_fill": ",".join(unknown)} if unknown else dict(shape.extra)
    return replace(shape, columns=tuple(columns), extra=extra_info)


def column_defaults(conn: Conn, database: str, table: str) -> dict[str, tuple[str | None, str]]:
    """Column name -> ``(COLUMN_DEFAULT, EXTRA)`` of ``database.table`` as the catalog has it now."""
    with conn.cursor() as cur:
        cur.execute("SELECT column_name, column_default, extra FROM information_schema.columns"
                    " WHERE table_schema = %s AND table_name = %s", (database, table))
        return {name: (default, str(extra or "")) for name, default, extra in cur.fetchall()}


def fixed_binary_types(conn: Conn, database: str, table: str) -> dict[str, str]:
    """Column name -> ``uuid``/``inet4``/``inet6`` for ``database.table``'s columns of MariaDB's types
    that a TABLE_MAP shows as BINARY(n) (``types.FIXED_BINARY_TYPES``), as the catalog has them now."""
    with conn.cursor() as cur:
        cur.execute("SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = %s"
                    " AND table_name = %s AND data_type IN ('uuid', 'inet4', 'inet6')", (database, table))
        return {str(name): str(data_type).lower() for name, data_type in cur.fetchall()}


def schema_from_table_map(event: Any, declared: Mapping[str, str] | None = None) -> TableSchema:
    """The schema a binlog TABLE_MAP event (``pymysqlreplication.row_event.TableMapEvent``) describes.

    Needs ``binlog_row_metadata=FULL`` on the server: column names, signedness, charsets and the
    primary key come from the event's optional metadata, never from the catalog, which may already
    describe a newer shape than the event's rows. Equals ``read_table_schema`` for the same shape
    (column ids are positions; the stream relabels them, ``identity.Identities.label``). ``declared``
    is ``fixed_binary_types`` of the table: its UUID/INET columns, which the event shows as BINARY(n).
    """
    meta = event.optional_metadata
    names = list(meta.column_name_list)
    if len(names) != len(event.columns):
        raise SourceError(f"binlog TABLE_MAP for {TableName(event.schema, event.table)} carries no column names:"
                          " set binlog_row_metadata = FULL on the server (SET GLOBAL binlog_row_metadata = FULL,"
                          " and in my.cnf)")
    nullable = bytes(event.null_bitmask)
    columns = tuple(
        Column(names[i], binlog_column_type(col, (declared or {}).get(names[i])), 0, -1, bool(nullable[i // 8] & (1 << (i % 8))), i + 1)
        for i, col in enumerate(event.columns)
    )
    positions = list(meta.simple_primary_key_list) or [p for p, _prefix in _prefixed(meta)]
    key = tuple(names[i] for i in positions)
    return TableSchema(table_id(event.schema, event.table), event.schema, event.table, columns, key,
                       "d" if key else "f")


def _prefixed(meta: Any) -> list[tuple[int, int]]:
    """PRIMARY_KEY_WITH_PREFIX as (column index, prefix length) pairs, in key order."""
    raw = meta.primary_keys_with_prefix or {}
    return list(raw.items()) if isinstance(raw, dict) else list(raw)
