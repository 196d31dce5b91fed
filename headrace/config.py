"""Typed pipeline configuration: YAML file in, frozen pydantic models out, resolved once at start-up.

Secrets never sit in the file: any ``*_env`` key names an environment variable that holds the
value (``dsn_env: SHOP_DSN``). ``redacted_dsn`` is what logs and status show. The ``target:``
section names one registered target (``headrace.targets.registry``), whose own model reads its settings.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from headrace.core.errors import ConfigError
from headrace.core.lanes import Engine
from headrace.core.maintenance import MaintenancePolicy
from headrace.core.names import TableName
from headrace.core.names import columns_as_text_item as columns_as_text_item  # re-exported (was defined here)
from headrace.core.settings import Frozen as _Frozen
from headrace.core.settings import ListenAddress, is_loopback, read_yaml, validate
from headrace.core.settings import redacted_dsn as redacted_dsn  # re-exported: imported from here elsewhere
from headrace.history.config import HistoryConfig
from headrace.lineage.config import LineageConfig
from headrace.source.config import MYSQL_SCHEMES as MYSQL_SCHEMES  # re-exported
from headrace.source.config import SourceConfig
from headrace.source.config import source_kind as source_kind  # re-exported
from headrace.storage import configure as configure_storage
from headrace.storage import is_object_store
from headrace.storage.config import StorageConfig
from headrace.targets.registry import TargetSection

_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,40}$")


class TargetConfig(TargetSection):
    """Exactly one registered target (``headrace.targets.registry``): ``kind`` names it, ``settings``
    is its own settings model (``targets/<kind>/config.py``)."""

    def spark_conf(self, user_conf: Mapping[str, str]) -> dict[str, str]:
        """The Spark conf this target needs at session start (jars, extensions), beside ``user_conf``."""
        return self.plugin.spark_conf(self.settings, user_conf)

    def table_name(self, pipeline: str, table: TableName) -> str:
        """The name users query for the table whose target-side name is ``table``."""
        return self.plugin.table_name(self.settings, pipeline, table)


class StagingConfig(_Frozen):
    """Where capture writes staged change files (any filesystem Spark's executors can read)."""

    path: str = Field(description="staging folder")
    flush_rows: int = Field(50_000, gt=0, description="flush when this many changes are buffered")
    flush_bytes: int = Field(64 << 20, gt=0, description="flush when buffered changes reach this size")
    flush_rows_under_load: int | None = Field(
        None, gt=0, description="while the previous flush is still being written (capture reads faster than"
        " staging takes files), capture keeps buffering up to this many changes (or flush_bytes) before it"
        " hands the next flush over: fewer, larger files under load, the same small ones when quiet; unset:"
        " 4 x flush_rows (at most a quarter of max_pending_rows when that is set)"
    )
    flush_seconds: float = Field(
        1.0, gt=0, description="the longest a buffered change waits for its flush while the flusher is free;"
        " a flush comes sooner, once the buffered changes are twice as old as the last flush took to write"
        " (at least 0.05 s): a quiet stream's changes are staged at once, a busy stream's in larger files"
        " (capture/flusher.py, Flusher.linger)")
    heartbeat_seconds: float = Field(
        10.0, gt=0, description="when idle, emit a heartbeat so the slot advances past others' WAL"
    )
    gc_seconds: float = Field(
        30.0, gt=0, description="how often staged files every table has applied are deleted"
    )
    max_pending_rows: int | None = Field(
        None, gt=0, description="backpressure: capture stops reading WAL while more staged changes than"
        " this wait to be applied (the slot then retains WAL on the source); unset = no bound"
    )
    max_pending_bytes: int | None = Field(
        None, gt=0, description="backpressure: the same bound in staged-file bytes; unset = no bound"
    )

    @property
    def flush_rows_busy(self) -> int:
        """``flush_rows_under_load`` as set, or its default."""
        if self.flush_rows_under_load is not None:
            return max(self.flush_rows, self.flush_rows_under_load)
        rows = 4 * self.flush_rows
        if self.max_pending_rows is not None:
            rows = min(rows, self.max_pending_rows // 4)
        return max(self.flush_rows, rows)


class SnapshotConfig(_Frozen):
    """The initial copy."""

    chunk_pages: int = Field(4096, gt=0, description="heap pages per copy chunk (8 KiB each)")
    max_connections: int = Field(
        4, gt=0, description="most source connections the copy holds at once, the session holding the"
        " exported snapshot included (PostgreSQL): planning, chunk reads and tables copied side by side"
        " share them; with chunk_pages, this is the cap on the copy's load on the source"
    )
    tables_at_once: int = Field(
        8, gt=0, description="tables copied side by side; they share the max_connections connections,"
        " and a one-chunk table holds one only while it is read (then mostly waits for its commit)"
    )
    binary_copy: bool = Field(
        True, description="read chunks as binary COPY into typed Arrow (ADBC driver); false reads CSV text"
        " and casts every column in Spark (the earlier path, kept as a fallback)"
    )
    stall_seconds: float = Field(
        300.0, gt=0, description="a table's copy that makes no progress (no chunk read, no chunk group"
        " written) for this long fails: the stacks of its threads are logged, its reads on the source are"
        " ended (their locks go) and it is retried like any failure; a chunk group takes seconds, so this"
        " only bounds a copy that is stuck"
    )
    give_way_after_seconds: float | None = Field(
        2.0, ge=0, description="a statement (a DDL such as ALTER TABLE, most often) that waits this long for"
        " the lock a copy's read holds on a table makes the copy give way: the read is cancelled, the"
        " statement and the application's writes queued behind it go through, and the table's copy"
        " resumes from its last finished chunk group; null: the copy keeps its lock (the statement waits"
        " for the read) and only reports the waiter (log, status, /readyz, metrics). A chunk's read takes"
        " about a second: 2 s lets it finish rather than redo it"
    )


class ApplyConfig(_Frozen):
    """The materializer."""

    max_batch_files: int = Field(200, gt=0, description="staged files per table per apply batch")
    idle_sleep_seconds: float = Field(0.5, gt=0, description="pause when there is nothing to apply while"
                                      " tables are being copied, catching up, retried or dropped")
    idle_max_seconds: float = Field(5.0, gt=0, description="longest pause when every table streams and"
                                    " nothing is staged (staged changes and commands end it at once)")
    concurrency: int | None = Field(
        None, ge=1, description="tables whose batches are applied at the same time (Spark jobs from several"
        " driver threads, each in its own FAIR scheduler pool), one batch per table at a time; 1 applies one"
        " table after another; unset: the target's own, 4 for Iceberg, 2 for DuckLake (its one writer commits"
        " one group of batches at a time: a second batch built beside the commit is enough, and more wait"
        " longer; docs/benchmarks.md, Freshness)")
    driver_batch_rows: int = Field(
        200_000, ge=0, description="with engine: auto, a keyed batch of at most this many staged rows is"
        " read, deduplicated and cast by DuckDB on the driver instead of a Spark job (the same values; a"
        " value it cannot cast exactly goes through Spark): DuckLake then commits it in DuckDB, Iceberg"
        " on the driver too (target.iceberg.apply_on_driver) or else MERGEs it from a local relation; 0 sends"
        " every batch through Spark. Up to 200,000 rows the driver was faster than Spark's jobs on 2 cores"
        " (docs/benchmarks.md)")
    max_batch_rows: int | None = Field(
        None, gt=0, description="the most staged rows an apply batch of a keyed table takes (at least one"
        " staged file); unset: driver_batch_rows (a backlog then drains as a row of driver batches beside"
        " capture, not as Spark batches of everything staged)")

    consistency: Literal["table", "transaction"] = Field(
        "table", description="table: each table's batches become visible on their own (the freshest); transaction:"
        " the streaming tables' batches up to one common point of the source's log (a flush's end: whole source"
        " transactions) commit together in one target transaction, so a source transaction that wrote several"
        " tables becomes visible in all of them at once (DuckLake; an Iceberg REST catalog: one multi-table commit"
        " of the batches applied on the driver. On Iceberg each cut also records every table's snapshot id in the"
        " state's _headrace.cuts, for readers to time-travel to: the Hadoop and JDBC catalogs commit one table at a"
        " time). Tables still copying or catching up apply on their own until they stream")

    def batch_rows(self, caps_batches: bool) -> int | None:
        """``max_batch_rows``, or when unset ``driver_batch_rows`` for a target that ``caps_batches``
        (None: no cap)."""
        if self.max_batch_rows is not None:
            return self.max_batch_rows
        return self.driver_batch_rows if caps_batches and self.driver_batch_rows > 0 else None


class SchemaChangesConfig(_Frozen):
    """What headrace does when the source's tables change shape or come and go."""

    drop_column: Literal["keep", "drop"] = Field(
        "keep", description="a dropped source column: keep it in the target (nullable, old rows keep their"
        " values, new rows NULL) or drop it there too"
    )
    drop_table: Literal["keep", "drop"] = Field(
        "keep", description="a dropped source table: keep its target table as it was, or drop it"
    )
    rename_table: Literal["keep", "follow"] = Field(
        "keep", description="a renamed source table (followed by OID): keep the target name, or rename the"
        " target table too"
    )
    recreated_table: Literal["resync", "refuse"] = Field(
        "resync", description="a table dropped and created again under the same name (new OID): copy the"
        " new table into the same target table, or stop and ask the operator"
    )


class ValuesConfig(_Frozen):
    """Source values a target type cannot hold (docs/types.md, "Values a target cannot hold")."""

    infinity: Literal["stop", "clamp"] = Field(
        "stop", description="infinity/-infinity dates and timestamps on a target without infinite values"
        " (Iceberg), and timestamps past 294247 AD on any target: stop the table with an error naming the"
        " value, or clamp them to 0001-01-01 / 9999-12-31 23:59:59.999999. DuckLake keeps infinity as is"
    )


class SparkConfig(_Frozen):
    """Where the Spark jobs run."""

    master: str = Field("local[*]", description="any Spark master URL: local[*], spark://host:7077, yarn, ...")
    conf: dict[str, str] = Field(default_factory=dict, description="extra Spark configuration")


class ApiConfig(ListenAddress):
    """The HTTP control plane of ``headrace run``: REST API, /metrics, health checks, status page."""

    listen: str = Field(
        "127.0.0.1:8765", description="host:port to serve on; port 0 picks a free port (tests)"
    )
    token_env: str | None = Field(
        "HEADRACE_API_TOKEN",
        description="environment variable holding the bearer token that mutating requests must send;"
        " required when listen is not a loopback address (on loopback the token is optional)",
    )

    @model_validator(mode="after")
    def _token_off_loopback(self) -> ApiConfig:
        if not self.loopback and not self.token_env:
            raise ValueError(f"api.listen {self.listen} is not a loopback address: set api.token_env")
        return self

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    def resolved_token(self) -> str | None:
        """The bearer token, or None when none is configured (allowed on loopback only)."""
        token = os.environ.get(self.token_env) if self.token_env else None
        if not token and not self.loopback:
            raise ConfigError(
                f"api.listen {self.listen} is not a loopback address and environment variable "
                f"{self.token_env} is not set: export a token, or listen on 127.0.0.1"
            )
        return token or None


class ReconnectConfig(_Frozen):
    """How long to wait between attempts while a server (source, state, DuckLake catalog) or the
    staging directory is unavailable: ``first_seconds``, doubling per failed attempt up to
    ``max_seconds``, for as long as it takes. Nothing is lost meanwhile: the slot keeps the WAL."""

    first_seconds: float = Field(1.0, gt=0, description="wait after the first failed attempt")
    max_seconds: float = Field(30.0, gt=0, description="longest wait between two attempts (the backoff cap)")
    connect_timeout_seconds: int = Field(5, gt=0, description="how long one probe connection may take")


class MaintenanceConfig(_Frozen):
    """Table maintenance inside ``run`` (also ``headrace maintain``): compact small files, apply
    away delete files, expire old snapshots, remove orphan files. Off the write path: the run loop
    maintains one due table between apply batches."""

    enabled: bool = Field(True, description="maintain tables on a schedule inside `run`")
    every_minutes: float = Field(60.0, gt=0, description="maintain a table at most this often ...")
    after_batches: int = Field(50, gt=0, description="... and only once it had this many apply batches since")
    max_batches: int = Field(
        600, gt=0, description="a table is also due once it had this many apply batches since its last pass,"
        " however recent that was: each merge-on-read batch adds a data file and a delete file that every"
        " later batch of the table reads until a pass compacts them")
    retention_hours: float = Field(
        1.0, ge=0, description="expire snapshots older than this (time travel reaches back this far). An Iceberg"
        " metadata file lists every snapshot kept, ~1 KiB each, and every commit writes it anew: at the commit"
        " rate the defaults' freshness gives (about one a second per busy table), a day kept would make each"
        " commit write ~84 MiB")
    keep_last: int = Field(5, ge=1, description="but always keep this many newest snapshots")
    max_snapshots: int = Field(
        40, ge=2, description="Iceberg: at most this many snapshots a table, whatever their age: every"
        " max_snapshots / 2 batches of a table, its oldest are expired down to half of it, in a step of its"
        " own (no Spark job; the table waits ~0.2-0.3 s). Every snapshot is ~1 KiB of the metadata file each commit writes and each reader"
        " parses: at the commit rate the defaults' freshness gives (about one a second per busy table), an"
        " hour of them made a DuckDB scan of a small table 5-9x slower than the table compacted. Time"
        " travel reaches back the lesser of retention_hours and this many commits")
    orphan_age_hours: float = Field(
        72.0, ge=24, description="remove unreferenced files older than this (at least 24: a running write's "
        "files are unreferenced until it commits)")

    def policy(self) -> MaintenancePolicy:
        """The per-pass part the targets follow."""
        return MaintenancePolicy(retention_seconds=self.retention_hours * 3600, keep_last=self.keep_last,
                                 orphan_age_seconds=self.orphan_age_hours * 3600, max_snapshots=self.max_snapshots)


class PipelineConfig(_Frozen):
    """A whole pipeline, as read from the YAML file."""

    name: str = Field(description="names the slot, the publication and the state rows")
    engine: Engine = Field(
        "auto", description="which engine runs the work (materialize/lanes.py decides each unit and logs"
        " why): auto, the driver (DuckDB, pyarrow) for small batches and, in local mode, the copy, Spark for"
        " the rest and for every copy on a cluster; spark, every batch build and copy group as Spark jobs"
        " (what a cluster's executors scale out); driver, the driver whenever it can, with no size bound")
    source: SourceConfig
    target: TargetConfig
    staging: StagingConfig
    snapshot: SnapshotConfig = SnapshotConfig()
    apply: ApplyConfig = ApplyConfig()
    spark: SparkConfig = SparkConfig()
    api: ApiConfig = ApiConfig()
    schema_changes: SchemaChangesConfig = SchemaChangesConfig()
    values: ValuesConfig = ValuesConfig()
    reconnect: ReconnectConfig = ReconnectConfig()
    lineage: LineageConfig = LineageConfig()  # OpenLineage events (off by default)
    maintenance: MaintenanceConfig = MaintenanceConfig()  # compaction and snapshot expiry (on by default)
    storage: StorageConfig = StorageConfig()  # the object store s3:// paths name (endpoint, region, keys)
    history: HistoryConfig = HistoryConfig()  # changelog, scd2, soft_delete tables (in place of or beside the mirror)

    @field_validator("name")
    @classmethod
    def _valid_name(cls, name: str) -> str:
        if not _NAME_RE.match(name):
            raise ValueError("name must be lowercase letters, digits and _, starting with a letter (≤41 chars)")
        return name

    @model_validator(mode="after")
    def _renames_supported(self) -> PipelineConfig:
        refusal = self.target.plugin.rename_refusal(self.target.settings)
        if refusal and self.schema_changes.rename_table == "follow":
            raise ValueError(f"schema_changes.rename_table: follow is not possible with target.{self.target.kind}"
                             f" {refusal}")
        return self

    @model_validator(mode="after")
    def _history_in_place_supported(self) -> PipelineConfig:
        if self.target.kind in ("ducklake", "iceberg"):
            return self
        own = [name for name, modes in self.history.tables.items() if "mirror" not in modes]
        if self.history.mode != "mirror" or own:
            which = f"history.mode: {self.history.mode}" if self.history.mode != "mirror" else f"history.tables {own[0]}"
            raise ValueError(f"{which} writes a history mode in place of the mirror, which target.{self.target.kind}"
                             " does not do (DuckLake and Iceberg do): list the mirror first, e.g. [mirror, scd2] in history.tables"
                             " (the history table is then <table>__scd2)")
        return self

    def locations(self) -> list[str]:
        """Every folder the pipeline writes files to: staging, and the target's data (``check``, ``drop``)."""
        return [self.staging.path, *self.target.plugin.locations(self.target.settings)]

    @property
    def uses_object_store(self) -> bool:
        """Some configured location is an ``s3://`` URI."""
        return any(is_object_store(location) for location in self.locations())

    @property
    def slot_name(self) -> str:
        return self.source.slot or f"headrace_{self.name}"

    @property
    def publication_name(self) -> str:
        return self.source.publication or f"headrace_{self.name}"


def load_config(path: str | Path) -> PipelineConfig:
    """Read and validate a pipeline file; every problem is reported in one ConfigError."""
    return parse_config(read_yaml(path), str(path))


def parse_config(raw: Any, origin: str = "config") -> PipelineConfig:
    """Validate an already-parsed mapping (as from YAML); its ``storage`` section becomes the store every
    engine of this process uses for ``s3://`` paths (``headrace.storage.configure``)."""
    config = validate(PipelineConfig, raw, origin)
    configure_storage(config.storage, in_use=config.uses_object_store)
    return config
