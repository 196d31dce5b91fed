"""The compared text of a MySQL/MariaDB value is the same in MariaDB (the source's column) and in
DuckDB (the value as the target holds it: the text the copy and the stream give it, cast to the
target's type): one differential test over every MySQL type the type matrix covers, with the values
most likely to be spelled differently (float layouts, zero dates, BIT, TIME beyond a day, padding)."""

from __future__ import annotations

from typing import Any

import duckdb
import pytest

from headrace.core.schema import Column, ColumnType, TypeKind
from headrace.source.mysql import catalog
from headrace.source.mysql.connect import connect
from headrace.source.mysql.throwaway import ThrowawayMariaDB
from headrace.source.mysql.types import select_expression, to_text
from headrace.targets.ducklake.types import duck_type
from headrace.verify.canon import MYSQL_SESSION, hash60, joined, key_hash, value_text
from headrace.verify.mysql import key_literal

# column type, values as MariaDB literals
CASES: list[tuple[str, list[str]]] = [
    ("int", ["0", "-2147483648", "42"]),
    ("bigint", ["9223372036854775807", "-1"]),
    ("bigint unsigned", ["18446744073709551615", "0"]),
    ("tinyint", ["-128", "1"]),
    ("year", ["2024", "0", "1901"]),
    ("decimal(10,2)", ["0", "1.5", "-12345678.99"]),
    ("decimal(50,5)", ["123456789012345678901234567890.12345", "-1"]),
    ("double", ["0", "-0e0", "100", "0.1", "1e15", "1e16", "1.5e-7", "123456789012345678", "1e-300", "5e-324",
                "1.7976931348623157e308", "-2.5", "1/3", "0.1+0.2"]),
    ("float", ["0", "100", "0.1", "1e6", "1e-5", "3.4028235e38", "-1.1", "3.1415927"]),
    ("bit(1)", ["b'1'", "b'0'"]),
    ("bit(5)", ["b'00101'", "b'11111'", "0"]),
    ("char(4)", ["'ab'", "''"]),
    ("varchar(20)", ["'é ü 漢'", "'a|b'", "'V3:x'", "'back\\\\slash'"]),
    ("text", ["'😀 text'"]),
    ("enum('a','b c')", ["'b c'"]),
    ("set('x','y')", ["'y,x'", "''"]),
    ("date", ["'2024-02-29'", "'1000-01-01'", "'0000-00-00'"]),
    ("datetime(6)", ["'2024-01-01 12:00:00.5'", "'1000-01-01 00:00:00'", "'9999-12-31 23:59:59.999999'",
                     "'0000-00-00 00:00:00'"]),
    ("timestamp(6) NULL", ["'2024-01-01 12:00:00.5'", "'1970-01-01 00:00:01'", "'2038-01-19 03:14:07.999999'"]),
    ("time(3)", ["'-01:02:03.5'", "'838:59:59'", "'00:00:00'"]),
    ("time", ["'12:34:56'"]),
    ("binary(4)", ["x'00ff'", "x'01020304'"]),
    ("varbinary(8)", ["x'00ff10'", "''"]),
    ("blob", ["x'deadbeef'"]),
    ("json", ["'{\"b\": 1, \"a\": [1, 2]}'"]),
    ("uuid", ["'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'"]),
    ("inet6", ["'::1'", "'2001:db8::ff00:42:8329'"]),
]


@pytest.fixture(scope="module")
def mysql_db(mariadb_server: ThrowawayMariaDB) -> str:
    mariadb_server.create_database("verify_canon")
    return "verify_canon"


def _table(server: ThrowawayMariaDB, db: str, i: int, column_type: str, literals: list[str]) -> Any:
    """Table ``c<i>`` holding ``literals`` and a NULL (in ``id`` order); its schema."""
    conn = connect(server.root_dsn)
    with conn.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")  # zero dates
        cur.execute(f"CREATE OR REPLACE TABLE `{db}`.c{i} (id int PRIMARY KEY, v {column_type})")
        for n, literal in enumerate([*literals, "NULL"]):
            cur.execute(f"INSERT INTO `{db}`.c{i} VALUES ({n}, {literal})")
    return catalog.read_table_schema(conn, db, f"c{i}"), conn


@pytest.mark.parametrize(("column_type", "literals"), CASES, ids=[c[0] for c in CASES])
def test_value_text_is_the_same_on_both_sides(mariadb_server: ThrowawayMariaDB, mysql_db: str, column_type: str,
                                              literals: list[str]) -> None:
    schema, conn = _table(mariadb_server, mysql_db, CASES.index((column_type, literals)), column_type, literals)
    col = schema.column("v")
    with conn.cursor() as cur:
        cur.execute(MYSQL_SESSION)
        cur.execute(f"SELECT {value_text(col, 'mysql')} FROM \"{mysql_db}\".\"{schema.name}\" ORDER BY id")
        source = [r[0] for r in cur.fetchall()]
        cur.execute(f"SELECT {select_expression(col)} FROM `{mysql_db}`.`{schema.name}` ORDER BY id")
        held = [to_text(r[0], col) for r in cur.fetchall()]  # what the copy gives the target
    conn.close()
    assert source[-1] is None
    if col.type.kind is TypeKind.BINARY:
        texts, cast = [t.removeprefix("\\x") if t is not None else None for t in held], "unhex(t)"
    else:
        texts, cast = held, f"CAST(t AS {duck_type(col.type)})"
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    target = [r[0] for r in con.execute(f"SELECT {value_text(col, 'duckdb', cast)} FROM (SELECT unnest(?) AS t)",
                                        [texts]).fetchall()]
    assert target == source, (col.type, held)


def test_hash60_is_the_same_in_mariadb_and_duckdb(mariadb_server: ThrowawayMariaDB) -> None:
    texts = ["", "a", "V3:abc|N", "é 😀"]
    conn = connect(mariadb_server.root_dsn)
    with conn.cursor() as cur:
        cur.execute(MYSQL_SESSION)
        mysql = []
        for t in texts:
            cur.execute(f"SELECT {hash60('%s', 'mysql')}", (t,))
            mysql.append(cur.fetchone()[0])
    conn.close()
    con = duckdb.connect()
    assert mysql == [con.execute(f"SELECT {hash60('?', 'duckdb')}", [t]).fetchone()[0] for t in texts]  # type: ignore[index]


def test_key_hash_and_row_text_are_the_same_in_mariadb_and_duckdb(mariadb_server: ThrowawayMariaDB) -> None:
    from tests.verify.test_canon import KEYS

    columns = [Column("a", ColumnType(TypeKind.STRING, "text"), 0), Column("n", ColumnType(TypeKind.LONG, "bigint"), 1)]
    rows = [("x,1", None), ("x", "1"), (None, None), ("", None), ("é", "2")]
    conn = connect(mariadb_server.root_dsn)
    with conn.cursor() as cur:
        cur.execute(MYSQL_SESSION)
        mysql = []
        for k in KEYS:
            cur.execute(f"SELECT {key_hash(f'CAST({k} AS SIGNED)', 'mysql')}")
            mysql.append(cur.fetchone()[0])
        texts = []
        for row in rows:
            cur.execute(f"SELECT {joined(columns, ['a', 'n'], 'mysql')} FROM (SELECT %s AS a, %s AS n) t", row)
            texts.append(cur.fetchone()[0])
    conn.close()
    con = duckdb.connect()
    assert mysql == [con.execute(f"SELECT {key_hash(f'CAST({k} AS BIGINT)', 'duckdb')}").fetchone()[0] for k in KEYS]  # type: ignore[index]
    assert texts == [con.execute(f"SELECT {joined(columns, ['a', 'n'], 'duckdb')} FROM (SELECT ?::VARCHAR a,"
                                 " ?::VARCHAR n)", list(row)).fetchone()[0] for row in rows]  # type: ignore[index]


@pytest.mark.parametrize(("column_type", "literals"), [c for c in CASES if c[0] in ("int", "bigint unsigned",
                                                                                     "decimal(10,2)", "varchar(20)")])
def test_a_key_is_found_again_from_its_compared_text(mariadb_server: ThrowawayMariaDB, mysql_db: str,
                                                     column_type: str, literals: list[str]) -> None:
    schema, conn = _table(mariadb_server, mysql_db, 100 + CASES.index((column_type, literals)), column_type, literals)
    col = schema.column("v")
    with conn.cursor() as cur:
        cur.execute(MYSQL_SESSION)
        cur.execute(f"SELECT id, {value_text(col, 'mysql')} FROM \"{mysql_db}\".\"{schema.name}\" WHERE v IS NOT NULL")
        for row_id, text in cur.fetchall():
            literal = key_literal(col, text)
            assert literal is not None
            cur.execute(f"SELECT id FROM \"{mysql_db}\".\"{schema.name}\" WHERE v = {literal}")
            assert [r[0] for r in cur.fetchall()] == [row_id], (text, literal)
    conn.close()
