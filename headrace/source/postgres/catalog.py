"""What the source's catalog says: table schemas, and whether the server is ready for replication.

All functions take a psycopg 3 connection to the source database and run in its current
transaction, so a caller that imported an exported snapshot reads the schema as of that snapshot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from headrace.core.changes import Relation
from headrace.core.errors import SourceError
from headrace.core.names import ColumnName, TableName, display_ident
from headrace.core.schema import Column, TableSchema
from headrace.source.postgres.types import TypeCatalog

Conn = psycopg.Connection[Any]

# By exact (schema, name): a name is never re-parsed from text by the server (to_regclass would fold
# case, split on dots and fail on anything but valid SQL syntax).
RELATION_SQL = """
SELECT c.oid, n.nspname, c.relname, c.relkind, c.relreplident::text, c.relowner
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s
"""


def find_relation(conn: Conn, table: str | TableName | int) -> tuple[Any, ...] | None:
    """``RELATION_SQL``'s row for ``table`` (a ``TableName``, its SQL spelling or an oid), or None."""
    if isinstance(table, int):
        return conn.execute(RELATION_SQL.replace("n.nspname = %s AND c.relname = %s", "c.oid = %s"),
                            (table,)).fetchone()
    name = table if isinstance(table, TableName) else TableName.parse(table)
    return conn.execute(RELATION_SQL, (name.schema, name.name)).fetchone()


def missing_table(conn: Conn, table: str | TableName | int, fix: str) -> str:
    """The sentence for a table that does not exist, naming same-named tables in another case."""
    if isinstance(table, int):
        return f"table with oid {table} does not exist: {fix}"
    name = table if isinstance(table, TableName) else TableName.parse(table)
    near = [str(TableName(s, n)) for s, n in conn.execute(
        "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE lower(n.nspname) = lower(%s) AND lower(c.relname) = lower(%s) AND c.relkind IN ('r', 'p')"
        " ORDER BY 1, 2", (name.schema, name.name)).fetchall()]
    hint = f" (did you mean {' or '.join(near)}? unquoted names fold to lower case; quote them)" if near else ""
    return f"table {name} does not exist{hint}: {fix}"

# Generated columns are left out before PostgreSQL 18: pgoutput does not send them, and a snapshot
# that copied them would give the target columns the change stream never fills. From 18 on, stored
# generated columns are replicated (the publication sets publish_generated_columns = stored);
# virtual ones (18+) are never published, so never copied.
_COLUMNS = """
SELECT a.attname, a.atttypid, a.atttypmod, NOT a.attnotnull
FROM pg_attribute a
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
  AND (a.attgenerated = '' OR (a.attgenerated = 's' AND current_setting('server_version_num')::int >= 180000))
ORDER BY a.attnum
"""

_KEYS = """
SELECT i.indisprimary, i.indisreplident, array_agg(a.attname ORDER BY k.ord)
FROM pg_index i
CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = %s AND (i.indisprimary OR i.indisreplident) AND k.ord <= i.indnkeyatts
GROUP BY i.indexrelid, i.indisprimary, i.indisreplident
"""


# What the catalog knows of each live column beyond its type: its attnum (identity across renames),
# the value rows older than an ``ADD COLUMN ... DEFAULT`` read (attmissingval, a one-element array),
# and whether it has a default at all.
_ATTRIBUTES = """
SELECT a.attname, a.attnum, CASE WHEN a.atthasmissing THEN (a.attmissingval::text::text[])[1] END,
       d.adbin::text
FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
"""

@dataclass(frozen=True)
class ColumnFacts:
    """A live column's catalog facts (see ``column_facts``)."""

    attnum: int
    missing: str | None  # the value rows older than the column read; None = NULL
    # The catalog cannot say what rows older than the column hold: it has a default but no
    # recorded missing value (a volatile default rewrote the table, or a later rewrite, e.g. an
    # ALTER COLUMN TYPE, folded the value into the rows).
    unknown_fill: bool


def column_facts(conn: Conn, oid: int) -> dict[str, ColumnFacts]:
    """Column name -> facts, for the live columns of table ``oid`` as the catalog has them now."""
    return {
        name: ColumnFacts(int(attnum), missing, missing is None and tree is not None)
        for name, attnum, missing, tree in conn.execute(_ATTRIBUTES, (oid,)).fetchall()
    }


def table_keys(conn: Conn, oid: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(primary key columns, replica identity index columns), each () when there is none."""
    primary: tuple[str, ...] = ()
    replident: tuple[str, ...] = ()
    for is_primary, is_replident, names in conn.execute(_KEYS, (oid,)).fetchall():
        if is_primary:
            primary = tuple(names)
        if is_replident:
            replident = tuple(names)
    return primary, replident


def read_table_schema(conn: Conn, qualified_name: str | TableName | int, types: TypeCatalog | None = None
                      ) -> TableSchema:
    """The schema of table ``qualified_name`` (a ``TableName``, ``schema.table`` in SQL syntax, or an oid).

    Column types resolve through ``types``: pass the pipeline's (``TypeCatalog(conn, as_text)``) so
    columns kept as text are; without it, every column gets its mapped type.

    The key is what identifies a row in the change stream: the REPLICA IDENTITY USING INDEX
    columns when one is set (pgoutput then sends exactly those as the old key), else the primary
    key, else ``()``. Raises ``SourceError`` if the table does not exist.
    """
    row = find_relation(conn, qualified_name)
    if row is None:
        raise SourceError(missing_table(conn, qualified_name, "create it or fix the table list"))
    oid, schema, name, _kind, replident, _owner = row
    types = types or TypeCatalog(conn)
    facts = column_facts(conn, oid)
    table = TableName(schema, name)
    columns = tuple(
        Column(attname, types.column(table, attname, typoid, typmod), typoid, typmod, nullable, facts[attname].attnum,
               facts[attname].missing)
        for attname, typoid, typmod, nullable in conn.execute(_COLUMNS, (oid,)).fetchall()
    )
    primary, replident_index = table_keys(conn, oid)
    key = replident_index if replident == "i" and replident_index else primary
    return TableSchema(oid, schema, name, columns, key, replident)


def relation_to_schema(rel: Relation, types: TypeCatalog, known: TableSchema | None = None,
                       conn: Conn | None = None) -> TableSchema:
    """The schema a pgoutput RELATION message describes.

    The key comes from the columns' key flags, except under REPLICA IDENTITY FULL, where pgoutput
    flags *every* column: then the key is ``known.key`` (the table's primary key, as read by
    ``read_table_schema``) restricted to the columns still present, or ``()`` without ``known``.
    RELATION carries no nullability; it is taken from ``known`` by column name (default nullable).

    With ``conn``, each column's attnum and missing value come from the catalog as it is now (a
    column renamed or dropped since the message was written gets none: it is then matched by
    position). Columns whose older rows' value the catalog cannot tell are listed in
    ``extra["unknown_fill"]``.
    """
    nullable = {c.name: c.nullable for c in known.columns} if known else {}
    facts = column_facts(conn, rel.oid) if conn is not None else {}
    none = ColumnFacts(0, None, False)
    table = TableName(rel.namespace, rel.name)
    columns = tuple(
        Column(c.name, types.column(table, c.name, c.type_oid, c.typmod), c.type_oid, c.typmod, nullable.get(c.name, True),
               facts[c.name].attnum if c.name in facts else None, facts.get(c.name, none).missing)
        for c in rel.columns
    )
    unknown = ",".join(c.name for c in rel.columns if facts.get(c.name, none).unknown_fill)
    if rel.replica_identity == "f":
        present = {c.name for c in rel.columns}
        key = tuple(k for k in known.key if k in present) if known else ()
        if known and len(key) != len(known.key):
            key = ()
    else:
        key = tuple(c.name for c in rel.columns if c.is_key)
    extra = {"unknown_fill": unknown} if unknown else {}
    return TableSchema(rel.oid, rel.namespace, rel.name, columns, key, rel.replica_identity, extra)


def _setting(conn: Conn, name: str) -> str:
    value = conn.execute("SELECT current_setting(%s)", (name,)).fetchone()
    return str(value[0]) if value else ""


def server_problems(conn: Conn) -> list[str]:
    """What the source server lacks for logical replication (empty when ready), each with the fix."""
    from headrace.source.postgres import standby

    problems = []
    if standby.in_recovery(conn):
        problems = standby.server_problems(conn)
        if int(_setting(conn, "server_version_num")) < standby.STANDBY_DECODING_VERSION:
            return problems
    if _setting(conn, "wal_level") != "logical":
        problems.append(
            f"wal_level is {_setting(conn, 'wal_level')}: set wal_level = logical in postgresql.conf and restart"
        )
    version = int(_setting(conn, "server_version_num"))
    if version < 140000:
        problems.append(
            f"PostgreSQL {_setting(conn, 'server_version')} is too old: headrace needs 14 or newer"
        )
    encoding = _setting(conn, "server_encoding")
    if encoding != "UTF8":
        problems.append(
            f"server_encoding is {encoding}: headrace needs a UTF8 database (create it with ENCODING 'UTF8')"
        )
    slots_max = int(_setting(conn, "max_replication_slots"))
    senders_max = int(_setting(conn, "max_wal_senders"))
    used = conn.execute(
        "SELECT (SELECT count(*) FROM pg_replication_slots),"
        " (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender')"
    ).fetchone()
    slots_used, senders_used = used if used else (0, 0)
    if slots_max - slots_used < 1:
        problems.append(
            f"max_replication_slots = {slots_max} and all are in use: raise max_replication_slots in "
            "postgresql.conf and restart, or drop an unused slot (pg_drop_replication_slot)"
        )
    if senders_max - senders_used < 1:
        problems.append(
            f"max_wal_senders = {senders_max} and all are in use: raise max_wal_senders in "
            "postgresql.conf and restart"
        )
    role = conn.execute(
        "SELECT rolname, rolreplication, rolsuper FROM pg_roles WHERE rolname = current_user"
    ).fetchone()
    if role and not (role[1] or role[2]):
        problems.append(
            f"role {role[0]} lacks the REPLICATION attribute: run ALTER ROLE {role[0]} REPLICATION"
        )
    return problems


def problems_of_table(conn: Conn, table: str | TableName, published: set[int]) -> list[str]:
    """Why ``table`` cannot be replicated (empty when it can), each problem naming the fix."""
    row = find_relation(conn, table)
    if row is None:
        return [missing_table(conn, table, "create it or remove it from the table list")]
    oid, schema, name, kind, replident, owner = row
    qualified = str(TableName(schema, name))
    if kind not in ("r", "p"):
        return [f"{qualified} is not a table (relkind {kind}): only tables can be replicated"]
    problems = []
    primary, replident_index = table_keys(conn, oid)
    if replident == "n":
        problems.append(
            f"table {qualified} has REPLICA IDENTITY NOTHING: updates and deletes cannot be replicated;"
            f" run ALTER TABLE {qualified} REPLICA IDENTITY DEFAULT (with a primary key)"
        )
    elif replident == "d" and not primary:
        problems.append(
            f"table {qualified} has no primary key and REPLICA IDENTITY DEFAULT: add a primary key"
            f" or run ALTER TABLE {qualified} REPLICA IDENTITY FULL"
        )
    elif replident == "i" and not replident_index:
        problems.append(
            f"table {qualified} has REPLICA IDENTITY USING INDEX but the index is gone: run ALTER TABLE"
            f" {qualified} REPLICA IDENTITY DEFAULT"
        )
    privileges = conn.execute(
        "SELECT has_table_privilege(%s::oid, 'SELECT'), pg_has_role(%s::oid, 'USAGE')", (oid, owner)
    ).fetchone()
    can_select, is_owner = privileges if privileges else (False, False)
    if not can_select:
        problems.append(f"no SELECT privilege on {qualified}: run GRANT SELECT ON {qualified} TO <headrace role>")
    if not is_owner and oid not in published:
        problems.append(
            f"not the owner of {qualified}, which is needed to add it to the publication: have its owner"
            f" run ALTER TABLE {qualified} OWNER TO <headrace role>, or create the publication with it"
            " beforehand"
        )
    return problems


def columns_as_text_problems(conn: Conn, columns: Sequence[ColumnName]) -> list[str]:
    """A sentence for each ``source.columns_as_text`` entry whose table or column does not exist."""
    problems = []
    for column in columns:
        fix = f"fix or remove {column} in source.columns_as_text"
        row = find_relation(conn, column.table)
        if row is None:
            problems.append(f"source.columns_as_text: {missing_table(conn, column.table, fix)}")
            continue
        names = [r[0] for r in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped"
            " ORDER BY attnum", (row[0],)).fetchall()]
        if column.column not in names:
            near = [str(ColumnName(column.table, n)) for n in names if n.lower() == column.column.lower()]
            hint = f" (did you mean {' or '.join(near)}? unquoted names fold to lower case; quote them)" if near else ""
            problems.append(f"source.columns_as_text: table {column.table} has no column"
                            f" {display_ident(column.column)}{hint}: {fix}")
    return problems


def published_oids(conn: Conn, publication: str) -> set[int]:
    """OIDs of the tables ``publication`` publishes (empty when it does not exist)."""
    return {
        oid
        for (oid,) in conn.execute(
            # pg_publication_tables also expands FOR ALL TABLES and FOR TABLES IN SCHEMA.
            "SELECT c.oid::int8 FROM pg_publication_tables p JOIN pg_namespace n ON n.nspname = p.schemaname"
            " JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename WHERE p.pubname = %s",
            (publication,),
        ).fetchall()
    }


def check_source(conn: Conn, tables: Sequence[str | TableName], publication: str) -> list[str]:
    """Everything that stops replication of ``tables`` through ``publication``, as human sentences.

    Each problem names the object and the fix; an empty list means the source is ready.
    """
    problems = server_problems(conn)
    published = published_oids(conn, publication)
    for table in tables:
        problems.extend(problems_of_table(conn, table, published))
    return problems


def table_problems(conn: Conn, table: str | TableName, publication: str) -> list[str]:
    """Why ``table`` cannot be replicated through ``publication`` (empty when it can), as sentences."""
    return problems_of_table(conn, table, published_oids(conn, publication))
