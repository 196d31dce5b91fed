"""End to end on an S3-compatible object store (``moto_server``, started by a fixture): staging and
the target's files on ``s3://``, with nothing in the config but ``s3://`` paths (the standard AWS
environment variables point at the server), on both lanes; each target read back by readers that are
not ours (DuckDB with httpfs and ducklake/iceberg, pyiceberg) and compared with the source."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import duckdb
import psycopg

from headrace.pipeline import Pipeline
from headrace.source.postgres.throwaway import ThrowawayPostgres
from headrace.targets.ducklake.extension import extension_path
from tests.e2e.helpers import _norm, make_config, source_rows, wait_until
from tests.e2e.test_pipeline import run_caught_up
from tests.objectstore import KEY_ID, SECRET, MotoServer

_dbs = itertools.count()


def new_database(pg: ThrowawayPostgres, prefix: str) -> str:
    name = f"{prefix}_{os.getpid()}_{next(_dbs)}"
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return name


def duckdb_on_s3(server: MotoServer, *extensions: str) -> duckdb.DuckDBPyConnection:
    """A plain DuckDB with httpfs and ``extensions`` (from their wheels) and the server as its S3 secret:
    what any DuckDB user would write, none of headrace's code."""
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    for name in ("httpfs", *extensions):
        con.execute(f"LOAD '{extension_path(name)}'")
    con.execute(f"CREATE SECRET (TYPE s3, KEY_ID '{KEY_ID}', SECRET '{SECRET}', REGION 'us-east-1',"
                f" ENDPOINT '127.0.0.1:{server.port}', URL_STYLE 'path', USE_SSL false)")
    return con


def rows_of(con: duckdb.DuckDBPyConnection, sql: str) -> list[tuple[Any, ...]]:
    table = con.execute(sql).to_arrow_table()  # arrow: fetchall() would need pytz for timestamptz
    return sorted((tuple(_norm(v) for v in row.values()) for row in table.to_pylist()), key=repr)


def make_orders(dsn: str, rows: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, item text, qty int, price numeric(10,2),"
                     " placed timestamptz)")
        conn.execute("INSERT INTO orders SELECT g, 'item ' || g, g % 7, g * 0.5, '2024-01-01'::timestamptz"
                     f" + g * interval '1 min' FROM generate_series(1, {rows}) g")


def change_orders(dsn: str) -> None:
    """Inserts, updates, deletes, a new column and its values, then a TRUNCATE and rows after it."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO orders SELECT g, 'new ' || g, 1, 1.5, now() FROM generate_series(1001, 1100) g")
        conn.execute("UPDATE orders SET qty = qty + 10 WHERE id % 5 = 0")
        conn.execute("DELETE FROM orders WHERE id % 9 = 0")
        conn.execute("ALTER TABLE orders ADD COLUMN note text")
        conn.execute("UPDATE orders SET note = 'noted ' || id WHERE id % 3 = 0")


def truncate_orders(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE orders")
        conn.execute("INSERT INTO orders SELECT g, 'after ' || g, g, g, now(), 'n' FROM generate_series(1, 50) g")


def test_ducklake_on_s3_with_a_postgres_catalog_copies_streams_evolves_and_truncates_on_the_driver(
        source_dsn: str, pg_server: ThrowawayPostgres, s3_server: MotoServer, s3_bucket: str, tmp_path: Path,
        spark: Any) -> None:
    make_orders(source_dsn, 1000)
    catalog_db = new_database(pg_server, "lakecat")
    catalog = f"postgres:dbname={catalog_db} host=127.0.0.1 port={pg_server.port} user=postgres"
    config = make_config(source_dsn, tmp_path, ["public.orders"],
                         {"ducklake": {"catalog": catalog, "data_path": f"s3://{s3_bucket}/lake/"}},
                         staging={"path": f"s3://{s3_bucket}/staging"})
    pipeline = Pipeline(config, spark=spark)
    reader = duckdb_on_s3(s3_server, "ducklake", "postgres_scanner")

    def lake_equals_source() -> bool:
        schema, expected = source_rows(source_dsn, "public.orders")
        reader.execute("USE memory")  # a fresh snapshot of the lake for every read
        actual = rows_of(reader, f"SELECT {', '.join(schema.column_names)} FROM lake.public.orders")
        assert actual == expected, f"{len(actual)} rows in the lake, {len(expected)} in the source"
        return True

    run_caught_up(pipeline)
    reader.execute(f"ATTACH 'ducklake:{catalog}' AS lake (READ_ONLY)")
    assert lake_equals_source()
    assert any(k.startswith("lake/") and k.endswith(".parquet") for k in s3_server.keys(s3_bucket))
    change_orders(source_dsn)
    run_caught_up(pipeline)
    assert lake_equals_source()
    assert s3_server.keys(s3_bucket, "staging/t/"), "the staged files were not written to the bucket"
    truncate_orders(source_dsn)
    run_caught_up(pipeline)
    wait_until(lake_equals_source, 30, "the lake did not follow the TRUNCATE")
    reader.close()
