"""Type mapping, table schemas and source checks against a real server."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from headrace.core.changes import Relation, RelationColumn
from headrace.core.errors import SourceError
from headrace.core.names import ColumnName, TableName
from headrace.core.schema import ColumnType, TypeKind
from headrace.source.postgres.catalog import (
    check_source,
    columns_as_text_problems,
    read_table_schema,
    relation_to_schema,
)
from headrace.source.postgres.types import TypeCatalog, builtin_type

K = TypeKind

# column definition → expected (kind, precision, scale, element kind)
COLUMNS = {
    "a smallint": (K.INT, None, None, None),
    "b integer": (K.INT, None, None, None),
    "c bigint": (K.LONG, None, None, None),
    "d real": (K.FLOAT, None, None, None),
    "e double precision": (K.DOUBLE, None, None, None),
    "f numeric(10,2)": (K.DECIMAL, 10, 2, None),
    "g numeric": (K.STRING, None, None, None),
    "h numeric(50,4)": (K.STRING, None, None, None),
    "i numeric(5,-2)": (K.STRING, None, None, None),
    "j boolean": (K.BOOLEAN, None, None, None),
    "k text": (K.STRING, None, None, None),
    "l varchar(20)": (K.STRING, None, None, None),
    "m char(3)": (K.STRING, None, None, None),
    "n bpchar": (K.STRING, None, None, None),
    "o inet": (K.STRING, None, None, None),
    "p money": (K.STRING, None, None, None),
    "q uuid": (K.UUID, None, None, None),
    "r json": (K.JSON, None, None, None),
    "s jsonb": (K.JSON, None, None, None),
    "t interval": (K.INTERVAL, None, None, None),
    "u interval day to second(2)": (K.INTERVAL, None, None, None),
    "v interval(3)": (K.INTERVAL, None, None, None),
    "w interval year to month": (K.INTERVAL, None, None, None),
    "x date": (K.DATE, None, None, None),
    "y time(3)": (K.TIME, None, None, None),
    "z timestamp": (K.TIMESTAMP, None, None, None),
    "aa timestamptz(0)": (K.TIMESTAMPTZ, None, None, None),
    "ab bytea": (K.BINARY, None, None, None),
    "ac integer[]": (K.LIST, None, None, K.INT),
    "ad numeric(10,2)[]": (K.LIST, None, None, K.DECIMAL),
    "ae varchar(5)[]": (K.LIST, None, None, K.STRING),
    "af mood": (K.STRING, None, None, None),
    "ag mood[]": (K.LIST, None, None, K.STRING),
    "ah price": (K.DECIMAL, 10, 2, None),
    "ai price[]": (K.LIST, None, None, K.DECIMAL),
    "aj int2vector": (K.STRING, None, None, None),
    "ak point": (K.STRING, None, None, None),
    "al bit varying(5)": (K.STRING, None, None, None),
    "am timetz": (K.STRING, None, None, None),
    "an xml": (K.STRING, None, None, None),
    "ao cidr": (K.STRING, None, None, None),
    "ap macaddr": (K.STRING, None, None, None),
    "aq name": (K.STRING, None, None, None),
    "ar \"char\"": (K.STRING, None, None, None),
}


@pytest.fixture
def conn(source_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(source_dsn, autocommit=True) as c:
        c.execute("CREATE TYPE mood AS ENUM ('ok', 'sad')")
        c.execute("CREATE DOMAIN price AS numeric(10,2) CHECK (VALUE >= 0)")
        c.execute(f"CREATE TABLE wide (id int PRIMARY KEY, {', '.join(COLUMNS)})")
        yield c


def test_types_match_format_type_and_kinds(conn: psycopg.Connection) -> None:
    schema = read_table_schema(conn, "public.wide")
    spelled = dict(
        conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
            " WHERE attrelid = 'wide'::regclass AND attnum > 0"
        ).fetchall()
    )
    for definition, (kind, precision, scale, element) in COLUMNS.items():
        col = schema.column(definition.split()[0])
        assert col.type.pg_type == spelled[col.name], definition
        assert (col.type.kind, col.type.precision, col.type.scale) == (kind, precision, scale), definition
        assert (col.type.element.kind if col.type.element else None) == element, definition


def test_builtin_table_needs_no_connection() -> None:
    assert builtin_type(1700, (10 << 16 | 2) + 4) == ColumnType(K.DECIMAL, "numeric(10,2)", 10, 2)
    assert builtin_type(1015, 24) == ColumnType(
        K.LIST, "character varying(20)[]", element=ColumnType(K.STRING, "character varying(20)")
    )
    assert builtin_type(123456) is None


def test_read_table_schema_key_nullability_and_order(conn: psycopg.Connection) -> None:
    conn.execute(
        "CREATE TABLE o (b text NOT NULL, a int, dropped int, g int GENERATED ALWAYS AS (a * 2) STORED,"
        " c int NOT NULL, PRIMARY KEY (c, b))"
    )
    conn.execute("ALTER TABLE o DROP COLUMN dropped")
    schema = read_table_schema(conn, "o")
    assert schema.oid == conn.execute("SELECT 'o'::regclass::oid").fetchone()[0]  # type: ignore[index]
    assert (schema.schema, schema.name, schema.replica_identity) == ("public", "o", "d")
    assert schema.column_names == ("b", "a", "c")  # attnum order, no dropped/generated columns
    assert [c.nullable for c in schema.columns] == [False, True, False]
    assert schema.key == ("c", "b")  # primary key order, not column order

    conn.execute("CREATE UNIQUE INDEX o_a ON o (a)")
    conn.execute("ALTER TABLE o ALTER a SET NOT NULL, REPLICA IDENTITY USING INDEX o_a")
    assert read_table_schema(conn, "o").key == ("a",)
    conn.execute("CREATE TABLE nokey (x int)")
    assert read_table_schema(conn, "nokey").key == ()
    with pytest.raises(SourceError, match="public.missing does not exist"):
        read_table_schema(conn, "public.missing")


def test_relation_to_schema(conn: psycopg.Connection) -> None:
    types = TypeCatalog(conn)
    mood = conn.execute("SELECT 'mood'::regtype::oid").fetchone()[0]  # type: ignore[index]
    cols = (RelationColumn("id", 23, -1, True), RelationColumn("m", mood, -1, False))
    schema = relation_to_schema(Relation(42, "public", "r", "d", cols), types)
    assert schema.key == ("id",) and schema.oid == 42
    assert schema.columns[1].type == ColumnType(K.STRING, "mood")

    full = Relation(42, "public", "r", "f", tuple(RelationColumn(c.name, c.type_oid, -1, True) for c in cols))
    known = relation_to_schema(Relation(42, "public", "r", "d", cols), types)
    assert relation_to_schema(full, types, known).key == ("id",)  # not every column
    assert relation_to_schema(full, types).key == ()


def test_check_source_ready_and_problems(conn: psycopg.Connection, source_dsn: str) -> None:
    conn.execute("CREATE TABLE ok (id int PRIMARY KEY)")
    assert check_source(conn, ["public.ok"], "p") == []

    conn.execute("CREATE TABLE orders (x int)")
    conn.execute("CREATE TABLE fullnokey (x int)")
    conn.execute("ALTER TABLE fullnokey REPLICA IDENTITY FULL")
    conn.execute("CREATE ROLE weak LOGIN")
    conn.execute("GRANT SELECT ON ok TO weak")
    problems = check_source(conn, ["public.orders", "fullnokey", "public.nope"], "p")
    assert any(
        "table public.orders has no primary key and REPLICA IDENTITY DEFAULT" in p
        and "ALTER TABLE public.orders REPLICA IDENTITY FULL" in p
        for p in problems
    )
    assert not any("public.fullnokey" in p for p in problems)  # keyless under FULL: all columns identify
    assert any("public.nope does not exist" in p for p in problems)

    with psycopg.connect(source_dsn, user="weak", autocommit=True) as weak:
        problems = check_source(weak, ["public.ok", "public.orders"], "p")
    assert any("role weak lacks the REPLICATION attribute" in p for p in problems)
    assert any("no SELECT privilege on public.orders" in p for p in problems)
    assert any("not the owner of public.ok" in p for p in problems)

    conn.execute("CREATE PUBLICATION p FOR TABLE ok")
    with psycopg.connect(source_dsn, user="weak", autocommit=True) as weak:
        problems = check_source(weak, ["public.ok"], "p")
    assert not any("owner" in p for p in problems)  # already published: no ALTER PUBLICATION needed
    conn.execute("DROP OWNED BY weak")
    conn.execute("DROP ROLE weak")


def test_check_source_takes_any_name(conn: psycopg.Connection) -> None:
    """Capitals, spaces, dots and quotes in names: checked by exact name, problems quoted as SQL."""
    conn.execute('CREATE SCHEMA "Sales"; CREATE TABLE "Sales"."Order Items" (id int PRIMARY KEY);'
                 ' CREATE TABLE "User" (id int PRIMARY KEY); CREATE TABLE "a.b""c" (x int)')
    assert check_source(conn, ['"Sales"."Order Items"', '"User"'], "p") == []
    assert read_table_schema(conn, '"Sales"."Order Items"').qualified_name == '"Sales"."Order Items"'
    problems = check_source(conn, ["public.User", 'public."a.b""c"'], "p")
    # unquoted folds to lower case, as in SQL: the table in another case is named with its spelling
    assert any('table public."user" does not exist (did you mean public."User"?' in p for p in problems), problems
    assert any('ALTER TABLE public."a.b""c" REPLICA IDENTITY FULL' in p for p in problems), problems


def test_columns_kept_as_text_resolve_to_string_on_every_path(conn: psycopg.Connection) -> None:
    conn.execute('CREATE TABLE "Grid" (id int PRIMARY KEY, cells int[], "Price" numeric(5,2), m mood[])')
    grid = TableName("public", "Grid")
    types = TypeCatalog(conn, {ColumnName(grid, "cells"), ColumnName(grid, "Price"), ColumnName(grid, "m")})
    read = read_table_schema(conn, grid, types)
    assert [c.type for c in read.columns] == [ColumnType(K.INT, "integer"), ColumnType(K.STRING, "integer[]"),
                                              ColumnType(K.STRING, "numeric(5,2)"), ColumnType(K.STRING, "mood[]")]
    cols = tuple(RelationColumn(c.name, c.type_oid, c.typmod, c.name == "id") for c in read.columns)
    streamed = relation_to_schema(Relation(read.oid, "public", "Grid", "d", cols), types)
    assert [c.type for c in streamed.columns] == [c.type for c in read.columns]
    assert read_table_schema(conn, grid).column("cells").type.kind is K.LIST  # without the config


def test_columns_as_text_entries_that_name_nothing_are_problems(conn: psycopg.Connection) -> None:
    conn.execute('CREATE TABLE "Grid" (id int PRIMARY KEY, "Cells" int[])')
    entries = [ColumnName.parse(t) for t in ('public."Grid"."Cells"', 'public."Grid".cells', "public.nope.x")]
    problems = columns_as_text_problems(conn, entries)
    assert problems == [
        'source.columns_as_text: table public."Grid" has no column cells (did you mean public."Grid"."Cells"?'
        ' unquoted names fold to lower case; quote them): fix or remove public."Grid".cells in source.columns_as_text',
        "source.columns_as_text: table public.nope does not exist: fix or remove public.nope.x in"
        " source.columns_as_text",
    ]
