"""End to end on DuckLake: a backlog drains as driver batches of at most ``apply.max_batch_rows``
staged rows (not one Spark batch of everything staged), each full one built while the one before it
commits (``run.read_ahead``), the apply pass starts no Spark session for them
(``engines.spark.on_demand``), and the target equals the source."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import psycopg
import pytest

from headrace.control.status import pipeline_status
from headrace.pipeline import Pipeline
from tests.e2e.helpers import assert_same, make_config
from tests.e2e.test_pipeline import run_caught_up

CAP = 250  # apply.max_batch_rows
FLUSH = 100  # staging.flush_rows: files of at most ~100 rows, so a batch of files can pass CAP


def test_a_backlog_drains_as_capped_driver_batches(source_dsn: str, tmp_path: Path, spark: Any,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS backlog_cap; CREATE TABLE backlog_cap (id int PRIMARY KEY, v int, t text);"
                     "INSERT INTO backlog_cap SELECT g, 0, 'seed' FROM generate_series(1, 50) g")
    config = make_config(source_dsn, tmp_path, ["public.backlog_cap"], "ducklake",
                         staging={"path": str(tmp_path / "staging"), "flush_rows": FLUSH},
                         apply={"max_batch_rows": CAP})
    pipeline = Pipeline(config, spark=spark)
    run_caught_up(pipeline)
    # The backlog is written while nothing runs: 12 transactions of 60 updates, 25 inserts and 15
    # deletes (~1,200 changes), staged in ~100-row files by the next run.
    changes = 0
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        for i in range(12):
            low, high = 1 + 15 * i, 51 + 25 * i
            with conn.transaction():
                changes += conn.execute(
                    "UPDATE backlog_cap SET v = v + 1, t = md5(random()::text)"
                    " WHERE id IN (SELECT id FROM backlog_cap ORDER BY id DESC LIMIT 60)").rowcount
                changes += conn.execute(
                    "INSERT INTO backlog_cap SELECT g, 1, 'new' FROM generate_series(%s::int, %s::int) g",
                    (high, high + 24)).rowcount
                changes += conn.execute(
                    "DELETE FROM backlog_cap WHERE id >= %s AND id < %s", (low, low + 15)).rowcount
    pipeline = Pipeline(config, spark=spark)  # a new run (process) drains it: its own on-demand session
    with caplog.at_level(logging.INFO, logger="headrace.materialize"):
        run_caught_up(pipeline)
    batches = [r for r in caplog.records if r.getMessage() == "apply.batch"]
    rows = [int(r.__dict__["rows"]) for r in batches]
    assert sum(rows) == changes and len(rows) >= changes // CAP  # every change applied, in several batches
    assert all(n <= CAP or files == 1 for n, files in zip(rows, [r.__dict__["files"] for r in batches],
                                                           strict=True)), rows
    assert {r.__dict__["build_lane"] for r in batches} == {"driver"}
    assert any(r.__dict__.get("read_ahead") for r in batches), "no batch was read ahead"
    assert {r.__dict__["build_reason"].split(" staged rows")[1] for r in batches} == {" <= apply.driver_batch_rows 200000"}
    (table,) = pipeline_status(config)["tables"]  # status from state: what another process's status reads
    assert (table["lanes"]["build"], table["lanes"]["apply"]) == ("driver", "driver")
    assert "DuckDB" in table["lanes"]["apply_reason"]
    assert not pipeline.spark_on_demand.started  # nothing of the apply (nor the target) reached for Spark
    assert_same(pipeline, source_dsn, "public.backlog_cap")
