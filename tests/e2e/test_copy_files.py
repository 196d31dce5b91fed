"""The copy written as Parquet by pyarrow (in the copy's tasks, or on the driver for a small table)
and registered by the target holds exactly what Spark's path writes: every value of the type matrix
``driver_rows`` takes, on Iceberg (read back by DuckDB's iceberg extension and by Spark) and on
DuckLake (read back by a plain DuckDB). A chunk with a value only Spark's casts decide is handed back.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from headrace.control.status import pipeline_status
from headrace.core.names import quote_ident
from headrace.core.schema import TableSchema, TypeKind
from headrace.core.spark_types import ValueRules
from headrace.engines.chunks import driver_rows
from headrace.engines.spark.copy import chunk_dataframe, copy_chunks_to_files
from headrace.materialize.file_copy import CHUNKS_PER_TASK
from headrace.pipeline import Pipeline
from headrace.readers import duckdb_with, iceberg_metadata_location
from headrace.source.postgres.catalog import read_table_schema
from headrace.source.postgres.copy import OPEN_END
from headrace.source.postgres.source import chunk_reader
from headrace.targets.ducklake.files import SNAPSHOT_FOLDER
from headrace.targets.ducklake.target import DuckLakeTarget
from headrace.targets.iceberg.config import IcebergConfig
from headrace.targets.iceberg.target import IcebergTarget
from tests.e2e.helpers import assert_same, copy_connections, make_config, running, wait_until
from tests.e2e.test_copy_on_driver import POSITION, _read, _values, create_cell_table
from tests.e2e.test_pipeline import run_caught_up
from tests.targets.test_ducklake_target import plain_duckdb, settings_for

_catalogs = itertools.count()
CHUNKS = [(0, 1), (1, OPEN_END)]  # two tasks; the second finds no rows when the table fits one page


def _taken(dsn: str) -> tuple[TableSchema, int]:
    """``public.taken``: every matrix value ``driver_rows`` takes (test_copy_on_driver checks which),
    one a row, and a row of NULLs; its schema and row count."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        n = create_cell_table(conn, "taken")
        conn.execute("INSERT INTO taken (id) VALUES (100000)")
        return read_table_schema(conn, "public.taken"), n + 1


def _named(table: TableSchema, name: str) -> TableSchema:
    return dataclasses.replace(table, target_as=("public", name))


def _iceberg_values(settings: IcebergConfig, names: list[str], table: TableSchema) -> list[list[tuple[Any, ...]]]:
    """Every row of each table as text, by DuckDB's iceberg extension (not ours), with DuckDB's types."""
    exprs = []
    for c in table.columns:
        q = quote_ident(c.name)
        exprs.append(f"CAST(epoch_us({q}) AS VARCHAR)" if c.type.kind is TypeKind.TIMESTAMPTZ
                     else f"CAST({q} AS VARCHAR)")
    exprs += ["CAST(_hr_lsn AS VARCHAR)", "CAST(_hr_seq AS VARCHAR)", "CAST(_hr_commit_ts AS VARCHAR)",
              "typeof(" + ") || typeof(".join(quote_ident(c.name) for c in table.columns) + ")"]
    con = duckdb_with("avro", "iceberg")
    try:
        return [sorted(con.execute(f"SELECT {', '.join(exprs)} FROM iceberg_scan("
                                   f"'{iceberg_metadata_location(settings, 'public', name)}')").fetchall(), key=repr)
                for name in names]
    finally:
        con.close()


def test_iceberg_copy_files_and_driver_copy_hold_what_spark_writes(source_dsn: str, tmp_path: Path,
                                                                    spark: Any) -> None:
    taken, n = _taken(source_dsn)
    settings = IcebergConfig(warehouse=str(tmp_path / "wh"), catalog_name=f"hr_files_{next(_catalogs)}")
    target = IcebergTarget(spark, settings, "p1")
    reader = _read(source_dsn, taken)
    rows = driver_rows(taken, reader, POSITION)
    assert rows is not None and rows.num_rows == n
    df = chunk_dataframe(spark, taken, reader, [(0, OPEN_END)], POSITION,
                         ValueRules("public.taken", "clamp", keep_infinity=False))
    assert target.write_snapshot(_named(taken, "by_spark"), df, POSITION) == n
    assert target.write_snapshot_arrow(_named(taken, "by_driver"), rows) == n
    assert target.write_snapshot_arrow(_named(taken, "by_driver"), rows) == n  # replace: the earlier copy goes
    by_files = _named(taken, "by_files")
    sink = target.copy_sink(by_files, replace=True)
    assert sink is not None and sink.field_ids
    done = copy_chunks_to_files(spark, taken, chunk_reader(source_dsn, None, taken, True), CHUNKS, POSITION, sink)
    assert [c.chunk for c in done] == [0, 1] and not any(c.needs_spark for c in done)
    written = [c.file for c in done if c.file is not None]
    assert sum(w.rows for w in written) == n
    assert target.register_copy_files(by_files, sink, written, replace=True) == n
    assert target.register_copy_files(by_files, sink, written[:0], replace=False) == n  # an empty append

    by_spark, by_driver, by_files_rows = _iceberg_values(settings, ["by_spark", "by_driver", "by_files"], taken)
    assert len(by_spark) == n
    assert by_driver == by_spark
    assert by_files_rows == by_spark
    # Spark sees the Java API's commit through its cached table, and reads the same rows.
    assert sorted(map(repr, target.read_table(by_files).collect())) == \
        sorted(map(repr, target.read_table(_named(taken, "by_spark")).collect()))


def test_ducklake_copy_files_hold_what_spark_writes_and_hand_back_spark_only_chunks(
        source_dsn: str, tmp_path: Path, spark: Any) -> None:
    taken, n = _taken(source_dsn)
    settings = settings_for("duckdb", tmp_path)
    target = DuckLakeTarget(spark, settings, "p1")
    try:
        reader = _read(source_dsn, taken)
        df = chunk_dataframe(spark, taken, reader, [(0, OPEN_END)], POSITION,
                             ValueRules("public.taken", "clamp", keep_infinity=True))
        assert target.write_snapshot(_named(taken, "by_spark"), df, POSITION) == n
        by_files = _named(taken, "by_files")
        target.ensure_table(by_files)
        sink = target.copy_sink(by_files, replace=True)
        assert sink is not None
        done = copy_chunks_to_files(spark, taken, chunk_reader(source_dsn, None, taken, True), CHUNKS, POSITION,
                                    sink)
        written = [c.file for c in done if c.file is not None]
        assert target.register_copy_files(by_files, sink, written, replace=True) == n

        # A chunk holding a date only Spark's range rules decide comes back undone.
        with psycopg.connect(source_dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE dates (id int PRIMARY KEY, d date, pad text)")
            conn.execute("INSERT INTO dates SELECT g, '2024-01-01'::date + g, repeat('x', 200)"
                         " FROM generate_series(1, 200) g")
            conn.execute("INSERT INTO dates VALUES (1000, 'infinity', 'last page')")
            pages = conn.execute("SELECT (ctid::text::point)[0]::int FROM dates WHERE id = 1000").fetchone()[0]  # type: ignore[index]
            dates = read_table_schema(conn, "public.dates")
        assert pages >= 1
        target.ensure_table(dates)
        dates_sink = target.copy_sink(dates, replace=True)
        assert dates_sink is not None
        done = copy_chunks_to_files(spark, dates, chunk_reader(source_dsn, None, dates, True),
                                    [(0, pages), (pages, OPEN_END)], POSITION, dates_sink)
        assert [c.needs_spark for c in done] == [False, True]
        assert done[0].file is not None and done[1].file is None
    finally:
        target.close()
    assert_same_values(settings, taken, "by_files", "by_spark")


def test_a_chunk_only_spark_decides_is_copied_by_spark_beside_the_task_files(
        source_dsn: str, tmp_path: Path, spark: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A table of several chunks on Iceberg: the chunk holding an infinite date goes through Spark's
    casts (clamped to 9999-12-31 under `values.infinity: clamp`), the others as task files; every row arrives once."""
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE spans (id int PRIMARY KEY, d date, pad text)")
        conn.execute("INSERT INTO spans SELECT g, '2024-01-01'::date + g, repeat('x', 300) FROM generate_series(1, 400) g")
        conn.execute("INSERT INTO spans VALUES (1000, 'infinity', 'last page')")
        spans = read_table_schema(conn, "public.spans")
    config = make_config(source_dsn, tmp_path, ["public.spans"], "iceberg",
                         snapshot={"chunk_pages": 4, "max_connections": 3}, values={"infinity": "clamp"})
    pipeline = Pipeline(config, spark=spark)
    with caplog.at_level(logging.INFO, logger="headrace.snapshot"):
        run_caught_up(pipeline)
    assert [r.getMessage() for r in caplog.records].count("snapshot.spark_chunks") == 1
    (table,) = pipeline_status(config)["tables"]
    assert table["snapshot"]["chunks_total"] > 3
    got = {r["id"]: r["d"] for r in pipeline.target.read_table(spans).collect()}
    assert got == {**{g: date(2024, 1, 1) + timedelta(days=g) for g in range(1, 401)}, 1000: date(9999, 12, 31)}


def test_a_big_table_copies_in_overlapping_jobs_within_max_connections(
        source_dsn: str, tmp_path: Path, spark: Any, caplog: pytest.LogCaptureFixture) -> None:
    """DuckLake, many chunks: a group's job runs while the one before commits, and the source never
    sees more than max_connections copy connections. The uuid column makes DuckLake copy each group's
    files in and delete them, one by one: never the files of the next group in the same folder."""
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE wide (id int PRIMARY KEY, u uuid, pad text)")
        conn.execute("INSERT INTO wide SELECT g, md5(g::text)::uuid, repeat('x', 300) FROM generate_series(1, 600) g")
    config = make_config(source_dsn, tmp_path, ["public.wide"], "ducklake",
                         snapshot={"chunk_pages": 2, "max_connections": 3})
    pipeline = Pipeline(config, spark=spark)
    with copy_connections(source_dsn) as seen, caplog.at_level(logging.INFO, logger="headrace.snapshot"):
        run_caught_up(pipeline)
    progress = [r for r in caplog.records if r.getMessage() == "snapshot.progress"]
    (table,) = pipeline_status(config)["tables"]
    assert table["snapshot"]["chunks_total"] >= 3 * 2 * CHUNKS_PER_TASK  # 3+ groups of 2 tasks' chunks
    assert len(progress) == -(-table["snapshot"]["chunks_total"] // (2 * CHUNKS_PER_TASK))
    assert max(seen) <= 3, f"the copy held {max(seen)} source connections with max_connections 3: {seen.sessions}"
    assert assert_same(pipeline, source_dsn, "public.wide") == 600
    copies = Path(config.target.settings.data_path) / SNAPSHOT_FOLDER  # type: ignore[union-attr]
    assert not [f for f in copies.rglob("*") if f.is_file()], "copied-in files left behind"


def test_a_copy_of_several_files_is_merged_by_a_maintenance_pass_as_soon_as_it_streams(
        source_dsn: str, tmp_path: Path, spark: Any, caplog: pytest.LogCaptureFixture) -> None:
    """DuckLake registers a copy's files as they are, a file a chunk; every change batch then writes a
    delete file for each file it touches. The table's first maintenance pass runs once it streams
    (``DuckLakeTarget.copy_finished``), not an hour later, and leaves one file."""
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE parts (id int PRIMARY KEY, pad text)")
        conn.execute("INSERT INTO parts SELECT g, repeat('x', 300) FROM generate_series(1, 600) g")
        parts = read_table_schema(conn, "public.parts")
    config = make_config(source_dsn, tmp_path, ["public.parts"], "ducklake",
                         snapshot={"chunk_pages": 4, "max_connections": 3})
    pipeline = Pipeline(config, spark=spark)
    with caplog.at_level(logging.INFO, logger="headrace.maintenance"), running(pipeline):
        wait_until(lambda: [r for r in caplog.records if r.getMessage() == "maintenance.done"], 120,
                   "the first maintenance pass")
        (done,) = [r for r in caplog.records if r.getMessage() == "maintenance.done"]
        assert done.__dict__["before"]["data_files"] > 3, done.__dict__
        assert done.__dict__["after"]["data_files"] == 1, done.__dict__
        with psycopg.connect(source_dsn, autocommit=True) as conn:
            conn.execute("UPDATE parts SET pad = 'y' WHERE id % 7 = 0")
        wait_until(lambda: {r["pad"] for r in pipeline.target.read_table(parts).where("id = 7").collect()} == {"y"},
                   60, "the update applied")
    assert assert_same(pipeline, source_dsn, "public.parts") == 600


def assert_same_values(settings: Any, table: TableSchema, left: str, right: str) -> None:
    """DuckLake tables ``left`` and ``right`` (copies of ``table``) hold the same values, read by a plain DuckDB."""
    con = plain_duckdb(settings)
    try:
        assert _values(con, f"lake.public.{left}", table) == _values(con, f"lake.public.{right}", table)
    finally:
        con.close()
