"""The Iceberg target, registered as ``iceberg``: its settings, Spark conf, naming and implementation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from headrace.core.names import TableName, display_ident, path_segment, quote_spark
from headrace.targets.iceberg.config import IcebergConfig
from headrace.targets.iceberg.session import iceberg_session_conf
from headrace.targets.registry import TargetPlugin

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from headrace.core.filesink import FileSink
    from headrace.core.interfaces import Target
    from headrace.core.schema import TableSchema


def _open(spark: SparkSession, settings: IcebergConfig, pipeline: str) -> Target:
    from headrace.targets.iceberg.target import IcebergTarget  # Spark-side code, loaded when opened

    return IcebergTarget(spark, settings, pipeline)


def _copy_sink_ahead(settings: IcebergConfig, table: TableSchema) -> FileSink | None:
    from headrace.targets.iceberg.files import copy_sink_ahead  # pyarrow, loaded when a copy asks

    return copy_sink_ahead(settings, table)


def _spark_conf(settings: IcebergConfig, user_conf: Mapping[str, str]) -> dict[str, str]:
    return iceberg_session_conf(user_conf, jdbc_driver=settings.catalog.type == "jdbc")


def table_name(settings: IcebergConfig, pipeline: str, table: TableName) -> str:
    """``catalog.namespace.table`` as Spark SQL spells it (quoted where needed).

    The Hadoop catalog keeps a table in ``<warehouse>/<namespace>/<table>``: names that cannot be
    one directory are mapped by ``path_segment``.
    """
    parts = (settings.catalog_name, path_segment(settings.namespace or table.schema), path_segment(table.name))
    return ".".join(p if display_ident(p) == p else quote_spark(p) for p in parts)


def _name_mapped(settings: IcebergConfig, table: TableName) -> bool:
    return any(path_segment(p) != p for p in (settings.namespace or table.schema, table.name))


def _rename_refusal(settings: IcebergConfig) -> str | None:
    if settings.catalog.type != "hadoop":
        return None
    return ("on a Hadoop catalog: it cannot rename tables; use keep (the target table keeps its name), or a JDBC"
            " catalog (target.iceberg.catalog: {type: jdbc, uri: ...}), which can")


def _locations(settings: IcebergConfig) -> list[str]:
    return [settings.warehouse]


PLUGIN = TargetPlugin(
    name="iceberg",
    settings_model=IcebergConfig,
    open=_open,
    spark_conf=_spark_conf,
    table_name=table_name,
    name_mapped=_name_mapped,
    rename_refusal=_rename_refusal,
    copy_sink_ahead=_copy_sink_ahead,
    locations=_locations,
)
