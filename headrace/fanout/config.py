"""Typed configuration of a fan-out pipeline: one DuckLake table routed to many tenant DuckLakes.

A fan-out file is told apart from a replication file by its ``routing`` / ``destinations`` keys
(``is_fanout_file``). ``defaults`` are merged under every destination before validation; string
values in ``defaults`` may use ``{id}`` and ``{routing_value}``, so hundreds of destinations can be
listed as ``{id: acme, routing_value: acme}`` only.
"""

from __future__ import annotations

import re
import zlib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, field_validator, model_validator

from headrace.core.errors import ConfigError
from headrace.core.names import TableName, TableNameError
from headrace.core.settings import Frozen, ListenAddress, from_env, read_yaml, validate
from headrace.targets.ducklake.extension import Catalog, parse_catalog

_NAME_RE = re.compile(r"^[a-z][a-z0-9_-]{0,40}$")


class LakeTable(Frozen):
    """One table in one DuckLake (catalog database + data path)."""

    catalog: str | None = Field(
        None, description="DuckDB file path, sqlite:/path/meta.sqlite, or postgres:<libpq conninfo>"
    )
    catalog_env: str | None = Field(None, description="environment variable holding the catalog string")
    data_path: str = Field(description="folder the DuckLake writes its Parquet files to")
    table: str = Field(description="table as schema.table, or table (schema main)")

    @model_validator(mode="after")
    def _one_catalog(self) -> LakeTable:
        if (self.catalog is None) == (self.catalog_env is None):
            raise ValueError("ducklake needs exactly one of: catalog, catalog_env")
        return self

    @field_validator("table")
    @classmethod
    def _table_name(cls, table: str) -> str:
        # SQL syntax as everywhere in headrace (core.names), a bare name in DuckDB's schema main.
        try:
            return str(TableName.parse(table, default_schema="main"))
        except TableNameError as exc:
            raise ValueError(str(exc)) from None

    @property
    def schema_name(self) -> str:
        return TableName.parse(self.table).schema

    @property
    def table_name(self) -> str:
        return TableName.parse(self.table).name

    def resolved_catalog(self, what: str) -> Catalog:
        """The catalog, read from ``catalog_env`` when given; ``what`` names the lake in errors."""
        text = from_env(self.catalog, self.catalog_env, f"{what}: ducklake.catalog")
        assert text is not None  # the model holds exactly one of the two
        return parse_catalog(text)


class SourceSettings(Frozen):
    """Where the shared table lives."""

    ducklake: LakeTable


class RoutingConfig(Frozen):
    """How a change row finds its destination."""

    field: str = Field(description="routing column (string or integer) of the source table")
    key_columns: list[str] = Field(
        default_factory=list, description="row identity; empty: append-only mode (inserts are appended)"
    )
    seed_mode: Literal["scan", "cdc_replay"] = Field(
        "scan", description="new destinations: scan pinned to one snapshot, or replay every change"
    )

    @property
    def append_only(self) -> bool:
        return not self.key_columns


class DestinationConfig(Frozen):
    """One tenant lake and the routing value whose rows it receives."""

    id: str = Field(description="stable name of the destination; keys its cursor")
    routing_value: str | int = Field(description="rows whose routing field equals this go here")
    ducklake: LakeTable

    @field_validator("id")
    @classmethod
    def _valid_id(cls, value: str) -> str:
        if not value or len(value) > 200:
            raise ValueError("destination id must be 1-200 characters")
        return value


class PartitionConfig(Frozen):
    """Which destinations this instance handles (horizontal scaling)."""

    mode: Literal["all", "explicit", "hash"] = Field(
        "all", description="all: every destination; explicit: the ids in include; hash: the destinations whose"
        " id hashes (crc32) to ordinal of total instances"
    )
    include: list[str] = Field(default_factory=list, description="explicit mode: destination ids")
    total: int = Field(1, gt=0, description="hash mode: number of instances")
    ordinal: int = Field(0, ge=0, description="hash mode: this instance's number, 0..total-1")

    @model_validator(mode="after")
    def _consistent(self) -> PartitionConfig:
        if self.mode == "hash" and self.ordinal >= self.total:
            raise ValueError(f"partition.ordinal {self.ordinal} must be below partition.total {self.total}")
        if self.mode == "explicit" and not self.include:
            raise ValueError("partition mode explicit needs include: [destination ids]")
        return self

    def owns(self, destination_id: str) -> bool:
        """True when this instance handles the destination (hash: crc32, stable across runs)."""
        if self.mode == "all":
            return True
        if self.mode == "explicit":
            return destination_id in self.include
        return zlib.crc32(destination_id.encode()) % self.total == self.ordinal


class InstanceConfig(Frozen):
    """This process among the instances sharing the pipeline."""

    id: str = Field("fanout-0", description="instance name, recorded with every cursor it advances")
    partition: PartitionConfig = PartitionConfig()


class PollConfig(Frozen):
    """The loop over source snapshots."""

    interval_seconds: float = Field(1.0, gt=0, description="pause when every destination is caught up")
    max_snapshots_per_read: int = Field(
        10_000, gt=0, description="largest snapshot range one change read covers"
    )


class PoolConfig(Frozen):
    """Open destination lakes."""

    max_open: int = Field(64, gt=0, description="lakes attached at once; the least recently used is detached")


class RetryConfig(Frozen):
    """Backoff of a failing destination (the others carry on), by the CDC tables' rule: transient
    failures retry for as long as they last, unclassified ones ``give_up_after`` times, terminal
    ones (the error says the fix) wait for the operator until the instance restarts."""

    initial_seconds: float = Field(1.0, gt=0, description="wait after the first failure, doubling per failure")
    max_seconds: float = Field(300.0, gt=0, description="longest wait between two attempts")
    give_up_after: int = Field(
        5, gt=0, description="unclassified failures in a row before a destination waits for the operator;"
        " run --until-caught-up exits 1 once every lagging destination waits or failed this often"
    )


class ApiConfig(ListenAddress):
    """The instance's HTTP endpoint: Prometheus ``/metrics`` (as ``api.listen`` of ``headrace run``).

    Read-only, so no token: put it where your Prometheus can reach it and nothing else can.
    """



class FanoutConfig(Frozen):
    """A whole fan-out pipeline, as read from the YAML file."""

    name: str = Field(description="names the pipeline's cursor rows")
    source: SourceSettings
    routing: RoutingConfig
    destinations: list[DestinationConfig]
    instance: InstanceConfig = InstanceConfig()
    poll: PollConfig = PollConfig()
    pool: PoolConfig = PoolConfig()
    retry: RetryConfig = RetryConfig()
    api: ApiConfig | None = Field(None, description="serve /metrics over HTTP; default: no endpoint")

    @field_validator("name")
    @classmethod
    def _valid_name(cls, name: str) -> str:
        if not _NAME_RE.match(name):
            raise ValueError("name must be lowercase letters, digits, _ and -, starting with a letter")
        return name

    @model_validator(mode="after")
    def _unique(self) -> FanoutConfig:
        ids = [d.id for d in self.destinations]
        dup_ids = sorted({i for i in ids if ids.count(i) > 1})
        if dup_ids:
            raise ValueError(f"destination ids listed twice: {dup_ids}")
        values = [str(d.routing_value) for d in self.destinations]
        dup_values = sorted({v for v in values if values.count(v) > 1})
        if dup_values:
            raise ValueError(f"routing values listed twice: {dup_values}; give each tenant one destination")
        lakes = [(d.ducklake.catalog or d.ducklake.catalog_env, d.ducklake.table) for d in self.destinations]
        if len(set(lakes)) != len(lakes):
            raise ValueError("two destinations write the same table of the same catalog")
        unknown = set(self.instance.partition.include) - set(ids)
        if unknown:
            raise ValueError(f"instance.partition.include names unknown destinations: {sorted(unknown)}")
        return self

    def owned_destinations(self) -> list[DestinationConfig]:
        """The destinations this instance handles."""
        return [d for d in self.destinations if self.instance.partition.owns(d.id)]


def is_fanout_file(path: str | Path) -> bool:
    """True when the YAML file describes a fan-out pipeline (has routing or destinations)."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return False  # the normal loader reports the problem
    return isinstance(raw, dict) and ("routing" in raw or "destinations" in raw)


def load_fanout_config(path: str | Path) -> FanoutConfig:
    """Read and validate a fan-out file; every problem is reported in one ConfigError."""
    return parse_fanout_config(read_yaml(path), str(path))


def parse_fanout_config(raw: Any, origin: str = "config") -> FanoutConfig:
    """Validate an already-parsed mapping, after merging ``defaults`` under every destination."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{origin}: expected a mapping at the top level")
    raw = dict(raw)
    defaults = raw.pop("defaults", None) or {}
    if not isinstance(defaults, dict):
        raise ConfigError(f"{origin}: defaults must be a mapping (e.g. defaults: {{ducklake: {{table: events}}}})")
    destinations = raw.get("destinations")
    if isinstance(destinations, list):
        raw["destinations"] = [
            _merge(_expand(defaults, d), d) if isinstance(d, dict) else d for d in destinations
        ]
    return validate(FanoutConfig, raw, origin)


def _expand(value: Any, destination: dict[str, Any]) -> Any:
    """Fill ``{id}`` / ``{routing_value}`` in the defaults' strings for one destination."""
    if isinstance(value, dict):
        return {k: _expand(v, destination) for k, v in value.items()}
    if isinstance(value, str):
        return value.replace("{id}", str(destination.get("id", ""))).replace(
            "{routing_value}", str(destination.get("routing_value", ""))
        )
    return value


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Nested merge: the destination's own keys win; catalog and catalog_env replace each other."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            inner = dict(out[key])
            if "catalog" in value or "catalog_env" in value:
                inner.pop("catalog", None)
                inner.pop("catalog_env", None)
            out[key] = _merge(inner, value)
        else:
            out[key] = value
    return out
