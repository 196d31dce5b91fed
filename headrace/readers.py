"""Reading headrace's target: DuckDB and pyiceberg (no Spark), or a Spark session set up for Iceberg.

These are conveniences for offline machines (the DuckDB extensions are loaded from their PyPI
wheels by path); docs/reading.md shows the same reads with nothing of headrace.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from headrace import storage
from headrace.core.errors import ConfigError
from headrace.core.names import path_segment
from headrace.targets.ducklake import extension
from headrace.targets.ducklake.config import DuckLakeConfig
from headrace.targets.iceberg.catalog import pyiceberg_properties
from headrace.targets.iceberg.config import IcebergConfig
from headrace.targets.iceberg.session import hadoop_catalog_conf, iceberg_session_conf

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyspark.sql import SparkSession


def duckdb_with(*extensions: str) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB (UTC session) with ``extensions`` loaded from their wheels (or INSTALLed).

    ``duckdb_with("avro", "iceberg")`` reads Iceberg tables with ``iceberg_scan``;
    ``duckdb_with("ducklake", "sqlite_scanner")`` attaches a DuckLake on SQLite.
    """
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    for name in extensions:
        extension.load_extension(con, name, "reading the target with DuckDB")
    return con


def iceberg_catalog(settings: IcebergConfig) -> Catalog:
    """pyiceberg's view of a JDBC catalog (the same database and the same catalog name) or of a REST
    catalog (its RestCatalog, with the same credentials)."""
    from pyiceberg.catalog import load_catalog
    from pyiceberg.catalog.sql import SqlCatalog

    if settings.catalog.type == "rest":
        return load_catalog(settings.catalog_name, **pyiceberg_properties(settings))
    return SqlCatalog(settings.catalog_name, **pyiceberg_properties(settings))


def iceberg_metadata_location(settings: IcebergConfig, namespace: str, table: str) -> str:
    """The current metadata file of one table, which DuckDB's ``iceberg_scan`` reads.

    A JDBC catalog holds it in its ``iceberg_tables`` row; a Hadoop catalog names it in the table's
    ``metadata/version-hint.text``.
    """
    if settings.catalog.type in ("jdbc", "rest"):
        return str(iceberg_catalog(settings).load_table((namespace, table)).metadata_location)
    if storage.is_object_store(settings.warehouse):
        metadata_url = f"{settings.warehouse.rstrip('/')}/{path_segment(namespace)}/{path_segment(table)}/metadata"
        filesystem, path = storage.filesystem(metadata_url)
        with filesystem.open_input_stream(f"{path}/version-hint.text") as hint:
            return f"{metadata_url}/v{hint.read().decode().strip()}.metadata.json"
    if "://" in settings.warehouse and not settings.warehouse.startswith("file:"):
        raise ConfigError(f"reading {settings.warehouse} needs a filesystem client: use Spark or pyiceberg")
    root = Path(settings.warehouse.removeprefix("file://").removeprefix("file:"))
    metadata = root / path_segment(namespace) / path_segment(table) / "metadata"
    version = (metadata / "version-hint.text").read_text().strip()
    return str(metadata / f"v{version}.metadata.json")


def ducklake(settings: DuckLakeConfig, alias: str = "lake") -> duckdb.DuckDBPyConnection:
    """DuckDB with the lake attached as ``alias`` (any catalog kind: DuckDB file, SQLite, PostgreSQL)."""
    return extension.connect(settings, alias)


def iceberg_spark(warehouse: str | None = None, jdbc_driver: bool = False,
                  conf: Mapping[str, str] | None = None) -> SparkSession:
    """A Spark session that reads Iceberg tables: the runtime jars and extensions, with ``warehouse``
    a Hadoop catalog ``headrace`` on it, with ``jdbc_driver`` the PostgreSQL JDBC driver (a JDBC
    catalog, registered through ``conf``)."""
    from headrace.engines.spark.session import build_session

    target_conf = iceberg_session_conf(conf, jdbc_driver=jdbc_driver)
    if warehouse:
        target_conf.update(hadoop_catalog_conf(warehouse))
    return build_session(conf=conf, target_conf=target_conf)
