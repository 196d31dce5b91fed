"""Reading headrace's target without Spark: DuckDB and pyiceberg, set up from a pipeline's config.

These are conveniences for offline machines (the DuckDB extensions are loaded from their PyPI
wheels by path); README "Reading the target" shows the same reads with nothing of headrace.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from headrace.config import DuckLakeConfig, IcebergConfig
from headrace.core.errors import ConfigError
from headrace.core.names import path_segment
from headrace.targets.ducklake import extension
from headrace.targets.iceberg.catalog import pyiceberg_properties

if TYPE_CHECKING:
    from pyiceberg.catalog.sql import SqlCatalog


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


def iceberg_catalog(settings: IcebergConfig) -> SqlCatalog:
    """pyiceberg's view of a JDBC catalog: the same database and the same catalog name."""
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog(settings.catalog_name, **pyiceberg_properties(settings))


def iceberg_metadata_location(settings: IcebergConfig, namespace: str, table: str) -> str:
    """The current metadata file of one table, which DuckDB's ``iceberg_scan`` reads.

    A JDBC catalog holds it in its ``iceberg_tables`` row; a Hadoop catalog names it in the table's
    ``metadata/version-hint.text``.
    """
    if settings.catalog.type == "jdbc":
        return str(iceberg_catalog(settings).load_table((namespace, table)).metadata_location)
    if "://" in settings.warehouse and not settings.warehouse.startswith("file:"):
        raise ConfigError(f"reading {settings.warehouse} needs a filesystem client: use Spark or pyiceberg")
    root = Path(settings.warehouse.removeprefix("file://").removeprefix("file:"))
    metadata = root / path_segment(namespace) / path_segment(table) / "metadata"
    version = (metadata / "version-hint.text").read_text().strip()
    return str(metadata / f"v{version}.metadata.json")


def ducklake(settings: DuckLakeConfig, alias: str = "lake") -> duckdb.DuckDBPyConnection:
    """DuckDB with the lake attached as ``alias`` (any catalog kind: DuckDB file, SQLite, PostgreSQL)."""
    return extension.connect(settings, alias)
