"""Every kind of PostgreSQL value, one awkward value per row, through copy, streamed INSERT and UPDATE.

Each row sets one column to one awkward value (the others NULL). The copy carries rows 1..n; a
streamed INSERT carries the same values as rows 1001..; a streamed UPDATE sets rows 2001.. from
an ordinary value to the awkward one. Every target value is compared with the source: native
types by value (dates and timestamps as days / microseconds since the epoch, so BC and infinite
values compare too; floats by ``repr``, so ``-0.0`` and denormals count), types kept as text with
PostgreSQL's own text output. Infinity: DuckLake stores DuckDB's infinity; Iceberg clamps
(``values.infinity: clamp``) to 0001-01-01 / 9999-12-31 23:59:59.999999.
"""

from __future__ import annotations

import decimal
import struct
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from headrace.control.assess import assess_table, format_assessment
from headrace.core.names import quote_ident
from headrace.core.schema import ColumnType, TableSchema, TypeKind
from headrace.core.spark_types import INT32_MAX, INT64_MAX
from headrace.pipeline import Pipeline
from headrace.source.postgres.catalog import read_table_schema
from headrace.state.lifecycle import TableState
from headrace.targets.ducklake.files import to_arrow as _to_arrow
from headrace.targets.ducklake.types import cast_out
from tests.e2e.helpers import assert_built_by_spark, assert_same, make_config, running, wait_until
from tests.e2e.test_pipeline import run_caught_up

K = TypeKind
TEXT_KINDS = {K.STRING, K.UUID, K.JSON, K.INTERVAL, K.TIME}
DATETIMES = {K.DATE, K.TIMESTAMP, K.TIMESTAMPTZ}

DDL = """
CREATE TYPE mood AS ENUM ('sad', 'ok');
ALTER TYPE mood ADD VALUE 'happy';
CREATE TYPE pair AS (n integer, s text);
CREATE DOMAIN posint AS integer CHECK (VALUE > 0);
CREATE DOMAIN intlist AS integer[];
CREATE DOMAIN feeling AS mood;
"""

BIG_TEXT = "(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 4000) g)"  # 128 kB, TOASTed
BIG_BYTEA = "(SELECT string_agg(decode(md5(g::text), 'hex'), ''::bytea) FROM generate_series(1, 40000) g)"

# column -> (type, ordinary value used before the UPDATE, awkward values)
MATRIX: dict[str, tuple[str, str, list[str]]] = {
    "c_int2": ("smallint", "1", ["-32768", "32767"]),
    "c_int8": ("bigint", "1", ["-9223372036854775808", "9223372036854775807"]),
    "c_real": ("real", "1", ["'NaN'", "'Infinity'", "'-Infinity'", "'-0'", "'1e-45'", "'3.4028235e38'"]),
    "c_double": ("double precision", "1",
                 ["'NaN'", "'-Infinity'", "'-0'", "'5e-324'", "'2.2250738585072014e-308'", "'1.7976931348623157e308'"]),
    "c_num": ("numeric(12,3)", "1", ["999999999.999", "-0.001"]),
    "c_numfree": ("numeric", "1", ["'NaN'", "'Infinity'", "'-Infinity'", "'1e-300'", "'-0.000'"]),
    "c_money": ("money", "1", ["'-92233720368547758.08'", "'92233720368547758.07'"]),
    "c_bool": ("boolean", "true", ["false"]),
    "c_text": ("text", "'x'", ["''", "E'h\\u00e9llo \\u2603 \\U0001D11E \\u0001'", "E'tab\\there\\nnl \"q\" , \\\\'",
                               BIG_TEXT]),
    "c_char": ("char(3)", "'x'", ["'a'", "''"]),
    "c_qchar": ('"char"', "'x'", ["'z'"]),
    "c_bytea": ("bytea", "'\\x01'", ["'\\x'", "'\\x00ff'", BIG_BYTEA]),
    "c_uuid": ("uuid", "gen_random_uuid()", ["'00000000-0000-0000-0000-000000000000'"]),
    "c_json": ("json", "'1'", ["'{\"a\": 1, \"a\" : 2}'", "'  [1,2 ]  '", "'null'"]),
    "c_jsonb": ("jsonb", "'1'", ["'{\"a\": 1, \"a\": 2}'", "'\"\\u00e9\"'"]),
    "c_xml": ("xml", "'<a/>'", ["'<a>\u00fc</a>'"]),
    "c_date": ("date", "'2000-01-01'", ["'0001-01-01'", "'0044-03-15 BC'", "'4713-11-24 BC'", "'1582-10-10'",
                                        "'5874897-12-31'", "'infinity'", "'-infinity'"]),
    "c_time": ("time", "'12:00'", ["'24:00:00'", "'23:59:59.999999'"]),
    "c_timetz": ("timetz", "'12:00+00'", ["'24:00:00-15:59'", "'00:00:00+15:59'"]),
    "c_ts": ("timestamp", "'2000-01-01'", ["'0001-01-01 00:00:00'", "'4713-11-24 00:00:00 BC'", "'1582-10-10 12:00'",
                                           "'294276-12-31 23:59:59.999999'", "'infinity'", "'-infinity'"]),
    "c_tstz": ("timestamptz", "'2000-01-01 00:00+00'", ["'0044-03-15 12:00:00+00 BC'", "'2000-01-01 00:00+14'",
                                                        "'infinity'", "'-infinity'"]),
    "c_interval": ("interval", "'1 day'", ["'178956970 years 7 mons 2147483647 days 2562047788:00:54.775807'",
                                          "'-178956970 years -8 mons -2147483648 days -2562047788:00:54.775807'",
                                          "'-2 days +01:00:00'", "'0'"]),
    "c_inet": ("inet", "'10.0.0.1'", ["'::1/128'"]),
    "c_macaddr": ("macaddr", "'08:00:2b:01:02:03'", ["'ff:ff:ff:ff:ff:ff'"]),
    "c_bit": ("bit(4)", "B'0000'", ["B'1010'"]),
    "c_varbit": ("bit varying", "B'1'", ["B''"]),
    "c_tsvector": ("tsvector", "'a'", ["'a:1 b:2,3 ''x y'''"]),
    "c_point": ("point", "'(0,0)'", ["'(1.5,-0)'"]),
    "c_line": ("line", "'{1,1,0}'", ["'{1,2,3}'"]),
    "c_box": ("box", "'(0,0),(1,1)'", ["'(1,1),(0,0)'"]),
    "c_polygon": ("polygon", "'((0,0),(1,1),(1,0))'", ["'((0,0),(1,1),(2,0),(1e300,-1e-300))'"]),
    "c_circle": ("circle", "'<(0,0),1>'", ["'<(0,0),0>'"]),
    "c_range": ("int4range", "'[1,2)'", ["'empty'", "'(,)'"]),
    "c_tsrange": ("tstzrange", "'[2000-01-01,2000-01-02)'", ["'[-infinity,infinity)'"]),
    "c_multirange": ("int4multirange", "'{}'", ["'{[1,3),[5,7)}'", "'{}'"]),
    "c_pair": ("pair", "ROW(0, '')", ["ROW(1, 'a,\"b\"')", "ROW(NULL, NULL)"]),
    "c_mood": ("mood", "'sad'", ["'happy'"]),
    "c_posint": ("posint", "1", ["2147483647"]),
    "c_intlist": ("intlist", "'{1}'", ["'{1,NULL,3}'"]),
    "c_feeling": ("feeling", "'sad'", ["'happy'"]),
    "c_pg_lsn": ("pg_lsn", "'0/0'", ["'FFFFFFFF/FFFFFFFF'"]),
    "c_int_arr": ("integer[]", "'{1}'", ["'{}'", "'{NULL}'", "'{1,NULL,3}'", "ARRAY[2147483647, -2147483648]"]),
    "c_text_arr": ("text[]", "'{x}'", ["'{}'", "'{\"\",\"NULL\",NULL,\"a,b\",\"{}\",\"\\\\\\\\\"}'",
                                       f"ARRAY[{BIG_TEXT}, {BIG_TEXT}]"]),
    "c_float_arr": ("double precision[]", "'{1}'", ["'{NaN,-0,5e-324,-Infinity}'"]),
    "c_num_arr": ("numeric[]", "'{1}'", ["'{NaN,Infinity,1.50}'"]),
    "c_date_arr": ("date[]", "'{2000-01-01}'", ["'{infinity,0044-03-15 BC,NULL}'"]),
    "c_tstz_arr": ("timestamptz[]", "'{2000-01-01 00:00+00}'", ["'{-infinity,2000-01-01 00:00+14}'"]),
    "c_bytea_arr": ("bytea[]", "'{\"\\\\x01\"}'", ["ARRAY['\\x00'::bytea, NULL, '\\x'::bytea]"]),
    "c_mood_arr": ("mood[]", "'{sad}'", ["'{happy,sad}'"]),
    "c_jsonb_arr": ("jsonb[]", "'{1}'", ["ARRAY['{\"a\": [1, \"x\"]}'::jsonb, 'null'::jsonb]"]),
    "c_pair_arr": ("pair[]", "ARRAY[ROW(0, '')::pair]", ["ARRAY[ROW(1, 'a b')::pair, ROW(NULL, '\"')::pair]"]),
    "c_box_arr": ("box[]", "ARRAY['(0,0),(1,1)'::box]", ["'{(1,1),(0,0);(2,2),(1,1)}'"]),
    "c_uuid_arr": ("uuid[]", "'{}'", ["'{00000000-0000-0000-0000-000000000000,NULL}'"]),
    "c_interval_arr": ("interval[]", "'{}'", ["'{\"-2 days +01:00:00\",NULL}'"]),
}

CELLS = [(column, value) for column, (_, _, values) in MATRIX.items() for value in values]
COPY, INSERTED, UPDATED = 0, 1000, 2000

# Iceberg has no infinite dates or timestamps: the matrix runs with ``values.infinity: clamp``.
CLAMPED = {K.DATE: (-719162, 2932896), K.TIMESTAMP: (-62135596800000000, 253402300799999999)}
CLAMPED[K.TIMESTAMPTZ] = CLAMPED[K.TIMESTAMP]
INFINITE = {K.DATE: (-INT32_MAX, INT32_MAX), K.TIMESTAMP: (-INT64_MAX, INT64_MAX), K.TIMESTAMPTZ: (-INT64_MAX, INT64_MAX)}
SPARK_MAX_MICROS = INT64_MAX  # a finite timestamp past it is clamped on every target


def _create(dsn: str) -> None:
    columns = ", ".join(f"{name} {pg_type}" for name, (pg_type, _, _) in MATRIX.items())
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(DDL)
        conn.execute(f"CREATE TABLE matrix (id integer PRIMARY KEY, {columns})")
        _insert(conn, COPY)


def _insert(conn: psycopg.Connection[Any], base: int) -> None:
    for i, (column, value) in enumerate(CELLS, start=base + 1):
        conn.execute(f"INSERT INTO matrix (id, {column}) VALUES ({i}, {value})")


def _update(conn: psycopg.Connection[Any]) -> None:
    for i, (column, _value) in enumerate(CELLS, start=UPDATED + 1):
        conn.execute(f"INSERT INTO matrix (id, {column}) VALUES ({i}, {MATRIX[column][1]})")
    for i, (column, value) in enumerate(CELLS, start=UPDATED + 1):
        conn.execute(f"UPDATE matrix SET {column} = {value} WHERE id = {i}")


def _epoch_sql(expr: str, kind: TypeKind) -> str:
    """Days or microseconds since 1970 as text, or 'inf' / '-inf'."""
    finite = (f"({expr} - DATE '1970-01-01')::text" if kind is K.DATE
              else f"(extract(epoch FROM {expr}) * 1000000)::numeric(40,0)::text")
    return f"CASE WHEN {expr} = 'infinity' THEN 'inf' WHEN {expr} = '-infinity' THEN '-inf' ELSE {finite} END"


def _source_sql(name: str, ct: ColumnType) -> str:
    element = ct.element
    if ct.kind in TEXT_KINDS:
        # format() keeps char(n) padding (::text drops it); num_nulls, as a composite of NULLs IS NULL.
        return f"CASE WHEN num_nulls({name}) = 0 THEN format('%s', {name}) END"
    if ct.kind in DATETIMES:
        return _epoch_sql(name, ct.kind)
    if ct.kind is K.LIST and element is not None and element.kind in TEXT_KINDS:
        return f"{name}::text[]"
    if ct.kind is K.LIST and element is not None and element.kind in DATETIMES:
        return f"(SELECT array_agg({_epoch_sql('e', element.kind)} ORDER BY o) FROM unnest({name}) WITH ORDINALITY u(e, o))"
    return name


def _expected_epoch(text: str | None, kind: TypeKind, infinite: bool) -> int | None:
    if text is None:
        return None
    low, high = (INFINITE if infinite else CLAMPED)[kind]
    if text in ("inf", "-inf"):
        return high if text == "inf" else low
    value = int(text)
    return CLAMPED[kind][1] if value > SPARK_MAX_MICROS else value


def _norm(value: Any, ct: ColumnType) -> Any:
    if value is None:
        return None
    if isinstance(value, list):
        assert ct.element is not None
        return [_norm(v, ct.element) for v in value]
    if ct.kind is K.FLOAT:
        return repr(float(struct.unpack("f", struct.pack("f", value))[0]))
    if ct.kind is K.DOUBLE:
        return repr(float(value))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, decimal.Decimal):
        return str(value)
    return value


def _source(dsn: str, infinite: bool) -> tuple[TableSchema, dict[int, tuple[Any, ...]]]:
    with psycopg.connect(dsn) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        schema = read_table_schema(conn, "public.matrix")
        exprs = [_source_sql(c.name, c.type) for c in schema.columns]
        rows = conn.execute(f"SELECT {', '.join(exprs)} FROM matrix").fetchall()
    out = {}
    for row in rows:
        values = []
        for col, value in zip(schema.columns, row, strict=True):
            ct = col.type
            if ct.kind in DATETIMES:
                value = _expected_epoch(value, ct.kind, infinite)
            elif ct.kind is K.LIST and ct.element is not None and ct.element.kind in DATETIMES and value is not None:
                value = [_expected_epoch(v, ct.element.kind, infinite) for v in value]
            else:
                value = _norm(value, ct)
            values.append(value)
        out[row[0]] = tuple(values)
    return schema, out


def _arrow_values(column: pa.ChunkedArray, ct: ColumnType) -> list[Any]:
    """A column as Python values, with dates and timestamps as their raw days / microseconds."""
    raw = {K.DATE: pa.int32(), K.TIMESTAMP: pa.int64(), K.TIMESTAMPTZ: pa.int64()}
    if ct.kind in raw:
        column = column.cast(raw[ct.kind])
    elif ct.kind is K.LIST and ct.element is not None and ct.element.kind in raw:
        column = column.cast(pa.list_(raw[ct.element.kind]))
    return [_norm(v, ct) for v in column.to_pylist()]


def _target(pipeline: Pipeline, schema: TableSchema) -> dict[int, tuple[Any, ...]]:
    target = pipeline.target
    if target.name == "ducklake":
        exprs = []
        for c in schema.columns:
            q = quote_ident(c.name)
            exprs.append(f"{cast_out(q, c.type)} AS {q}")
        with target._lock:  # type: ignore[attr-defined]
            data = target._con.execute(  # type: ignore[attr-defined]
                f"SELECT {', '.join(exprs)} FROM {target._qualified(schema)}"  # type: ignore[attr-defined]
            ).arrow()
        table = data if isinstance(data, pa.Table) else data.read_all()
    else:
        table = _to_arrow(target.read_table(schema).select(*[f"`{c}`" for c in schema.column_names]))
    columns = []
    for c in schema.columns:
        columns.append(_arrow_values(table.column(c.name), c.type))
    return {row[0]: row for row in zip(*columns, strict=True)}


def _compare(pipeline: Pipeline, dsn: str, infinite: bool) -> int:
    schema, expected = _source(dsn, infinite)
    actual = _target(pipeline, schema)
    assert sorted(actual) == sorted(expected), "row ids differ"
    problems = []
    for key, row in expected.items():
        for col, want, got in zip(schema.columns, row, actual[key], strict=True):
            if want != got:
                problems.append(f"row {key} {col.name} ({col.type.pg_type}): source {str(want)[:80]!r},"
                                f" target {str(got)[:80]!r}")
    assert not problems, "\n".join(problems)
    return len(expected)


@pytest.mark.parametrize("target", ["iceberg", "ducklake"])
@pytest.mark.parametrize(("chunk_pages", "engine"), [(4096, "auto"), (1, "auto"), (1, "spark")],
                         ids=["read_by_driver", "read_by_tasks", "spark_lane"])
def test_every_awkward_value_reads_back_the_same_after_copy_insert_and_update(
    source_dsn: str, tmp_path: Path, spark: Any, target: str, chunk_pages: int, engine: str
) -> None:
    # One chunk: the copy reads it before the Spark job; several: the job's tasks read them. The
    # Spark lane (engine: spark): every copy group and batch as Spark jobs.
    _create(source_dsn)
    config = make_config(source_dsn, tmp_path, ["public.matrix"], target, values={"infinity": "clamp"},
                         snapshot={"chunk_pages": chunk_pages}, engine=engine)
    pipeline = Pipeline(config, spark=spark)
    infinite = pipeline.target.keeps_infinity
    run_caught_up(pipeline)
    assert _compare(pipeline, source_dsn, infinite) == len(CELLS)
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        _insert(conn, INSERTED)
        _update(conn)
        conn.execute("ALTER TYPE mood ADD VALUE 'elated' BEFORE 'sad'")  # a label added while streaming
        conn.execute("INSERT INTO matrix (id, c_mood, c_feeling, c_mood_arr) VALUES (3001, 'elated', 'elated',"
                     " '{elated,happy}')")
    run_caught_up(pipeline)
    assert _compare(pipeline, source_dsn, infinite) == 3 * len(CELLS) + 1
    # Counted once per path (copy, insert, update): DuckLake changes only the timestamp past 294247 AD.
    changed = {"c_ts out_of_range_clamped": 3}
    if not infinite:
        changed |= {"c_date infinity_clamped": 6, "c_ts infinity_clamped": 6, "c_tstz infinity_clamped": 6,
                    "c_date_arr infinity_clamped": 3, "c_tstz_arr infinity_clamped": 3}
    assert pipeline.metrics.changed_by_table["public.matrix"] == changed
    scraped = pipeline.metrics.changed_values.labels("public.matrix", "c_ts", "out_of_range_clamped")._value.get()
    assert scraped == 3
    if engine == "spark":
        assert_built_by_spark(pipeline)


def test_a_value_no_list_can_hold_stops_its_table_only_naming_column_value_and_fix(
    source_dsn: str, tmp_path: Path, spark: Any
) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE grid (id integer PRIMARY KEY, cells integer[]);"
                     "CREATE TABLE notes (id integer PRIMARY KEY, body text);"
                     "INSERT INTO grid VALUES (1, '{1,2}'); INSERT INTO notes VALUES (1, 'a')")
    config = make_config(source_dsn, tmp_path, ["public.grid", "public.notes"], "ducklake")
    pipeline = Pipeline(config, spark=spark)
    state = Pipeline(config).setup()
    try:
        with running(pipeline):
            wait_until(lambda: all(r.state is TableState.STREAMING for r in state.tables()), 180, "not streaming")
            with psycopg.connect(source_dsn, autocommit=True) as conn:
                conn.execute("INSERT INTO grid VALUES (2, '{{1,2},{3,4}}')")  # PostgreSQL does not enforce dimensions
                conn.execute("INSERT INTO notes VALUES (2, 'b')")

            def grid_errored() -> bool:
                return any(r.qualified_name == "public.grid" and r.state is TableState.ERRORED for r in state.tables())

            wait_until(grid_errored, 120, "grid did not stop")
            wait_until(lambda: assert_same(pipeline, source_dsn, "public.notes") == 2, 60, "notes stopped too")
            grid = next(r for r in state.tables() if r.qualified_name == "public.grid")
            error = grid.error or ""
    finally:
        state.close()
    assert "public.grid column cells: value '{{1,2},{3,4}}' cannot be stored as array<int> (integer[])" in error
    assert "one-dimensional" in error and "headrace resync public.grid" in error
    assert "Traceback" not in error
    assert grid.error_kind == "terminal" and grid.waits_for_operator  # a value only a person can fix


def test_generated_columns_left_out_by_copy_and_stream_and_check_names_them_and_declared_dimensions(
    source_dsn: str, tmp_path: Path, spark: Any
) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE priced (id integer PRIMARY KEY, net numeric(10,2),"
                     " gross numeric(10,2) GENERATED ALWAYS AS (net * 1.2) STORED, grid integer[][]);"
                     "INSERT INTO priced (id, net) VALUES (1, 10)")
        found = assess_table(conn, "public.priced", set())
    assert found["generated_not_replicated"] == ["gross"] and found["multi_dimensional_arrays"] == ["grid"]
    text = format_assessment("t", {"problems": [], "tables": [found]})
    assert "generated columns not replicated" in text and "declared multi-dimensional" in text
    pipeline = Pipeline(make_config(source_dsn, tmp_path, ["public.priced"], "ducklake"), spark=spark)
    run_caught_up(pipeline)
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO priced (id, net) VALUES (2, 20); UPDATE priced SET net = 11 WHERE id = 1")
    run_caught_up(pipeline)
    assert assert_same(pipeline, source_dsn, "public.priced") == 2  # the columns both paths carry
    target = pipeline.target
    with psycopg.connect(source_dsn) as conn:
        schema = read_table_schema(conn, "public.priced")
    with target._lock:  # type: ignore[attr-defined]
        names = [d[0] for d in target._con.execute(  # type: ignore[attr-defined]
            f"SELECT * FROM {target._qualified(schema)} LIMIT 0").description]  # type: ignore[attr-defined]
    assert "gross" not in names and "net" in names
