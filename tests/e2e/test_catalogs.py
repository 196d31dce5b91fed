"""End to end through Iceberg's JDBC catalog (its metadata in a database of the session's server),
read back by readers that are not Spark: pyiceberg's SqlCatalog and DuckDB's iceberg extension."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa

from headrace.pipeline import Pipeline
from headrace.readers import duckdb_with, iceberg_catalog, iceberg_metadata_location
from headrace.source.postgres.throwaway import ThrowawayPostgres
from headrace.targets.iceberg.config import IcebergConfig
from tests.e2e.helpers import _norm, assert_same, make_config, running, source_rows, wait_until
from tests.e2e.test_pipeline import run_caught_up

_catalog_dbs = itertools.count()

COLUMNS = "id, name, balance, seen, active"


def jdbc_target(pg: ThrowawayPostgres, tmp: Path) -> dict[str, Any]:
    """A fresh catalog database on ``pg`` and the ``target`` section that writes through it."""
    name = f"lakecat_{os.getpid()}_{next(_catalog_dbs)}"
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return {"iceberg": {"warehouse": str(tmp / "warehouse"), "catalog_name": f"hrjdbc{next(_catalog_dbs)}",
                        "catalog": {"type": "jdbc", "uri": pg.dsn_for(name)}}}


def normalised(table: pa.Table) -> list[tuple[Any, ...]]:
    """Arrow rows as ``source_rows`` spells them (naive UTC timestamps, normalised decimals)."""
    return sorted((tuple(_norm(v) for v in row.values()) for row in table.to_pylist()), key=repr)


def read_by_others(settings: IcebergConfig, table: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The table as pyiceberg's SqlCatalog and as DuckDB (by its current metadata file) read it."""
    by_pyiceberg = iceberg_catalog(settings).load_table(("public", table)).scan(
        selected_fields=tuple(COLUMNS.split(", "))).to_arrow()
    location = iceberg_metadata_location(settings, "public", table)
    con = duckdb_with("avro", "iceberg")
    try:
        by_duckdb = con.execute(f"SELECT {COLUMNS} FROM iceberg_scan('{location}')").to_arrow_table()
    finally:
        con.close()
    return normalised(by_pyiceberg), normalised(by_duckdb)


def same(pipeline: Pipeline, dsn: str, table: str) -> bool:
    """``assert_same``, where a table not (yet) renamed is only "not yet"."""
    try:
        return assert_same(pipeline, dsn, table) >= 0
    except Exception as exc:
        raise AssertionError(f"{table}: not the same yet: {exc}") from exc


def test_jdbc_catalog_copies_streams_and_follows_a_rename_read_by_pyiceberg_and_duckdb(
        source_dsn: str, pg_server: ThrowawayPostgres, tmp_path: Path, spark: Any) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("""
            CREATE TABLE customers (id int PRIMARY KEY, name text, balance numeric(12,2), seen timestamptz,
                                    active boolean);
            INSERT INTO customers SELECT g, 'c' || g, g * 1.25, '2024-01-01 00:00+00'::timestamptz + g * interval '1 h',
                                         g % 2 = 0 FROM generate_series(1, 200) g;
        """)
    config = make_config(source_dsn, tmp_path, ["public.customers"], jdbc_target(pg_server, tmp_path),
                         schema_changes={"rename_table": "follow"})
    settings = config.target.section("iceberg")
    assert settings is not None
    pipeline = Pipeline(config, spark=spark)
    run_caught_up(pipeline)
    assert assert_same(pipeline, source_dsn, "public.customers") == 200
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO customers VALUES (500, 'new', NULL, now(), NULL)")
        conn.execute("UPDATE customers SET balance = balance * 2, active = NOT active WHERE id % 7 = 0")
        conn.execute("DELETE FROM customers WHERE id % 11 = 0")
        conn.execute("UPDATE customers SET id = id + 1000 WHERE id BETWEEN 10 AND 12")  # key change
    run_caught_up(pipeline)
    assert assert_same(pipeline, source_dsn, "public.customers") == 200 + 1 - 18
    _, expected = source_rows(source_dsn, "public.customers")
    assert read_by_others(settings, "customers") == (expected, expected)

    # Renamed while running (a restart would look for the configured name, public.customers).
    with running(pipeline), psycopg.connect(source_dsn, autocommit=True) as conn:
        passes = pipeline.loop_passes
        wait_until(lambda: pipeline.loop_passes > passes, 60, "the run loop is going (past its start-up checks)")
        conn.execute("ALTER TABLE customers RENAME TO clients")
        conn.execute("UPDATE clients SET name = 'renamed' WHERE id = 1")
        wait_until(lambda: same(pipeline, source_dsn, "public.clients"), 120, "the rename is followed")
    catalog = iceberg_catalog(settings)
    assert catalog.list_tables("public") == [("public", "clients")]
    _, expected = source_rows(source_dsn, "public.clients")
    assert read_by_others(settings, "clients") == (expected, expected)
    with psycopg.connect(settings.catalog.resolved_uri()) as conn:  # the catalog's own rows, one per table
        rows = conn.execute("SELECT catalog_name, table_namespace, table_name FROM iceberg_tables").fetchall()
    assert rows == [(settings.catalog_name, "public", "clients")]
