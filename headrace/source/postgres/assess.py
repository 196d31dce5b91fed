"""Can a source table be replicated? The catalog side of the assessment ``headrace check``, the API and
adding a table share.

For each table: its key (primary key or replica identity index), replica identity, columns whose
types headrace keeps as text, privileges (SELECT, and ownership to add it to the publication),
and every problem as a sentence that names the table and the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from headrace.core.names import TableName
from headrace.core.schema import TypeKind
from headrace.source.postgres.catalog import (
    find_relation,
    problems_of_table,
    published_oids,
    read_table_schema,
    server_problems,
    table_keys,
)
from headrace.source.postgres.replication import GENERATED_COLUMNS_VERSION
from headrace.source.postgres.types import TypeCatalog

Conn = psycopg.Connection[Any]

REPLICA_IDENTITY = {"d": "default", "n": "nothing", "f": "full", "i": "index"}
_PLAIN_TEXT = ("text", "character varying", "character", "name", "citext", "bpchar", "varchar")



def assess_table(conn: Conn, table: str | TableName, published: set[int], types: TypeCatalog | None = None
                 ) -> dict[str, Any]:
    """What replicating ``table`` would meet; ``ready`` is True when nothing stands in the way.

    ``types`` is the pipeline's (columns it keeps as text are listed as such).
    """
    problems = problems_of_table(conn, table, published)
    row = find_relation(conn, table)
    if row is None:
        return {"table": str(table), "oid": None, "exists": False, "ready": False, "problems": problems}
    oid, schema_name, name, kind, replident, owner = row
    out: dict[str, Any] = {"table": str(TableName(schema_name, name)), "oid": int(oid), "exists": True}
    if kind not in ("r", "p"):
        return {**out, "ready": False, "problems": problems}
    primary, _ = table_keys(conn, oid)
    schema = read_table_schema(conn, TableName(schema_name, name), types)
    as_text = [
        {"column": c.name, "pg_type": c.type.pg_type}
        for c in schema.columns
        if c.type.kind is TypeKind.STRING and not c.type.pg_type.startswith(_PLAIN_TEXT)
    ]
    privileges = conn.execute(
        "SELECT has_table_privilege(%s::oid, 'SELECT'), pg_has_role(%s::oid, 'USAGE')", (oid, owner)
    ).fetchone()
    can_select, is_owner = privileges if privileges else (False, False)
    # Left out of copy and stream alike (catalog._COLUMNS): stored ones before PostgreSQL 18, virtual always.
    not_replicated = [r[0] for r in conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped"
        " AND attgenerated <> '' AND (attgenerated = 'v' OR current_setting('server_version_num')::int < %s)"
        " ORDER BY attnum", (oid, GENERATED_COLUMNS_VERSION)).fetchall()]
    # Declared with dimensions (int[][]): a multi-dimensional value would stop the table (a list holds one).
    multi_dimensional = [r[0] for r in conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped"
        " AND attndims > 1 ORDER BY attnum", (oid,)).fetchall()
        if schema.column(r[0]).type.kind is TypeKind.LIST]  # not those kept as text
    return {
        **out,
        "primary_key": list(primary),
        "replica_identity": REPLICA_IDENTITY.get(replident, replident),
        "key": list(schema.key),
        "columns": len(schema.columns),
        "kept_as_text": as_text,  # no loss: their PostgreSQL text form is stored as a string
        "generated_not_replicated": not_replicated,
        "multi_dimensional_arrays": multi_dimensional,
        "unsupported_columns": [c["column"] for c in as_text if c["pg_type"].startswith("unknown type")],
        "can_select": bool(can_select),
        "can_publish": bool(is_owner) or int(oid) in published,
        "ready": not problems,
        "problems": problems,
    }


def assess(conn: Conn, tables: Sequence[str | TableName], publication: str, types: TypeCatalog | None = None
           ) -> dict[str, Any]:
    """The server's readiness and each table's assessment; ``problems`` lists all of them."""
    server = server_problems(conn)
    published = published_oids(conn, publication)
    assessed = [assess_table(conn, t, published, types) for t in tables]
    return {
        "server_problems": server,
        "tables": assessed,
        "problems": server + [p for t in assessed for p in t["problems"]],
    }
