"""End to end on an S3-compatible object store (``moto_server``, started by a fixture): staging and
the target's files on ``s3://``, with nothing in the config but ``s3://`` paths (the standard AWS
environment variables point at the server), on both lanes; each target read back by readers that are
not ours (DuckDB with httpfs and ducklake/iceberg, pyiceberg) and compared with the source."""

from __future__ import annotations

import itertools
import logging
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pytest

from headrace.pipeline import Pipeline
from headrace.source.postgres.throwaway import ThrowawayPostgres
from headrace.targets.ducklake.extension import extension_path
from headrace.teardown import drop_pipeline
from tests.e2e.helpers import _norm, make_config, running, source_rows, wait_until
from tests.e2e.test_pipeline import run_caught_up
from tests.objectstore import KEY_ID, SECRET, MotoServer, free_port

_dbs = itertools.count()


def new_database(pg: ThrowawayPostgres, prefix: str) -> str:
    """A database of its own on the shared server (a random suffix: other files make theirs too)."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
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


def change_orders(dsn: str, alter: bool = True) -> None:
    """Inserts, updates, deletes; with ``alter`` a new column and its values."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO orders SELECT g, 'new ' || g, 1, 1.5, now() FROM generate_series(10001, 10100) g")
        conn.execute("UPDATE orders SET qty = qty + 10 WHERE id % 5 = 0")
        conn.execute("DELETE FROM orders WHERE id % 9 = 0")
        if not alter:
            return
        conn.execute("ALTER TABLE orders ADD COLUMN note text")
        conn.execute("UPDATE orders SET note = 'noted ' || id WHERE id % 3 = 0")


def truncate_orders(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE orders")
        conn.execute("INSERT INTO orders SELECT g, 'after ' || g, g, g, now(), 'n' FROM generate_series(1, 50) g")


def test_ducklake_on_s3_with_a_postgres_catalog_copies_streams_evolves_and_truncates_on_the_driver(
        source_dsn: str, pg_server: ThrowawayPostgres, s3_server: MotoServer, s3_bucket: str, tmp_path: Path,
        spark: Any, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    """Also: the secret key is in no log line, status page, /metrics, status API or OpenLineage event,
    and ``drop --targets`` leaves nothing of the pipeline in the bucket."""
    make_orders(source_dsn, 1500)  # over target.ducklake.inline_rows: the copy is a Parquet file on the store
    catalog_db = new_database(pg_server, "lakecat")
    catalog = f"postgres:dbname={catalog_db} host=127.0.0.1 port={pg_server.port} user=postgres"
    api = f"127.0.0.1:{free_port()}"
    config = make_config(source_dsn, tmp_path, ["public.orders"],
                         {"ducklake": {"catalog": catalog, "data_path": f"s3://{s3_bucket}/lake/"}},
                         staging={"path": f"s3://{s3_bucket}/staging"}, api={"listen": api},
                         lineage={"transport": "file", "file": str(tmp_path / "lineage.jsonl")})
    pipeline = Pipeline(config, spark=spark)
    reader = duckdb_on_s3(s3_server, "ducklake", "postgres_scanner")

    def lake_equals_source() -> bool:
        schema, expected = source_rows(source_dsn, "public.orders")
        reader.execute("USE memory")  # a fresh snapshot of the lake for every read
        try:
            actual = rows_of(reader, f"SELECT {', '.join(schema.column_names)} FROM lake.public.orders")
        except duckdb.BinderException as exc:  # a new column not there yet
            raise AssertionError(str(exc)) from exc
        assert actual == expected, f"{len(actual)} rows in the lake, {len(expected)} in the source"
        return True

    run_caught_up(pipeline)
    reader.execute(f"ATTACH 'ducklake:{catalog}' AS lake (READ_ONLY)")
    assert lake_equals_source()
    assert any(k.startswith("lake/") and k.endswith(".parquet") for k in s3_server.keys(s3_bucket))
    shown: list[str] = []
    with running(pipeline):
        change_orders(source_dsn)
        wait_until(lake_equals_source, 60, "the lake did not follow the changes")
        assert s3_server.keys(s3_bucket, "staging/t/"), "the staged files were not written to the bucket"
        for path in ("/", "/metrics", "/api/status", "/api/tables", "/api/check"):
            with urllib.request.urlopen(f"http://{api}{path}", timeout=30) as resp:
                shown.append(resp.read().decode())
    truncate_orders(source_dsn)
    run_caught_up(pipeline)
    wait_until(lake_equals_source, 30, "the lake did not follow the TRUNCATE")
    reader.close()
    shown += [(tmp_path / "lineage.jsonl").read_text(), caplog.text, *capfd.readouterr()]
    assert all(SECRET not in text for text in shown), "the secret key was shown"
    assert all(KEY_ID not in text for text in shown[:-3]), "the key id was shown"

    drop_pipeline(config, targets=True, open_target=lambda: Pipeline(config, spark=spark).target)
    left = [k for k in s3_server.keys(s3_bucket) if not k.endswith("/")]  # folder markers aside
    assert left == [], f"drop --targets left {left[:5]}"


def maintained(pipeline: Pipeline, dsn: str) -> Any:
    """One maintenance pass over public.orders (compaction, snapshots expired down to the newest,
    orphan files of over a day removed: the listing of the folder runs, none is that old); its file
    counts before and after. The target is closed afterwards."""
    from headrace.core.maintenance import MaintenancePolicy
    from headrace.source.postgres.catalog import read_table_schema

    with psycopg.connect(dsn) as conn:
        table = read_table_schema(conn, "public.orders")
    target = pipeline.target
    before = target.table_files(table)
    target.maintain(table, MaintenancePolicy(retention_seconds=0, keep_last=1, orphan_age_seconds=86_400))
    after = target.table_files(table)
    target.close()  # the pipeline is done: a DuckLake's catalog file is then free for a reader to attach
    return before, after


def read_back_equals(server: MotoServer, source_dsn: str, table: Any) -> bool:
    """``public.orders`` read back from the Iceberg ``table`` (pyiceberg's) by pyiceberg and by DuckDB,
    each equal to the source's rows (asserted); True."""
    schema, expected = source_rows(source_dsn, "public.orders")
    by_pyiceberg = sorted((tuple(_norm(v) for v in row.values()) for row in
                           table.scan(selected_fields=tuple(schema.column_names)).to_arrow().to_pylist()), key=repr)
    assert by_pyiceberg == expected, f"pyiceberg: {len(by_pyiceberg)} rows, source {len(expected)}"
    by_duckdb = iceberg_rows(server, table.metadata_location, schema.column_names)
    assert by_duckdb == expected, f"DuckDB: {len(by_duckdb)} rows, source {len(expected)}"
    return True


def iceberg_rows(server: MotoServer, metadata: str, columns: list[str]) -> list[tuple[Any, ...]]:
    """The table at ``metadata`` (its current metadata file on S3) as DuckDB's iceberg extension reads it."""
    con = duckdb_on_s3(server, "avro", "iceberg")
    try:
        return rows_of(con, f"SELECT {', '.join(columns)} FROM iceberg_scan('{metadata}')")
    finally:
        con.close()


def pyiceberg_s3(server: MotoServer) -> dict[str, str]:
    return {"s3.endpoint": server.endpoint, "s3.access-key-id": KEY_ID, "s3.secret-access-key": SECRET,
            "s3.region": "us-east-1", "s3.force-virtual-addressing": "false"}


def iceberg_jdbc_on_s3_on_spark(source_dsn: str, pg_server: ThrowawayPostgres, s3_server: MotoServer,
                                s3_bucket: str, tmp_path: Path, spark: Any, full: bool) -> None:
    """Copy and stream into an Iceberg JDBC catalog on S3 with every batch a Spark job; ``full``: a new
    column, a TRUNCATE and a maintenance pass too."""
    from pyiceberg.catalog.sql import SqlCatalog

    make_orders(source_dsn, 1000)
    catalog_db = new_database(pg_server, "icecat")
    name = f"hrs3jdbc{next(_dbs)}"
    target = {"iceberg": {"warehouse": f"s3://{s3_bucket}/warehouse", "catalog_name": name,
                          "catalog": {"type": "jdbc", "uri": pg_server.dsn_for(catalog_db)}}}
    config = make_config(source_dsn, tmp_path, ["public.orders"], target, engine="spark",
                         staging={"path": f"s3://{s3_bucket}/staging"})
    pipeline = Pipeline(config, spark=spark)
    user, _, rest = pg_server.dsn_for(catalog_db).removeprefix("postgresql://").partition("@")
    catalog = SqlCatalog(name, uri=f"postgresql+psycopg2://{user}@{rest}", **pyiceberg_s3(s3_server))

    def table_equals_source() -> bool:
        return read_back_equals(s3_server, source_dsn, catalog.load_table(("public", "orders")))

    run_caught_up(pipeline)
    assert table_equals_source()
    assert s3_server.keys(s3_bucket, "warehouse/public/orders/metadata/")
    change_orders(source_dsn, alter=full)
    run_caught_up(pipeline)
    assert table_equals_source()
    if not full:
        return
    truncate_orders(source_dsn)
    run_caught_up(pipeline)
    wait_until(table_equals_source, 30, "the table did not follow the TRUNCATE")
    before, after = maintained(pipeline, source_dsn)  # Spark's procedures on S3A, orphan listing included
    assert after.snapshots == 1 and after.data_files <= before.data_files, (before, after)
    assert table_equals_source()


@pytest.mark.slow  # 40-80 s on a loaded machine: Spark MERGEs into Iceberg through S3A
def test_iceberg_jdbc_catalog_on_s3_copies_and_streams_on_spark(
        source_dsn: str, pg_server: ThrowawayPostgres, s3_server: MotoServer, s3_bucket: str, tmp_path: Path,
        spark: Any) -> None:
    iceberg_jdbc_on_s3_on_spark(source_dsn, pg_server, s3_server, s3_bucket, tmp_path, spark, full=False)


@pytest.mark.slow  # ~50-100 s: Spark MERGEs through S3A, three rounds
def test_iceberg_jdbc_catalog_on_s3_copies_streams_evolves_and_truncates_on_spark(
        source_dsn: str, pg_server: ThrowawayPostgres, s3_server: MotoServer, s3_bucket: str, tmp_path: Path,
        spark: Any) -> None:
    iceberg_jdbc_on_s3_on_spark(source_dsn, pg_server, s3_server, s3_bucket, tmp_path, spark, full=True)


def test_iceberg_hadoop_catalog_on_s3_copies_and_streams_on_the_driver(
        source_dsn: str, s3_server: MotoServer, s3_bucket: str, tmp_path: Path, spark: Any,
        caplog: pytest.LogCaptureFixture) -> None:
    from pyiceberg.table import StaticTable

    make_orders(source_dsn, 1000)
    warehouse = f"s3://{s3_bucket}/warehouse"
    target = {"iceberg": {"warehouse": warehouse, "catalog_name": f"hrs3hadoop{next(_dbs)}"}}
    config = make_config(source_dsn, tmp_path, ["public.orders"], target,
                         staging={"path": f"s3://{s3_bucket}/staging"})
    pipeline = Pipeline(config, spark=spark)

    def table_equals_source() -> bool:
        schema, expected = source_rows(source_dsn, "public.orders")
        hint = s3_server.client().get_object(Bucket=s3_bucket, Key="warehouse/public/orders/metadata/version-hint.text")
        metadata = f"{warehouse}/public/orders/metadata/v{hint['Body'].read().decode().strip()}.metadata.json"
        table = StaticTable.from_metadata(metadata, properties=pyiceberg_s3(s3_server))
        by_pyiceberg = sorted((tuple(_norm(v) for v in row.values()) for row in
                               table.scan(selected_fields=tuple(schema.column_names)).to_arrow().to_pylist()),
                              key=repr)
        assert by_pyiceberg == expected, f"pyiceberg: {len(by_pyiceberg)} rows, source {len(expected)}"
        by_duckdb = iceberg_rows(s3_server, metadata, schema.column_names)
        assert by_duckdb == expected, f"DuckDB: {len(by_duckdb)} rows, source {len(expected)}"
        return True

    with caplog.at_level(logging.WARNING, logger="headrace"):
        run_caught_up(pipeline)
    # The run says once what a Hadoop catalog on an object store costs, and which setting to change.
    advice = [r for r in caplog.records if r.getMessage() == "iceberg.catalog_advice"]
    assert len(advice) == 1 and "target.iceberg.catalog.type" in str(getattr(advice[0], "advice", ""))
    assert table_equals_source()
    change_orders(source_dsn)
    run_caught_up(pipeline)
    assert table_equals_source()
    summaries = [s.summary for s in StaticTable.from_metadata(  # the batch was applied on the driver
        f"{warehouse}/public/orders/metadata/v{_version(s3_server, s3_bucket)}.metadata.json",
        properties=pyiceberg_s3(s3_server)).snapshots()]
    assert any(s is not None and s.get("headrace.apply") == "driver" for s in summaries), summaries


def _version(server: MotoServer, bucket: str) -> str:
    hint = server.client().get_object(Bucket=bucket, Key="warehouse/public/orders/metadata/version-hint.text")
    return str(hint["Body"].read().decode().strip())


def test_ducklake_on_s3_copies_and_streams_on_spark(
        source_dsn: str, s3_server: MotoServer, s3_bucket: str, tmp_path: Path, spark: Any) -> None:
    """The Spark lane on the store: Spark's JVM writes the copy's Parquet files and reads the staged
    files through S3A (``engine: spark``); DuckDB registers and applies them; plain DuckDB reads the lake."""
    make_orders(source_dsn, 500)
    catalog = str(tmp_path / "meta.ducklake")
    config = make_config(source_dsn, tmp_path, ["public.orders"],
                         {"ducklake": {"catalog": catalog, "data_path": f"s3://{s3_bucket}/lake/"}},
                         engine="spark", staging={"path": f"s3://{s3_bucket}/staging"})
    pipeline = Pipeline(config, spark=spark)

    def lake_equals_source() -> bool:
        schema, expected = source_rows(source_dsn, "public.orders")
        reader = duckdb_on_s3(s3_server, "ducklake")
        try:
            reader.execute(f"ATTACH 'ducklake:{catalog}' AS lake (READ_ONLY)")
            actual = rows_of(reader, f"SELECT {', '.join(schema.column_names)} FROM lake.public.orders")
        finally:
            reader.close()
        assert actual == expected, f"{len(actual)} rows in the lake, {len(expected)} in the source"
        return True

    run_caught_up(pipeline)
    assert lake_equals_source()
    change_orders(source_dsn, alter=False)
    run_caught_up(pipeline)
    assert lake_equals_source()
    before, after = maintained(pipeline, source_dsn)  # DuckLake's merge, expiry and clean-up through httpfs
    assert after.data_files <= before.data_files and after.delete_files == 0, (before, after)
    assert lake_equals_source()
