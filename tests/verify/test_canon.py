"""The compared text of a value is the same in PostgreSQL (the source's type) and in DuckDB (the
type the targets hold it in): one differential test per kind, over the values most likely to be
spelled differently (float layouts, NaN and infinities, -0, NULL, padding, scales, time zones)."""

from __future__ import annotations

import duckdb
import psycopg
import pytest

from headrace.core.schema import Column, ColumnType, TypeKind
from headrace.source.postgres.replication import SESSION_OPTIONS
from headrace.targets.ducklake.types import duck_type
from headrace.verify.canon import hash60, joined, key_hash, value_text

# kind, PostgreSQL type, target type in DuckDB (None: DuckLake's), values as PostgreSQL literals
CASES: list[tuple[TypeKind, str, str | None, list[str]]] = [
    (TypeKind.INT, "integer", None, ["0", "-2147483648", "42"]),
    (TypeKind.LONG, "bigint", None, ["9223372036854775807", "-1"]),
    (TypeKind.DOUBLE, "double precision", None,
     ["0", "-0", "100", "0.1", "1e15", "1e16", "1.5e-7", "123456789012345678", "1e-300", "5e-324",
      "1.7976931348623157e308", "-2.5", "'NaN'", "'Infinity'", "'-Infinity'", "1/3.0", "0.001"]),
    (TypeKind.FLOAT, "real", None, ["0", "100", "0.1", "1e6", "1e-5", "3.4028235e38", "-1.1", "'NaN'", "1/7.0"]),
    (TypeKind.DECIMAL, "numeric(10,2)", "DECIMAL(10,2)", ["0", "1.5", "-12345678.99", "0.01"]),
    (TypeKind.BOOLEAN, "boolean", None, ["true", "false"]),
    (TypeKind.STRING, "text", None, ["''", "'é ü 漢'", "'a|b'", "'V3:x'"]),
    (TypeKind.STRING, "char(4)", "VARCHAR", ["'ab'"]),
    (TypeKind.UUID, "uuid", None, ["'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'"]),
    (TypeKind.UUID, "uuid", "VARCHAR", ["'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'"]),
    (TypeKind.JSON, "jsonb", None, ["'{\"b\": 1, \"a\": [1, 2]}'"]),
    (TypeKind.TIME, "time", None, ["'12:34:56.123'", "'00:00:00'", "'23:59:59.999999'"]),
    (TypeKind.DATE, "date", None, ["'2024-02-29'", "'0001-01-01'"]),
    (TypeKind.TIMESTAMP, "timestamp", None, ["'2024-01-01 12:00:00.5'", "'1900-01-01'", "'1999-12-31 23:59:59.999999'"]),
    (TypeKind.TIMESTAMPTZ, "timestamptz", None, ["'2024-01-01 12:00:00.5+02'", "'1970-01-01 00:00:00+00'"]),
    (TypeKind.BINARY, "bytea", None, ["'\\x00ff10'::bytea", "''::bytea"]),
    (TypeKind.LIST, "integer[]", "INTEGER[]", ["'{1,2}'", "'{}'", "'{3,NULL}'"]),
    (TypeKind.LIST, "text[]", "VARCHAR[]", ["'{a,\"b c\",\"q\\\"\"}'", "'{NULL}'"]),
]


def _pg_texts(dsn: str, col: Column, literals: list[str]) -> list[str | None]:
    with psycopg.connect(dsn, options=SESSION_OPTIONS) as conn:
        values = ", ".join(f"(({v})::{col.type.pg_type})" for v in [*literals, "NULL"])
        query = f"SELECT {value_text(col, 'postgres')} FROM (VALUES {values}) AS t(v)"
        return [r[0] for r in conn.execute(query).fetchall()]  # type: ignore[arg-type]


def _duck_texts(dsn: str, col: Column, duck: str, literals: list[str]) -> list[str | None]:
    # The values reach DuckDB as the target holds them: PostgreSQL's output cast to the target type.
    with psycopg.connect(dsn, options=SESSION_OPTIONS) as conn:
        texts = [conn.execute(f"SELECT format('%s', ({v})::{col.type.pg_type})").fetchone()[0]  # type: ignore[index]
                 for v in literals]
    if col.type.kind is TypeKind.BINARY:
        texts = [t.removeprefix("\\x") for t in texts]
        cast = "unhex(t)"
    elif col.type.kind is TypeKind.LIST:  # DuckDB reads no PostgreSQL array literal: built from JSON
        with psycopg.connect(dsn) as conn:
            texts = [conn.execute(f"SELECT array_to_json(({v})::{col.type.pg_type})::text").fetchone()[0]  # type: ignore[index]
                     for v in literals]
        cast = f"CAST(CAST(t AS JSON) AS {duck})"
    else:
        cast = f"CAST(t AS {duck})"
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    rows = con.execute(f"SELECT {value_text(col, 'duckdb', cast)} FROM (SELECT unnest(?) AS t)",
                       [[*texts, None]]).fetchall()
    return [r[0] for r in rows]


@pytest.mark.parametrize(("kind", "pg_type", "duck", "literals"), CASES,
                         ids=[f"{c[1]}-{c[2] or 'ducklake'}" for c in CASES])
def test_value_text_is_the_same_on_both_sides(source_dsn: str, kind: TypeKind, pg_type: str, duck: str | None,
                                              literals: list[str]) -> None:
    scale = (10, 2) if kind is TypeKind.DECIMAL else (None, None)
    element = ColumnType(TypeKind.INT if pg_type == "integer[]" else TypeKind.STRING, pg_type[:-2])
    col = Column("v", ColumnType(kind, pg_type, *scale, element=element if kind is TypeKind.LIST else None), 0)
    pg = _pg_texts(source_dsn, col, literals)
    assert pg[-1] is None
    assert _duck_texts(source_dsn, col, duck or duck_type(col.type), literals) == pg


def test_hash60_is_the_same_on_both_sides(source_dsn: str) -> None:
    texts = ["", "a", "V3:abc|N", "é"]
    with psycopg.connect(source_dsn) as conn:
        pg = [conn.execute(f"SELECT {hash60('%s', 'postgres')}", (t,)).fetchone()[0] for t in texts]  # type: ignore[index]
    con = duckdb.connect()
    duck = [con.execute(f"SELECT {hash60('?', 'duckdb')}", [t]).fetchone()[0] for t in texts]  # type: ignore[index]
    assert pg == duck
    assert all(0 <= h < 2**60 for h in pg)


KEYS = [0, 1, -1, 42, 2**31 - 1, -2**31, 2**30, -2**30, 2**30 - 1, 2**63 - 1, -2**63, 1234567890123456789]


def test_key_hash_is_the_same_on_both_sides(source_dsn: str) -> None:
    with psycopg.connect(source_dsn) as conn:
        pg = [conn.execute(f"SELECT {key_hash(f'({k})::bigint', 'postgres')}").fetchone()[0]  # type: ignore[index]
              for k in KEYS]
        small = [conn.execute(f"SELECT {key_hash(f'({k})::integer', 'postgres')}").fetchone()[0]  # type: ignore[index]
                 for k in KEYS if abs(k) < 2**31 - 1]
    con = duckdb.connect()
    duck = [con.execute(f"SELECT {key_hash(f'CAST({k} AS BIGINT)', 'duckdb')}").fetchone()[0] for k in KEYS]  # type: ignore[index]
    assert pg == duck
    assert small == [h for k, h in zip(KEYS, pg, strict=True) if abs(k) < 2**31 - 1]
    assert all(0 <= h < 2**60 for h in pg)
    assert len(set(pg)) == len(KEYS)
    # consecutive keys spread evenly over the ranges (the hash's top bits)
    ranges = [r[0] for r in con.execute(f"SELECT count(*) FROM range(100000) t(k) GROUP BY {key_hash('k', 'duckdb')} >> 54")
              .fetchall()]
    assert len(ranges) == 64 and max(ranges) < 2 * min(ranges)


def test_a_row_text_is_the_same_on_both_sides_and_read_back_one_way(source_dsn: str) -> None:
    columns = [Column("a", ColumnType(TypeKind.STRING, "text"), 0), Column("n", ColumnType(TypeKind.LONG, "bigint"), 1),
               Column("b", ColumnType(TypeKind.STRING, "text"), 2)]
    rows = [("x,1", None, ""), ("x", 1, ""), ("x", None, ",1"), (None, None, None), ("", None, None), (None, None, ""),
            ("1:x", 2, "é"), ("", 0, "")]
    texts = [c.name for c in columns]
    with psycopg.connect(source_dsn) as conn:
        pg = [conn.execute(f"SELECT {joined(columns, texts, 'postgres')} FROM (VALUES (%s::text, %s::bigint::text,"
                           " %s::text)) t(a, n, b)", row).fetchone()[0] for row in rows]  # type: ignore[index]
    con = duckdb.connect()
    duck = [con.execute(f"SELECT {joined(columns, texts, 'duckdb')} FROM (SELECT ?::VARCHAR a,"
                        " CAST(?::BIGINT AS VARCHAR) n, ?::VARCHAR b)", list(row)).fetchone()[0] for row in rows]  # type: ignore[index]
    assert pg == duck
    assert len(set(pg)) == len(rows), pg


def test_keys_are_reported_as_json_values() -> None:
    from headrace.verify.compare import shown_value

    assert shown_value(TypeKind.LONG, "-12") == -12
    assert shown_value(TypeKind.DOUBLE, "15e-1") == 1.5
    assert shown_value(TypeKind.DOUBLE, "NaN") == "NaN"
    assert shown_value(TypeKind.TIMESTAMPTZ, "1704110400500000") == "2024-01-01T12:00:00.500000+00:00"
    assert shown_value(TypeKind.TIMESTAMP, "-1") == "1969-12-31T23:59:59.999999"
    assert shown_value(TypeKind.TIMESTAMP, "infinity") == "infinity"
    assert shown_value(TypeKind.BOOLEAN, "false") is False
    assert shown_value(TypeKind.STRING, None) is None


@pytest.mark.parametrize(("kind", "pg_type", "duck", "literals"),
                         [c for c in CASES if c[0] not in (TypeKind.LIST, TypeKind.JSON)],
                         ids=[f"{c[1]}-{c[2] or 'ducklake'}" for c in CASES if c[0] not in (TypeKind.LIST, TypeKind.JSON)])
def test_a_key_is_found_again_from_its_compared_text(source_dsn: str, kind: TypeKind, pg_type: str, duck: str | None,
                                                     literals: list[str]) -> None:
    from headrace.verify.postgres import key_literal

    col = Column("v", ColumnType(kind, pg_type, *((10, 2) if kind is TypeKind.DECIMAL else (None, None))), 0)
    texts = _pg_texts(source_dsn, col, literals)[:-1]
    with psycopg.connect(source_dsn, options=SESSION_OPTIONS) as conn:
        for literal, text in zip(literals, texts, strict=True):
            assert text is not None
            found = conn.execute(f"SELECT v IS NOT DISTINCT FROM {key_literal(kind, text)} OR v <> v"
                                 f" FROM (SELECT ({literal})::{pg_type} AS v) t").fetchone()
            assert found == (True,), (literal, text)
