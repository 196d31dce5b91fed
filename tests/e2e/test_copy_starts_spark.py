"""A DuckLake copy of many tables at once, some of which need Spark, in a process whose JVM is not started.

Issue 35: the first copy thread needing Spark's casts launched the JVM while another copy thread
imported and logged; pyspark's launcher deadlocked with it, and the copy's sessions then held their
locks on the source for good. The run here is ``headrace run --until-caught-up`` in a fresh process
(this test process's Spark session would hide the race), bounded. It did not hang in three tries on the
code before the fix: the race needs an import in progress at the fork, and
the deterministic reproduction is ``tests/test_spark_gateway.py``; this run guards the whole path.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import psycopg

from headrace.config import parse_config
from headrace.pipeline import Pipeline
from headrace.source.postgres.copy import APPLICATION_NAME
from headrace.state.store import StateStore
from tests.e2e.helpers import assert_same, raw_config, run_command

PLAIN = [f"plain_{i}" for i in range(6)]
SPARK_ONLY = ["arrays", "far_dates"]  # values only Spark's casts take: the copy starts the JVM for these


def _create_tables(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name in PLAIN:
            conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v text, n numeric(12,2))")
            conn.execute(f"INSERT INTO {name} SELECT g, 'row ' || g, g / 7.0 FROM generate_series(1, 300) g")
        conn.execute("CREATE TABLE arrays (id int PRIMARY KEY, ints int[], words text[])")
        conn.execute("INSERT INTO arrays SELECT g, ARRAY[g, NULL, -g], ARRAY['a,b', NULL, 'é']"
                     " FROM generate_series(1, 300) g")
        conn.execute("CREATE TABLE far_dates (id int PRIMARY KEY, d date, ts timestamptz)")
        conn.execute("INSERT INTO far_dates VALUES (1, 'infinity', '-infinity'), (2, '0044-03-15 BC', NULL),"
                     " (3, '2024-02-29', '2024-02-29 12:00+00')")


def test_a_ducklake_copy_starting_spark_from_its_threads_never_hangs(
        source_dsn: str, tmp_path: Path, spark: Any) -> None:
    _create_tables(source_dsn)
    tables = [f"public.{t}" for t in PLAIN + SPARK_ONLY]
    raw: dict[str, Any] = {}
    for attempt in range(1):
        run_dir = tmp_path / f"run{attempt}"
        run_dir.mkdir()
        raw = raw_config(source_dsn, run_dir, tables, "ducklake", name=f"race{attempt}",
                         snapshot={"tables_at_once": 8, "max_connections": 4}, spark={"master": "local[1]"})
        try:
            result = subprocess.run([*run_command(raw, run_dir), "--until-caught-up"], capture_output=True,
                                    text=True, timeout=240)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"run {attempt} hung copying {len(tables)} tables into DuckLake") from exc
        assert result.returncode == 0, result.stderr[-3000:]
        assert "spark.started" in result.stderr, "no table needed Spark: the test no longer tests the race"
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        held = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
                            " AND state LIKE 'idle in transaction%%'", (APPLICATION_NAME,)).fetchone()
    assert held == (0,), "a copy session still holds a transaction on the source"
    pipeline = Pipeline(parse_config(raw), spark=spark)
    for table in tables[:-1]:
        assert_same(pipeline, source_dsn, table)
    state = StateStore(source_dsn, raw["name"])  # infinity and BC dates: no Python reader takes them back
    try:
        assert {r.qualified_name: r.rows_copied for r in state.tables()}["public.far_dates"] == 3
    finally:
        state.close()
