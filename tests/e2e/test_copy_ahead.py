"""A fresh Iceberg copy writes its first groups' files before Spark and the table exist, into the sink
told from the settings (``files.copy_sink_ahead``), and registers them once the table is there; a
table whose sink is not the one told (another data folder, other field ids, another shape) gets none
of those files: they are deleted and the chunks copied again into its own folder, or through Spark."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from headrace.core.names import quote_spark
from headrace.materialize.file_copy import same_place
from headrace.pipeline import Pipeline
from headrace.source.postgres.catalog import read_table_schema
from headrace.targets.iceberg.config import IcebergConfig
from headrace.targets.iceberg.files import copy_sink_ahead
from headrace.targets.iceberg.target import IcebergTarget
from tests.conftest import ThrowawayPostgres
from tests.e2e.helpers import assert_same, make_config
from tests.e2e.test_catalogs import jdbc_target
from tests.e2e.test_pipeline import run_caught_up

_catalogs = itertools.count()
ROWS = 600


@pytest.mark.parametrize("catalog", ["hadoop", "jdbc", "hadoop file: URI"])
@pytest.mark.parametrize("name", ["plain", "a/b%c", ".."])
def test_the_sink_told_ahead_is_the_one_the_created_table_gives(source_dsn: str, tmp_path: Path, spark: Any,
                                                                pg_server: ThrowawayPostgres, catalog: str,
                                                                name: str) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE told (id int PRIMARY KEY, amount numeric(12,2), at timestamptz, tags text[],"
                     " pad text)")
        table = dataclasses.replace(read_table_schema(conn, "public.told"), target_as=("public", name))
    flat = dataclasses.replace(table, columns=tuple(c for c in table.columns if c.name != "tags"))
    raw = jdbc_target(pg_server, tmp_path)["iceberg"] if catalog == "jdbc" else {
        "warehouse": f"file://{tmp_path / 'wh'}" if "URI" in catalog else str(tmp_path / "wh"),
        "catalog_name": f"hr_ahead_{next(_catalogs)}"}
    settings = IcebergConfig.model_validate(raw)
    assert copy_sink_ahead(settings, table) is None, "an array column: the copy keeps the table's own sink"
    told = copy_sink_ahead(settings, flat)
    assert told is not None
    target = IcebergTarget(spark, settings, "p")
    real = target.copy_sink(flat, True)
    assert real is not None
    assert same_place(told, real), (told, real)
    assert told.location == real.location
    assert told.compression == real.compression


def _seed(dsn: str, table: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, amount numeric(12,2), at timestamptz, pad text)")
        conn.execute(f"INSERT INTO {table} SELECT g, g / 7.0, '2024-01-01'::timestamptz + g * interval '1 minute',"
                     f" repeat('x', 300) FROM generate_series(1, {ROWS}) g")


class _Events(logging.Handler):
    """The snapshot events of a run, by name."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append((record.getMessage(), dict(record.__dict__)))

    def named(self, name: str) -> list[dict[str, Any]]:
        return [fields for event, fields in self.seen if event == name]


def _parquet(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.parquet")) if folder.is_dir() else []


def _run_held(pipeline: Pipeline, spark: Any, folder: Path) -> _Events:
    """Run ``pipeline`` caught up with its Spark session started only once a Parquet file is in
    ``folder``: a copy that waits for Spark (or its table) before writing one never gets it."""

    def start() -> Any:
        deadline = time.monotonic() + 60
        while not _parquet(folder):
            if time.monotonic() > deadline:
                raise AssertionError(f"no file in {folder} 60 s into the copy: it waits for Spark")
            time.sleep(0.02)
        return spark

    pipeline.spark_on_demand._start = start
    events = _Events()
    snapshot_log = logging.getLogger("headrace.snapshot")
    level = snapshot_log.level
    snapshot_log.addHandler(events)
    snapshot_log.setLevel(logging.INFO)
    try:
        run_caught_up(pipeline)
    finally:
        snapshot_log.removeHandler(events)
        snapshot_log.setLevel(level)
    return events


@pytest.fixture
def held_copy(source_dsn: str, tmp_path: Path) -> Iterator[tuple[Any, Path]]:
    """A table of many chunks and the config copying it; the data folder the sink told ahead names."""
    _seed(source_dsn, "ahead")
    config = make_config(source_dsn, tmp_path, ["public.ahead"], snapshot={"chunk_pages": 2, "max_connections": 2})
    yield config, Path(config.target.settings.warehouse) / "public" / "ahead" / "data"


def test_a_fresh_copy_writes_files_before_spark_and_its_table_exist(held_copy: tuple[Any, Path], spark: Any,
                                                                    source_dsn: str) -> None:
    config, folder = held_copy
    pipeline = Pipeline(config, spark=spark)
    events = _run_held(pipeline, spark, folder)
    (ready,) = events.named("snapshot.table_ready")
    assert ready["sink_as_told"] is True
    assert not events.named("snapshot.sink_mismatch")
    lanes = [e["lane"] for e in events.named("snapshot.progress")]
    assert lanes[0] == "driver", lanes
    assert assert_same(pipeline, source_dsn, "public.ahead") == ROWS
    assert _parquet(folder) == _table_files(spark, config), "a file written ahead was left out of the table"


def _table_files(spark: Any, config: Any) -> list[Path]:
    """The data files the table's current snapshot holds."""
    name = f"{quote_spark(config.target.settings.catalog_name)}.public.ahead"
    paths = [str(r[0]) for r in spark.sql(f"SELECT file_path FROM {name}.files").collect()]
    return sorted(Path(p.removeprefix("file:")) for p in paths)


def _precreate(spark: Any, config: Any, how: str, elsewhere: Path) -> None:
    """Make the table before the copy, so that its sink is not the one told ahead."""
    settings = config.target.settings
    IcebergTarget(spark, settings, config.name)  # registers the catalog in the session
    name = f"{quote_spark(settings.catalog_name)}.public.ahead"
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {quote_spark(settings.catalog_name)}.public")
    columns = "id int, amount decimal(12,2), at timestamp, pad string, _hr_lsn bigint, _hr_seq bigint," \
              " _hr_commit_ts timestamp"
    if how == "data folder":
        spark.sql(f"CREATE TABLE {name} ({columns}) USING iceberg TBLPROPERTIES ('format-version'='2',"
                  f" 'write.data.path'='{elsewhere}')")
    elif how == "field ids":  # the same columns, each with another id
        spark.sql(f"CREATE TABLE {name} (gone int, {columns}) USING iceberg TBLPROPERTIES ('format-version'='2')")
        spark.sql(f"ALTER TABLE {name} DROP COLUMN gone")
    else:  # another shape: the table takes no files, the copy replaces it through Spark
        spark.sql(f"CREATE TABLE {name} (id bigint, other string) USING iceberg TBLPROPERTIES ('format-version'='2')")


@pytest.mark.parametrize("how", ["data folder", "field ids", "shape"])
def test_a_table_whose_sink_is_not_the_one_told_gets_its_chunks_copied_again(
        held_copy: tuple[Any, Path], spark: Any, source_dsn: str, tmp_path: Path, how: str) -> None:
    config, folder = held_copy
    elsewhere = tmp_path / "elsewhere"
    _precreate(spark, config, how, elsewhere)
    pipeline = Pipeline(config, spark=spark)
    events = _run_held(pipeline, spark, folder)
    (ready,) = events.named("snapshot.table_ready")
    assert ready["sink_as_told"] is False
    (mismatch,) = events.named("snapshot.sink_mismatch")
    assert mismatch["files_deleted"] >= 1
    assert assert_same(pipeline, source_dsn, "public.ahead") == ROWS
    if how == "data folder":
        assert mismatch["table_folder"] == str(elsewhere)
        assert not _parquet(folder), "the files written ahead into the folder told were left behind"
        assert _parquet(elsewhere) == _table_files(spark, config)
    else:  # the table's folder is the one told: only the table's own files are left in it
        assert mismatch["table_folder"] == (str(folder) if how == "field ids" else None)
        assert mismatch["same_ids"] is False
        assert _parquet(folder) == _table_files(spark, config)
    if how == "shape":  # copied through Spark's writer, group by group
        assert not any("lane" in e for e in events.named("snapshot.progress"))
