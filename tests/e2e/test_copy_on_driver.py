"""A small table's copy written by DuckDB from the driver's Arrow (no Spark job) holds exactly what
the Spark path writes: every awkward value of the type matrix, compared value for value.

Each matrix value is tried alone first: ``driver_rows`` takes it, or hands its chunk to Spark (a
value only Spark's casts decide: infinities, BC and far-future dates and timestamps, arrays). The
taken values then go, as one table, through both paths into two DuckLake tables.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa

from headrace.core.names import quote_ident
from headrace.core.position import Position
from headrace.core.schema import TableSchema, TypeKind
from headrace.core.spark_types import ValueRules
from headrace.engines.chunks import driver_rows, prefetched
from headrace.engines.spark.copy import chunk_dataframe
from headrace.source.postgres.catalog import read_table_schema
from headrace.source.postgres.copy import OPEN_END
from headrace.source.postgres.source import chunk_reader
from headrace.targets.ducklake.target import DuckLakeTarget
from headrace.targets.ducklake.types import cast_out
from tests.e2e.test_type_matrix import DDL, MATRIX
from tests.targets.test_ducklake_target import plain_duckdb, settings_for

POSITION = Position(0x1_0000_0042, 0)
# Values only Spark's casts decide (the range rules): the driver must hand them over.
SPARK_ONLY = {
    ("c_date", "'0044-03-15 BC'"), ("c_date", "'4713-11-24 BC'"), ("c_date", "'5874897-12-31'"),
    ("c_date", "'infinity'"), ("c_date", "'-infinity'"),
    ("c_ts", "'4713-11-24 00:00:00 BC'"), ("c_ts", "'294276-12-31 23:59:59.999999'"), ("c_ts", "'infinity'"),
    ("c_ts", "'-infinity'"), ("c_tstz", "'0044-03-15 12:00:00+00 BC'"), ("c_tstz", "'infinity'"),
    ("c_tstz", "'-infinity'"),
}


def _scalar_columns() -> dict[str, str]:
    return {name: pg_type for name, (pg_type, _, _) in MATRIX.items()
            if not pg_type.endswith("[]") and name != "c_intlist"}


def create_cell_table(conn: Any, name: str) -> int:
    """Table ``name``: every scalar matrix value the driver takes (not the ``SPARK_ONLY`` ones), one a
    row in its own column, keyed by ``id`` from 1; the number of rows."""
    columns = _scalar_columns()
    cells = [(c, v) for c in columns for v in MATRIX[c][2] if (c, v) not in SPARK_ONLY]
    conn.execute(DDL)
    conn.execute(f"CREATE TABLE {name} (id integer PRIMARY KEY, {', '.join(f'{n} {t}' for n, t in columns.items())})")
    for i, (column, value) in enumerate(cells, start=1):
        conn.execute(f"INSERT INTO {name} (id, {column}) VALUES ({i}, {value})")
    return len(cells)


def _read(dsn: str, table: TableSchema) -> Any:
    reader = chunk_reader(dsn, None, table, binary=True)
    return prefetched(reader, 0, OPEN_END)


def _values(con: Any, qualified: str, table: TableSchema) -> list[tuple[str, ...]]:
    """Every row as text, which tells apart what ``=`` does not (-0.0 from 0.0; an instant, not its
    rendering in a zone), with the column types DuckDB holds."""
    exprs = []
    for c in table.columns:
        q = quote_ident(c.name)
        if c.type.kind is TypeKind.TIMESTAMPTZ:
            exprs.append(f"CAST(epoch_us({q}) AS VARCHAR)")
        else:
            exprs.append(f"CAST({cast_out(q, c.type)} AS VARCHAR)")
    exprs += ["CAST(_hr_lsn AS VARCHAR)", "CAST(_hr_seq AS VARCHAR)", "CAST(_hr_commit_ts AS VARCHAR)",
              "typeof(" + ") || typeof(".join(quote_ident(c.name) for c in table.columns) + ")"]
    return sorted(con.execute(f"SELECT {', '.join(exprs)} FROM {qualified}").fetchall(), key=repr)


def test_driver_path_takes_every_value_it_can_and_writes_what_spark_writes(
    source_dsn: str, tmp_path: Path, spark: Any
) -> None:
    columns = _scalar_columns()
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute(DDL)
        conn.execute(f"CREATE TABLE one (id integer PRIMARY KEY, {', '.join(f'{n} {t}' for n, t in columns.items())})")
        conn.execute("CREATE TABLE taken (LIKE one)")
        one = read_table_schema(conn, "public.one")
        handed_over = set()
        for column, (_, _, values) in MATRIX.items():
            if column not in columns:
                continue
            for value in values:
                conn.execute(f"INSERT INTO one (id, {column}) VALUES (1, {value})")
                if driver_rows(one, _read(source_dsn, one), POSITION) is None:
                    handed_over.add((column, value))
                else:
                    conn.execute("INSERT INTO taken SELECT count(*) OVER () + (SELECT count(*) FROM taken), "
                                 f"{', '.join(columns)} FROM one")
                conn.execute("DELETE FROM one")
        taken = read_table_schema(conn, "public.taken")
        conn.execute("INSERT INTO taken (id) VALUES (100000)")  # a row of NULLs
        n = conn.execute("SELECT count(*) FROM taken").fetchone()[0]  # type: ignore[index]
    assert handed_over == SPARK_ONLY
    assert n == sum(len(MATRIX[c][2]) for c in columns) - len(SPARK_ONLY) + 1

    reader = _read(source_dsn, taken)
    rows = driver_rows(taken, reader, POSITION)
    assert rows is not None and rows.num_rows == n
    settings = settings_for("duckdb", tmp_path)
    target = DuckLakeTarget(spark, settings, "p1")
    by_spark = dataclasses.replace(taken, target_as=("public", "by_spark"))
    by_driver = dataclasses.replace(taken, target_as=("public", "by_driver"))
    try:
        df = chunk_dataframe(spark, taken, reader, [(0, OPEN_END)], POSITION,
                             ValueRules("public.taken", "clamp", keep_infinity=True))
        assert target.write_snapshot(by_spark, df, POSITION) == n
        assert target.write_snapshot_arrow(by_driver, rows) == n
        assert target.write_snapshot_arrow(by_driver, rows) == n  # replace: the earlier copy goes
    finally:
        target.close()
    con = plain_duckdb(settings)
    try:
        spark_rows = _values(con, "lake.public.by_spark", taken)
        driver_rows_ = _values(con, "lake.public.by_driver", taken)
    finally:
        con.close()
    assert len(spark_rows) == n
    assert driver_rows_ == spark_rows


def test_numeric_outside_its_typmod_text_and_non_finite_go_to_spark(source_dsn: str) -> None:
    """numeric(p,s) is taken only where Arrow reads the exact decimal; NaN is Spark's (its error)."""
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE money (id integer PRIMARY KEY, amount numeric(6,2), free numeric)")
        conn.execute("INSERT INTO money VALUES (1, 1234.5, 1e-300), (2, -0.01, 'NaN'), (3, NULL, NULL)")
        table = read_table_schema(conn, "public.money")
    rows = driver_rows(table, _read(source_dsn, table), POSITION)
    assert rows is not None
    assert rows.column("amount").type == pa.decimal128(6, 2)
    assert [str(v) if v is not None else None for v in rows.column("amount").to_pylist()] == ["1234.50", "-0.01", None]
    assert rows.column("free").to_pylist()[1] == "NaN"  # unconstrained numeric is text in every target
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO money VALUES (4, 'NaN', 1)")
    assert driver_rows(table, _read(source_dsn, table), POSITION) is None
