"""Every logical type through the real copy path (COPY CSV -> Arrow -> Spark casts), value by value.

The reference is what psycopg returns for the same rows; text-kept types (uuid, json, interval,
time) are compared with PostgreSQL's own text output.
"""

from __future__ import annotations

import math
import struct
from datetime import timezone
from typing import Any

import psycopg
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from headrace.core.position import Position
from headrace.core.schema import Column, ColumnType, TableSchema, TypeKind
from headrace.core.spark_types import parse_array_literal
from headrace.engines.spark.casts import cast_text
from headrace.engines.spark.copy import chunk_dataframe
from headrace.source.postgres.copy import OPEN_END, plan_chunks
from headrace.source.postgres.source import chunk_reader

K = TypeKind
# (column, PostgreSQL type, logical type)
COLUMNS: list[tuple[str, str, ColumnType]] = [
    ("i", "integer", ColumnType(K.INT, "integer")),
    ("l", "bigint", ColumnType(K.LONG, "bigint")),
    ("f", "real", ColumnType(K.FLOAT, "real")),
    ("d", "double precision", ColumnType(K.DOUBLE, "double precision")),
    ("n", "numeric(38,10)", ColumnType(K.DECIMAL, "numeric(38,10)", 38, 10)),
    ("b", "boolean", ColumnType(K.BOOLEAN, "boolean")),
    ("Text Col", "text", ColumnType(K.STRING, "text")),
    ("u", "uuid", ColumnType(K.UUID, "uuid")),
    ("j", "jsonb", ColumnType(K.JSON, "jsonb")),
    ("iv", "interval", ColumnType(K.INTERVAL, "interval")),
    ("tm", "time", ColumnType(K.TIME, "time")),
    ("dt", "date", ColumnType(K.DATE, "date")),
    ("ts", "timestamp", ColumnType(K.TIMESTAMP, "timestamp")),
    ("tz", "timestamptz", ColumnType(K.TIMESTAMPTZ, "timestamptz")),
    ("by", "bytea", ColumnType(K.BINARY, "bytea")),
    ("ia", "integer[]", ColumnType(K.LIST, "integer[]", element=ColumnType(K.INT, "integer"))),
    ("ta", "text[]", ColumnType(K.LIST, "text[]", element=ColumnType(K.STRING, "text"))),
    ("tza", "timestamptz[]", ColumnType(K.LIST, "timestamptz[]", element=ColumnType(K.TIMESTAMPTZ, "tz"))),
]
TEXT_KEPT = {"u", "j", "iv", "tm"}

ROWS = [
    # ordinary values
    "(1, 42, 1.5, 2.25, 3.14, true, 'hello', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{\"k\": [1, 2]}', "
    "'1 year 2 mons 3 days 04:05:06.789', '12:34:56.123456', '2024-02-29', '2024-01-02 03:04:05.123456', "
    "'2024-01-02 03:04:05.123456+00', '\\x0a0b', '{1,2,3}', '{a,b}', '{\"2024-01-01 00:00:00+00\"}')",
    # every column NULL
    "(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
    # edges: empty strings, unicode, separators in text, extremes, NaN, zero bytes, NULL in arrays
    "(-2147483648, 9223372036854775807, 'NaN', '-Infinity', '1234567890123456789012345678.0123456789', false, "
    "E'', '00000000-0000-0000-0000-000000000000', '\"x\"', '-00:00:00.000001', '00:00:00', '0001-01-01', '1970-01-01 00:00:00.000001', "
    "'2262-04-11 23:47:16.854775+05:30', '\\x00ff00', '{1,NULL,3}', "
    "ARRAY['a b', 'x\"y', NULL, 'NULL', '', ',{}', E'back\\\\slash', 'Ünïcødé 🌍'], '{NULL}')",
    "(0, -1, 'Infinity', 'NaN', '-0.0000000001', NULL, E'line\\nbreak, \"quoted\", NULL', NULL, '{}', "
    "'0', '24:00:00', '9999-12-31', '0001-01-01 00:00:00', '1900-01-01 00:00:00.5-03', '\\x', '{}', '{}', '{}')",
    "(7, 7, 3.4028235e+38, 1.7976931348623157e+308, 0, true, 'NULL', NULL, 'null', NULL, NULL, NULL, NULL, NULL, "
    "NULL, NULL, '{\"\"}', NULL)",
]


def _f32(x: float) -> float:
    return float(struct.unpack("f", struct.pack("f", x))[0])


def _same(name: str, expected: Any, got: Any) -> bool:
    if expected is None or got is None:
        return expected is None and got is None
    if isinstance(expected, float):
        expected = _f32(expected) if name == "f" else expected
        return (math.isnan(expected) and math.isnan(got)) or expected == got
    if name == "tz":
        # Spark returns naive datetimes in the session time zone (UTC).
        return bool(expected.astimezone(timezone.utc).replace(tzinfo=None) == got)
    if name == "tza":
        return [e.astimezone(timezone.utc).replace(tzinfo=None) if e else e for e in expected] == got
    if name == "by":
        return bytes(expected) == bytes(got)
    return bool(expected == got)


@pytest.fixture
def typed_table(source_dsn: str) -> TableSchema:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        cols = ", ".join(f'"{name}" {pg}' for name, pg, _ in COLUMNS)
        conn.execute(f"CREATE TABLE typed (id serial PRIMARY KEY, {cols})")
        names = ", ".join(f'"{name}"' for name, _, _ in COLUMNS)
        for values in ROWS:
            conn.execute(f"INSERT INTO typed ({names}) VALUES {values}")
        oid = conn.execute("SELECT 'typed'::regclass::oid").fetchone()[0]  # type: ignore[index]
    columns = (Column("id", ColumnType(K.INT, "integer"), 23),) + tuple(
        Column(name, ct, 0) for name, _, ct in COLUMNS
    )
    return TableSchema(oid=oid, schema="public", name="typed", columns=columns, key=("id",))


def test_every_type_round_trips_through_the_copy(
    spark: SparkSession, source_dsn: str, typed_table: TableSchema
) -> None:
    with psycopg.connect(source_dsn, options="-c TimeZone=UTC") as conn:
        chunks = plan_chunks(conn, typed_table, chunk_pages=1)
        select = ", ".join(f'"{n}"::text' if n in TEXT_KEPT else f'"{n}"' for n in typed_table.column_names)
        expected = {r[0]: r for r in conn.execute(f"SELECT {select} FROM typed").fetchall()}
    assert chunks[-1][1] == OPEN_END

    df = chunk_dataframe(spark, typed_table, chunk_reader(source_dsn, None, typed_table, True), chunks, Position(77))
    got = {r["id"]: r for r in df.collect()}
    assert got.keys() == expected.keys()
    for key, exp in expected.items():
        row = got[key]
        assert (row["_hr_lsn"], row["_hr_seq"], row["_hr_commit_ts"]) == (77, 0, None)
        for i, name in enumerate(typed_table.column_names):
            assert _same(name, exp[i], row[name]), f"row {key} column {name}: {exp[i]!r} != {row[name]!r}"


def test_plan_chunks_covers_empty_and_growing_tables(source_dsn: str, typed_table: TableSchema) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE typed")
        assert plan_chunks(conn, typed_table, 4) == [(0, OPEN_END)]
        conn.execute("INSERT INTO typed (\"Text Col\") SELECT repeat('x', 500) FROM generate_series(1, 200)")
        chunks = plan_chunks(conn, typed_table, 4)
    pages = chunks[-1][0] // 4 + 1
    assert len(chunks) == pages and chunks[0] == (0, 4) and chunks[-1][1] == OPEN_END


def test_bc_dates_and_timestamps(spark: SparkSession) -> None:
    df = spark.createDataFrame([("0044-03-15 BC", "2000-01-01 00:00:00 BC")], "b string, c string")
    row = df.select(
        cast_text(F.col("b"), ColumnType(K.DATE, "date")).cast("string").alias("b"),
        cast_text(F.col("c"), ColumnType(K.TIMESTAMP, "timestamp")).cast("string").alias("c"),
    ).collect()[0]
    assert row["b"] == "-0043-03-15"  # 44 BC in astronomical numbering
    assert row["c"] == "-1999-01-01 00:00:00"


def test_parse_array_literal() -> None:
    assert parse_array_literal('{1,NULL,"NULL","a \\"b\\"",""}') == ["1", None, "NULL", 'a "b"', ""]
    assert parse_array_literal("{}") == [] and parse_array_literal(None) is None
    with pytest.raises(ValueError, match="multi-dimensional"):
        parse_array_literal("{{1,2},{3,4}}")
    with pytest.raises(ValueError, match="non-default bounds"):
        parse_array_literal("[0:1]={x,y}")
