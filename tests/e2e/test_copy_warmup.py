"""In local mode a copy's groups are copied by the driver's threads, every one of them, with no Spark
job and no Spark session started (a DuckLake copy needs none): the same files and rows, within
``snapshot.max_connections``; and the driver's files hold what Spark's tasks (a cluster's lane) write,
value for value."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import psycopg

from headrace.engines.driver.copy import copy_chunks_on_driver
from headrace.engines.spark.copy import copy_chunks_to_files
from headrace.pipeline import Pipeline
from headrace.source.postgres.source import chunk_reader
from headrace.targets.ducklake.target import DuckLakeTarget
from tests.e2e.helpers import assert_same, copy_connections, make_config
from tests.e2e.test_copy_files import CHUNKS, _named, _taken, assert_same_values
from tests.e2e.test_copy_on_driver import POSITION
from tests.e2e.test_pipeline import run_caught_up
from tests.targets.test_ducklake_target import settings_for


class _Lanes(logging.Handler):
    """Each committed group's lane, from the copy's progress events."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lanes: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() == "snapshot.progress":
            self.lanes.append(record.__dict__["lane"])


def test_local_mode_copies_every_group_on_the_driver_without_starting_spark(source_dsn: str, tmp_path: Path,
                                                                            spark: Any) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE warming (id int PRIMARY KEY, amount numeric(12,2), at timestamptz, pad text)")
        conn.execute("INSERT INTO warming SELECT g, g / 7.0, '2024-01-01'::timestamptz + g * interval '1 minute',"
                     " repeat('x', 300) FROM generate_series(1, 600) g")
    config = make_config(source_dsn, tmp_path, ["public.warming"], "ducklake",
                         snapshot={"chunk_pages": 2, "max_connections": 3})
    pipeline = Pipeline(config, spark=spark)
    started: list[str] = []
    pipeline.spark_on_demand._start = lambda: started.append("started") or spark  # type: ignore[func-returns-value]
    seen = _Lanes()
    snapshot_log = logging.getLogger("headrace.snapshot")
    level = snapshot_log.level
    snapshot_log.addHandler(seen)
    snapshot_log.setLevel(logging.INFO)
    try:
        with copy_connections(source_dsn) as connections:
            run_caught_up(pipeline)
    finally:
        snapshot_log.removeHandler(seen)
        snapshot_log.setLevel(level)
    assert len(seen.lanes) > 1 and set(seen.lanes) == {"driver"}, seen.lanes
    assert started == [], "a DuckLake copy in local mode started the Spark session"
    assert max(connections) <= 3, f"the copy held {max(connections)} source connections with max_connections 3"
    assert assert_same(pipeline, source_dsn, "public.warming") == 600


def test_the_driver_threads_write_what_spark_tasks_write(source_dsn: str, tmp_path: Path, spark: Any) -> None:
    taken, n = _taken(source_dsn)
    settings = settings_for("duckdb", tmp_path)
    target = DuckLakeTarget(spark, settings, "p1")
    try:
        for name, copy in (("by_tasks", lambda t, r, s: copy_chunks_to_files(spark, t, r, CHUNKS, POSITION, s)),
                           ("by_driver", lambda t, r, s: copy_chunks_on_driver(t, r, CHUNKS, POSITION, s, 2))):
            table = _named(taken, name)
            target.ensure_table(table)
            sink = target.copy_sink(table, replace=True)
            assert sink is not None
            done = copy(table, chunk_reader(source_dsn, None, taken, True), sink)
            assert [c.chunk for c in done] == [0, 1] and not any(c.needs_spark for c in done)
            assert target.register_copy_files(table, sink, [c.file for c in done if c.file], replace=True) == n
    finally:
        target.close()
    assert_same_values(settings, taken, "by_driver", "by_tasks")

