"""Targets registered by name: each folder under ``headrace/targets`` with a ``plugin.py`` is one.

A target's folder holds everything about it: its settings model (the ``target: {<name>: ...}``
section), the Spark conf it needs (jars, extensions), how it names the tables users query, and
its implementation of ``headrace.core.interfaces.Target``. Adding a target means adding a folder
whose ``plugin.py`` defines ``PLUGIN = TargetPlugin(...)``; ``headrace.config``, ``headrace.engines.spark.session``,
the control plane and the demo find it here. Plugins are imported when first asked for, so a
target's heavy dependencies (Spark, DuckDB) load only when it is opened.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_serializer, model_validator
from pydantic_core import InitErrorDetails

from headrace.core.errors import ConfigError
from headrace.core.names import TableName

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from headrace.core.filesink import FileSink
    from headrace.core.interfaces import Target
    from headrace.core.schema import TableSchema


def _no_refusal(settings: Any) -> str | None:
    return None


def _not_mapped(settings: Any, table: TableName) -> bool:
    return False


def _no_servers(settings: Any) -> dict[str, str]:
    return {}


def _no_locations(settings: Any) -> list[str]:
    return []


def _no_sink_ahead(settings: Any, table: TableSchema) -> FileSink | None:
    return None


@dataclass(frozen=True)
class TargetPlugin:
    """One target, as the rest of headrace sees it before opening it."""

    name: str  # the key under ``target:`` in the config, e.g. "iceberg"
    settings_model: type[BaseModel]  # validates that section
    # (spark, settings, pipeline name) -> the open target; imports the implementation.
    open: Callable[[SparkSession, Any, str], Target]
    # (settings, the user's spark.conf) -> Spark conf the target needs at session start: jars, SQL
    # extensions. List-valued keys (spark.jars, spark.sql.extensions, spark.driver.extraClassPath)
    # are joined with the user's; other keys yield to the user's.
    spark_conf: Callable[[Any, Mapping[str, str]], dict[str, str]]
    # (settings, pipeline name, the table's target-side name) -> the name users query, as the
    # target's SQL spells it (quoted where it needs quotes).
    table_name: Callable[[Any, str, TableName], str]
    # (settings, the table's target-side name) -> the target stores it under another name than the
    # source's (a name its storage cannot hold as it is).
    name_mapped: Callable[[Any, TableName], bool] = _not_mapped
    # settings -> why the target cannot rename tables (completing "not possible with target.<name>
    # ..."), or None when it can (``schema_changes.rename_table: follow``).
    rename_refusal: Callable[[Any], str | None] = _no_refusal
    # settings -> role -> libpq connection string of each PostgreSQL server the target depends on
    # (watched through outages like the source: headrace.outage_signs).
    servers: Callable[[Any], dict[str, str]] = _no_servers
    # (settings, the table) -> where a fresh copy may write the table's files before the target is
    # open (the folder and field ids its creation will give: ``copy_sink``'s, told without Spark), or
    # None; the copy checks it against ``copy_sink`` before its first commit (materialize.file_copy).
    copy_sink_ahead: Callable[[Any, TableSchema], FileSink | None] = _no_sink_ahead
    # settings -> the folders (paths or URIs such as s3://bucket/prefix) the target writes its files
    # to: ``headrace check`` proves an object store there, ``drop --targets`` empties it.
    locations: Callable[[Any], list[str]] = _no_locations


def _folder() -> Path:
    return Path(__file__).parent


def names() -> list[str]:
    """Every registered target's name, sorted (the folders with a ``plugin.py``)."""
    return sorted(m.name for m in pkgutil.iter_modules([str(_folder())])
                  if m.ispkg and (_folder() / m.name / "plugin.py").is_file())


@cache
def get(name: str) -> TargetPlugin:
    """The target registered as ``name``; a ConfigError naming the registered ones if there is none."""
    if name not in names():
        raise ConfigError(f"unknown target {name!r}; registered targets: {', '.join(names())}")
    module = importlib.import_module(f"headrace.targets.{name}.plugin")
    plugin = module.PLUGIN
    if not isinstance(plugin, TargetPlugin) or plugin.name != name:
        raise ConfigError(f"headrace/targets/{name}/plugin.py must define PLUGIN = TargetPlugin(name={name!r}, ...)")
    return plugin


def open_target(kind: str, spark: SparkSession, settings: Any, pipeline: str) -> Target:
    """Open the target registered as ``kind`` with its (validated) settings."""
    try:
        return get(kind).open(spark, settings, pipeline)
    except ImportError as exc:
        raise ConfigError(
            f"target {kind!r} needs a package that is not installed ({exc.name}): "
            f"run `pip install headrace` in this environment"
        ) from exc


class TargetSection(BaseModel):
    """A ``target:`` mapping naming exactly one registered target with its settings.

    In YAML ``{iceberg: {warehouse: ...}}``; in Python ``kind`` (the name) and ``settings`` (the
    target's own model). Errors in the settings keep their place (``target.iceberg.warehouse``).
    """

    model_config = ConfigDict(frozen=True)

    kind: str
    settings: Any

    @model_validator(mode="before")
    @classmethod
    def _one_registered(cls, raw: Any) -> Any:
        if isinstance(raw, TargetSection):
            return {"kind": raw.kind, "settings": raw.settings}
        registered = names()
        if not isinstance(raw, dict) or not raw:
            raise ValueError(f"give exactly one target, one of: {', '.join(registered)}"
                             " (e.g. ducklake: {catalog: ..., data_path: ...})")
        unknown = [k for k in raw if k not in registered]
        if unknown:
            raise ValueError(f"unknown target {', '.join(map(repr, unknown))}; registered targets:"
                             f" {', '.join(registered)}")
        if len(raw) != 1:
            raise ValueError(f"give exactly one target, one of: {', '.join(registered)} (got {' and '.join(raw)})")
        ((kind, settings),) = raw.items()
        plugin = get(kind)
        if isinstance(settings, plugin.settings_model):
            return {"kind": kind, "settings": settings}
        try:
            return {"kind": kind, "settings": plugin.settings_model.model_validate(settings or {})}
        except ValidationError as exc:
            # The same errors, placed under the target's name: target.iceberg.warehouse, not target.warehouse.
            raise ValidationError.from_exception_data(exc.title, [
                InitErrorDetails(type=e["type"], loc=(kind, *e["loc"]), input=e["input"], ctx=e.get("ctx", {}))
                for e in exc.errors()
            ]) from None

    @model_serializer(mode="wrap")
    def _as_written(self, handler: Any) -> dict[str, Any]:
        # Dumped as it is written ({iceberg: {...}}), so a dumped config reads back.
        dumped = handler(self)
        return {dumped["kind"]: dumped["settings"]}

    @property
    def plugin(self) -> TargetPlugin:
        """The registered target this section names."""
        return get(self.kind)

    def section(self, kind: str) -> Any:
        """The settings when the target is ``kind``, else None (``config.target.section("ducklake")``)."""
        return self.settings if self.kind == kind else None
