"""DuckLake target against real lakes: DuckDB-file, SQLite and PostgreSQL catalogs, real Spark.

What every target does (changes, TOAST, replays, truncates, keyless tables) is in test_contract.py;
here what only DuckLake has: catalog kinds, Spark's files registered, plain DuckDB reading it back.
"""

from __future__ import annotations

import datetime as dt
import decimal
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pytest

from headrace.core.errors import ConfigError, TransientError, ValueNotStorableError
from headrace.core.position import Position
from headrace.core.schema import Column, ColumnType, TableSchema, TypeKind
from headrace.materialize.error_boundary import classify
from headrace.source.postgres.throwaway import ThrowawayPostgres
from headrace.targets.ducklake import batches, extension
from headrace.targets.ducklake.config import DuckLakeConfig
from headrace.targets.ducklake.files import SNAPSHOT_FOLDER
from headrace.targets.ducklake.target import CURSOR_TABLE, DuckLakeTarget

UTC = dt.timezone.utc
TS = dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)


def ct(kind: TypeKind, **kw: Any) -> ColumnType:
    return ColumnType(kind, kind.value, **kw)


SIMPLE = TableSchema(
    oid=1001,
    schema="public",
    name="items",
    columns=(
        Column("id", ct(TypeKind.INT), 23, nullable=False),
        Column("name", ct(TypeKind.STRING), 25),
        Column("doc", ct(TypeKind.STRING), 25),  # stands for a TOAST column
    ),
    key=("id",),
)

ALL_TYPES = TableSchema(
    oid=1002,
    schema="public",
    name="all_types",
    columns=(
        Column("id", ct(TypeKind.INT), 23, nullable=False),
        Column("c_long", ct(TypeKind.LONG), 20),
        Column("c_float", ct(TypeKind.FLOAT), 700),
        Column("c_double", ct(TypeKind.DOUBLE), 701),
        Column("c_dec", ct(TypeKind.DECIMAL, precision=12, scale=3), 1700),
        Column("c_bool", ct(TypeKind.BOOLEAN), 16),
        Column("c_str", ct(TypeKind.STRING), 25),
        Column("c_uuid", ct(TypeKind.UUID), 2950),
        Column("c_json", ct(TypeKind.JSON), 3802),
        Column("c_interval", ct(TypeKind.INTERVAL), 1186),
        Column("c_time", ct(TypeKind.TIME), 1083),
        Column("c_date", ct(TypeKind.DATE), 1082),
        Column("c_ts", ct(TypeKind.TIMESTAMP), 1114),
        Column("c_tstz", ct(TypeKind.TIMESTAMPTZ), 1184),
        Column("c_bin", ct(TypeKind.BINARY), 17),
        Column("c_ints", ct(TypeKind.LIST, element=ct(TypeKind.INT)), 1007),
        Column("c_uuids", ct(TypeKind.LIST, element=ct(TypeKind.UUID)), 2951),
    ),
    key=("id",),
)

U1 = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
ALL_ROWS = [
    (
        1,
        9_000_000_000,
        1.5,
        2.25,
        decimal.Decimal("123456789.123"),
        True,
        "héllo",
        U1,
        '{"a": 1, "b": [1, 2]}',
        "1 year 2 mons 3 days 04:05:06.789",
        "04:05:06.789",
        dt.date(2024, 2, 29),
        dt.datetime(2024, 1, 2, 3, 4, 5, 123456),
        dt.datetime(2024, 1, 2, 3, 4, 5, 654321, tzinfo=UTC),
        b"\x00\xff",
        [1, None, 3],
        [U1],
    ),
    (
        2,
        -1,
        -0.5,
        1e300,
        decimal.Decimal("-0.001"),
        False,
        "",
        None,
        "[]",
        "-1 years -2 mons +3 days -04:05:06",
        "24:00:00",
        dt.date(1, 1, 1),
        dt.datetime(1970, 1, 1),
        dt.datetime(1999, 12, 31, 23, 59, 59, tzinfo=UTC),
        b"",
        [],
        None,
    ),
    (3, *([None] * 16)),
]
# What plain DuckDB shows for rows 1 and 2 (CAST(... AS VARCHAR)), and the stored types.
ALL_DUCK_TEXT = {
    1: {
        "c_uuid": U1,
        "c_json": '{"a": 1, "b": [1, 2]}',
        "c_interval": "1 year 2 mons 3 days 04:05:06.789",
        "c_time": "04:05:06.789",
        "c_ts": "2024-01-02 03:04:05.123456",
        "c_tstz": "2024-01-02 03:04:05.654321+00",
        "c_dec": "123456789.123",
        "c_ints": "[1, NULL, 3]",
        "c_uuids": f"[{U1}]",
    },
    2: {"c_interval": "-1 years -2 mons +3 days -04:05:06", "c_time": "24:00:00", "c_date": "0001-01-01"},
}
ALL_DUCK_TYPES = {
    "id": "INTEGER",
    "c_long": "BIGINT",
    "c_float": "FLOAT",
    "c_double": "DOUBLE",
    "c_dec": "DECIMAL(12,3)",
    "c_bool": "BOOLEAN",
    "c_str": "VARCHAR",
    "c_uuid": "UUID",
    "c_json": "JSON",
    "c_interval": "VARCHAR",
    "c_time": "TIME",
    "c_date": "DATE",
    "c_ts": "TIMESTAMP",
    "c_tstz": "TIMESTAMP WITH TIME ZONE",
    "c_bin": "BLOB",
    "c_ints": "INTEGER[]",
    "c_uuids": "UUID[]",
    "_hr_lsn": "BIGINT",
    "_hr_seq": "BIGINT",
    "_hr_commit_ts": "TIMESTAMP WITH TIME ZONE",
}


def spark_schema(table: TableSchema, batch: bool) -> Any:
    from pyspark.sql import types as T

    from headrace.targets.ducklake.types import spark_type

    fields = [T.StructField(c.name, spark_type(c.type)) for c in table.columns]
    fields += [
        T.StructField("_hr_lsn", T.LongType()),
        T.StructField("_hr_seq", T.LongType()),
        T.StructField("_hr_commit_ts", T.TimestampType()),
    ]
    if batch:
        fields += [T.StructField("_hr_op", T.StringType()), T.StructField("_hr_unchanged", T.StringType())]
    return T.StructType(fields)


def snapshot_df(spark: Any, table: TableSchema, rows: list[tuple[Any, ...]], lsn: int = 100) -> Any:
    return spark.createDataFrame([(*r, lsn, 0, TS) for r in rows], spark_schema(table, batch=False))


def batch_df(spark: Any, table: TableSchema, rows: list[tuple[Any, ...]]) -> Any:
    """rows: (op, lsn, seq, unchanged, *values)."""
    data = [(*values, lsn, seq, TS, op, unchanged) for op, lsn, seq, unchanged, *values in rows]
    return spark.createDataFrame(data, spark_schema(table, batch=True))


def settings_for(kind: str, tmp_path: Path, pg: ThrowawayPostgres | None = None) -> DuckLakeConfig:
    data = str(tmp_path / "data")
    if kind == "duckdb":
        return DuckLakeConfig.model_validate({"catalog": str(tmp_path / "meta.ducklake"), "data_path": data})
    if kind == "sqlite":
        return DuckLakeConfig.model_validate(
            {"catalog": f"sqlite:{tmp_path / 'meta.sqlite'}", "data_path": data}
        )
    assert pg is not None
    name = f"lake_{os.getpid()}_{tmp_path.name[-12:].replace('-', '_')}".lower()
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    catalog = f"postgres:dbname={name} host=127.0.0.1 port={pg.port} user=postgres"
    return DuckLakeConfig.model_validate({"catalog": catalog, "data_path": data})


def plain_duckdb(settings: DuckLakeConfig) -> duckdb.DuckDBPyConnection:
    """A connection that knows nothing of headrace: ATTACH 'ducklake:...' by hand."""
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    for ext in ("ducklake", "postgres_scanner", "sqlite_scanner"):
        con.execute(f"LOAD '{extension.extension_path(ext)}'")
    location = extension.parse_catalog(settings.catalog).location
    con.execute(f"ATTACH 'ducklake:{location}' AS lake (DATA_PATH '{settings.data_path}', READ_ONLY)")
    return con


@pytest.fixture
def lake(tmp_path: Path) -> Iterator[DuckLakeConfig]:
    yield settings_for("duckdb", tmp_path)


@pytest.fixture
def target(spark: Any, lake: DuckLakeConfig) -> Iterator[DuckLakeTarget]:
    """This module's DuckLake target (in place of the contract suite's, parametrised over kinds)."""
    t = DuckLakeTarget(spark, lake, "p1")
    t.ensure_table(SIMPLE)
    yield t
    t.close()


def rows_of(target: DuckLakeTarget, table: TableSchema) -> dict[int, tuple[Any, ...]]:
    return {r[0]: tuple(r) for r in target.read_table(table).collect()}


# -- catalogs -------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["duckdb", "sqlite", "postgres"])
def test_catalog_kinds_snapshot_and_apply(
    kind: str, spark: Any, tmp_path: Path, pg_server: ThrowawayPostgres
) -> None:
    settings = settings_for(kind, tmp_path, pg_server)
    target = DuckLakeTarget(spark, settings, "p1")
    try:
        assert target.ensure_table(SIMPLE) == "public.items"
        assert (
            target.write_snapshot(
                SIMPLE, snapshot_df(spark, SIMPLE, [(1, "a", "x"), (2, "b", "y")]), Position(100)
            )
            == 2
        )
        target.apply_batch(SIMPLE, batch_df(spark, SIMPLE, [("U", 200, 0, None, 1, "A", "X")]), None, 7)
        assert target.read_cursor(SIMPLE) == 7
    finally:
        target.close()
    con = plain_duckdb(settings)
    assert con.execute("SELECT id, name FROM lake.public.items ORDER BY id").fetchall() == [
        (1, "A"),
        (2, "b"),
    ]


def test_bad_catalog_error_names_catalog(spark: Any, tmp_path: Path) -> None:
    settings = DuckLakeConfig.model_validate(
        {
            "catalog": "postgres:dbname=nope host=127.0.0.1 port=1 user=x password=secret",
            "data_path": str(tmp_path),
        }
    )
    with pytest.raises((ConfigError, TransientError), match="dbname=nope") as info:
        DuckLakeTarget(spark, settings, "p1")
    assert "secret" not in str(info.value)


# -- snapshot -------------------------------------------------------------------------------------
def test_snapshot_registers_spark_files_and_replaces_partial_copy(
    spark: Any, target: DuckLakeTarget, lake: DuckLakeConfig
) -> None:
    root = Path(lake.data_path) / SNAPSHOT_FOLDER / "public" / "items"
    crashed = root / "crashed-attempt"  # a copy that died before registering its files
    crashed.mkdir(parents=True)
    (crashed / "part-0.parquet").write_bytes(b"junk")
    assert target.write_snapshot(SIMPLE, snapshot_df(spark, SIMPLE, [(1, "a", "x")]), Position(100)) == 1
    rows = [(i, f"n{i}", None) for i in range(1, 501)]
    assert target.write_snapshot(SIMPLE, snapshot_df(spark, SIMPLE, rows), Position(100)) == 500
    assert not crashed.exists()
    assert len(list(root.iterdir())) == 2  # the first copy stays: older lake snapshots still use it
    target.close()  # a DuckDB file catalog is opened by one DuckDB instance per process at a time
    con = plain_duckdb(lake)
    assert con.execute("SELECT count(*), count(DISTINCT id) FROM lake.public.items").fetchone() == (500, 500)
    files = [
        r[0]
        for r in con.execute(
            "SELECT data_file FROM ducklake_list_files('lake', 'items', schema => 'public')"
        ).fetchall()
    ]
    assert files and all(f.startswith(str(root)) for f in files)  # registered, not rewritten


def test_every_type_round_trips(spark: Any, lake: DuckLakeConfig) -> None:
    target = DuckLakeTarget(spark, lake, "p1")
    try:
        # Row 1 and 3 by snapshot (DuckDB copies from Spark's files with casts), row 2 by apply.
        assert (
            target.write_snapshot(
                ALL_TYPES, snapshot_df(spark, ALL_TYPES, [ALL_ROWS[0], ALL_ROWS[2]]), Position(100)
            )
            == 2
        )
        target.apply_batch(
            ALL_TYPES, batch_df(spark, ALL_TYPES, [("I", 200, 0, None, *ALL_ROWS[1])]), None, 1
        )
        back = {r[0]: tuple(r)[:17] for r in target.read_table(ALL_TYPES).collect()}
    finally:
        target.close()
    tstz = ALL_TYPES.column_names.index("c_tstz")
    for row in ALL_ROWS:
        got = list(back[row[0]])
        if got[tstz] is not None:  # Spark collects TimestampType as naive local time
            got[tstz] = got[tstz].astimezone(UTC)
        assert tuple(got) == row
    snapshot_root = Path(lake.data_path) / SNAPSHOT_FOLDER / "public" / "all_types"
    assert not any(snapshot_root.iterdir())  # the cast route leaves no Spark files behind
    con = plain_duckdb(lake)
    types = dict(
        con.execute(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_catalog = 'lake' AND table_name = 'all_types'"
        ).fetchall()
    )
    assert types == ALL_DUCK_TYPES
    for rid, expected in ALL_DUCK_TEXT.items():
        cols = ", ".join(f"CAST({c} AS VARCHAR)" for c in expected)
        text = con.execute(f"SELECT {cols} FROM lake.public.all_types WHERE id = ?", [rid]).fetchone()
        assert text is not None
        assert dict(zip(expected, text, strict=True)) == expected


def test_failure_mid_transaction_changes_nothing(
    spark: Any, target: DuckLakeTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    target.write_snapshot(SIMPLE, snapshot_df(spark, SIMPLE, [(1, "a", "x"), (2, "b", "y")]), Position(100))
    target.apply_batch(SIMPLE, batch_df(spark, SIMPLE, [("I", 150, 0, None, 3, "c", "z")]), None, 1)
    before = rows_of(target, SIMPLE)

    def crash(*args: Any) -> None:
        raise RuntimeError("killed after the data statements, before the cursor")

    monkeypatch.setattr(batches, "write_cursors", crash)
    batch = batch_df(spark, SIMPLE, [("U", 200, 0, None, 1, "a2", "x2"), ("D", 200, 1, None, 2, None, None)])
    with pytest.raises(RuntimeError):
        target.apply_batch(SIMPLE, batch, Position(120), 2)
    monkeypatch.undo()
    assert rows_of(target, SIMPLE) == before
    assert target.read_cursor(SIMPLE) == 1
    # A DuckDB error mid-way (bad JSON cast) rolls back too; the run loop's error boundary then
    # classifies it (a value the target cannot hold, naming the column).
    bad = batch_df(spark, ALL_TYPES, [("I", 200, 0, None, 9, *([None] * 7), "{not json", *([None] * 8))])
    target.ensure_table(ALL_TYPES)
    with pytest.raises(duckdb.ConversionException) as info:
        target.apply_batch(ALL_TYPES, bad, None, 3)
    failure = classify(info.value, ALL_TYPES.qualified_name)
    assert isinstance(failure.error, ValueNotStorableError) and "c_json" in failure.message, failure
    assert ALL_TYPES.qualified_name in failure.message
    assert target.read_cursor(ALL_TYPES) is None
    # the failed plan ran without the join filter (a small table): the rollback gave it back
    assert target._con.execute("SELECT current_setting('disabled_optimizers')").fetchone() == ("",)
    target.apply_batch(SIMPLE, batch, None, 2)  # the connection is usable afterwards
    assert sorted(rows_of(target, SIMPLE)) == [1, 3]


def test_drop_table_removes_cursor(spark: Any, target: DuckLakeTarget, lake: DuckLakeConfig) -> None:
    target.apply_batch(SIMPLE, batch_df(spark, SIMPLE, [("I", 200, 0, None, 1, "a", "x")]), None, 1)
    target.drop_table(SIMPLE)
    assert target.read_cursor(SIMPLE) is None
    target.close()
    con = plain_duckdb(lake)
    assert con.execute(f"SELECT count(*) FROM {CURSOR_TABLE.replace('hr_lake', 'lake')}").fetchone() == (0,)
    assert con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'items'").fetchone() == (0,)
