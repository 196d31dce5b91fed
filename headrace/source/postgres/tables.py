"""Which tables the source has, by oid and by name: listing a schema's tables, following oids across
renames and drops, and a partitioned table's leaves. The catalog watch and discovery read these.
"""

from __future__ import annotations

from typing import Any

import psycopg

from headrace.core.names import TableName

Conn = psycopg.Connection[Any]

_SYSTEM_SCHEMAS = ("pg_catalog", "information_schema", "_headrace")

# Partitions are left out: a partitioned table is replicated as one table (its root), and its
# partitions' changes arrive under the root's oid (publish_via_partition_root).
_SCHEMA_TABLES = """
SELECT c.oid::int8, format('%%I.%%I', n.nspname, c.relname), n.nspname, c.relname
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND n.nspname <> ALL(%s) AND n.nspname NOT LIKE 'pg_toast%%' AND n.nspname NOT LIKE 'pg_temp%%'
  AND (%s::text[] IS NULL OR n.nspname = ANY(%s::text[]))
ORDER BY 2
"""


def list_tables(conn: Conn, schemas: list[str] | None) -> dict[int, str]:
    """oid → ``schema.table`` (display form) of every table in ``schemas`` (all non-system ones when None).

    Partitions are not listed (their partitioned root is); nor are headrace's own ``_headrace`` tables.
    """
    rows = conn.execute(_SCHEMA_TABLES, (list(_SYSTEM_SCHEMAS), schemas, schemas)).fetchall()
    return {int(oid): str(TableName(schema, name)) for oid, _quoted, schema, name in rows}


def existing_oids(conn: Conn, oids: list[int]) -> set[int]:
    """Those of ``oids`` that still name a relation in ``pg_class`` (a dropped table's oid is gone)."""
    return {int(oid) for (oid,) in conn.execute(
        "SELECT oid::int8 FROM pg_class WHERE oid = ANY(%s::oid[])", (oids,)).fetchall()}


def leaf_partitions(conn: Conn, oids: list[int]) -> dict[int, dict[int, bool]]:
    """For each partitioned table among ``oids``: leaf partition oid → whether it looks *attached*.

    A partition made by ``CREATE TABLE ... PARTITION OF`` gets its row type (``pg_type``) and its
    ``pg_inherits`` link in one transaction (same xmin) and starts empty, so all its rows reach the
    stream. One made by ``ATTACH PARTITION`` was created earlier (another xmin; ``pg_class`` itself
    is rewritten by the attach, ``pg_type`` is not) and may hold rows that never did; so may every
    leaf under an attached partitioned table. A table created, filled and attached in one
    transaction looks created, and is missed.

    The tree is walked in ``pg_inherits`` under the transaction's snapshot, not with
    ``pg_partition_tree``: that reads the latest catalog, so a partition attached after the
    snapshot was taken would be listed, its link not visible, and it would look created.
    """
    out: dict[int, dict[int, bool]] = {}
    for root, leaf, attached in conn.execute(
        "WITH RECURSIVE tree(root, relid, relkind, attached) AS ("
        " SELECT r.oid, r.oid, r.relkind, false FROM pg_class r WHERE r.oid = ANY(%s::oid[]) AND r.relkind = 'p'"
        " UNION ALL"
        " SELECT t.root, i.inhrelid, c.relkind, t.attached OR i.xmin::text <> ty.xmin::text"
        " FROM tree t JOIN pg_inherits i ON i.inhparent = t.relid JOIN pg_class c ON c.oid = i.inhrelid"
        " JOIN pg_type ty ON ty.oid = c.reltype WHERE t.relkind = 'p')"
        " SELECT root::int8, relid::int8, attached FROM tree WHERE relkind <> 'p'",
        (oids,),
    ).fetchall():
        out.setdefault(int(root), {})[int(leaf)] = bool(attached)
    return out


def current_names(conn: Conn, oids: list[int]) -> list[TableName]:
    """Current names of those of ``oids`` that still exist, in the order given.

    By oid, so a renamed table keeps its place, and a dropped one drops out.
    """
    found = {oid: TableName(schema, name) for oid, schema, name in conn.execute(
        "SELECT c.oid::int8, n.nspname, c.relname FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = ANY(%s::oid[])", (oids,)).fetchall()}
    return [found[oid] for oid in oids if oid in found]


def oid_of(conn: Conn, schema: str, name: str) -> int | None:
    """The oid of the table called ``schema.name``, as the transaction's snapshot sees it.

    A query on ``pg_class``, not ``to_regclass``: that reads the latest catalog, not the snapshot.
    """
    row = conn.execute(
        "SELECT c.oid::int8 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')", (schema, name)).fetchone()
    return int(row[0]) if row else None
