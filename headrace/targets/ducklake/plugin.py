"""The DuckLake target, registered as ``ducklake``: its settings, Spark conf, naming and implementation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from headrace.core.errors import ConfigError
from headrace.core.names import TableName
from headrace.targets.ducklake.config import DuckLakeConfig
from headrace.targets.registry import TargetPlugin

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from headrace.core.interfaces import Target


def _open(spark: SparkSession, settings: DuckLakeConfig, pipeline: str) -> Target:
    from headrace.targets.ducklake.target import DuckLakeTarget  # DuckDB and Spark code, loaded when opened

    return DuckLakeTarget(spark, settings, pipeline)


def _spark_conf(settings: DuckLakeConfig, user_conf: Mapping[str, str]) -> dict[str, str]:
    # DuckLake registers Spark's Parquet files as they are; it stores microsecond timestamps.
    return {"spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS"}


def table_name(settings: DuckLakeConfig, pipeline: str, table: TableName) -> str:
    """``schema.table`` in the lake (``target.ducklake.schema`` when set), quoted where needed."""
    return str(TableName(settings.schema_ or table.schema, table.name))


def _servers(settings: DuckLakeConfig) -> dict[str, str]:
    from headrace.targets.ducklake.extension import resolve_catalog  # loads DuckDB

    try:
        catalog = resolve_catalog(settings)
    except ConfigError:
        return {}  # reported, with its fix, when the target is opened
    if catalog.kind == "postgres":
        return {"ducklake catalog": catalog.location.partition(":")[2]}
    return {}


def _locations(settings: DuckLakeConfig) -> list[str]:
    return [settings.data_path]


PLUGIN = TargetPlugin(
    name="ducklake",
    settings_model=DuckLakeConfig,
    open=_open,
    spark_conf=_spark_conf,
    table_name=table_name,
    servers=_servers,
    locations=_locations,
)
