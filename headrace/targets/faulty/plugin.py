"""The fault-injecting target, registered as ``faulty`` like any other: it wraps another registered
target (``inner``) and takes that target's Spark conf and naming."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from headrace.core.names import TableName
from headrace.targets import registry
from headrace.targets.faulty.config import FaultyConfig
from headrace.targets.registry import TargetPlugin

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from headrace.core.interfaces import Target


def _open(spark: SparkSession, settings: FaultyConfig, pipeline: str) -> Target:
    from headrace.targets.faulty.target import FaultyTarget

    inner = registry.open_target(settings.inner.kind, spark, settings.inner.settings, pipeline)
    return FaultyTarget(inner, settings.faults)


def _spark_conf(settings: FaultyConfig, user_conf: Mapping[str, str]) -> dict[str, str]:
    return settings.inner.plugin.spark_conf(settings.inner.settings, user_conf)


def _table_name(settings: FaultyConfig, pipeline: str, table: TableName) -> str:
    return settings.inner.plugin.table_name(settings.inner.settings, pipeline, table)


def _name_mapped(settings: FaultyConfig, table: TableName) -> bool:
    return settings.inner.plugin.name_mapped(settings.inner.settings, table)


def _rename_refusal(settings: FaultyConfig) -> str | None:
    return settings.inner.plugin.rename_refusal(settings.inner.settings)


def _servers(settings: FaultyConfig) -> dict[str, str]:
    return settings.inner.plugin.servers(settings.inner.settings)


def _locations(settings: FaultyConfig) -> list[str]:
    return settings.inner.plugin.locations(settings.inner.settings)


PLUGIN = TargetPlugin(
    name="faulty",
    settings_model=FaultyConfig,
    open=_open,
    spark_conf=_spark_conf,
    table_name=_table_name,
    name_mapped=_name_mapped,
    rename_refusal=_rename_refusal,
    servers=_servers,
    locations=_locations,
)
