"""The same pipeline on a Spark standalone cluster (master + worker on loopback), not local mode."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from headrace.config import parse_config
from headrace.pipeline import Pipeline
from headrace.spark_standalone import ThrowawaySparkCluster
from tests.e2e.helpers import assert_same


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThrowawaySparkCluster]:
    """A standalone master and one worker started from pyspark's own bin/spark-class."""
    cluster = ThrowawaySparkCluster(tmp_path_factory.mktemp("spark-cluster")).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def test_pipeline_runs_on_a_standalone_cluster(spark_cluster: ThrowawaySparkCluster, source_dsn: str,
                                               tmp_path: Path, spark: Any) -> None:
    """The copy at the defaults (on a cluster its groups are Spark jobs: copy_lane), then the changes
    with engine: spark (every batch built by Spark jobs): the executors did both, not the driver."""
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE events (id bigint PRIMARY KEY, kind text, at timestamptz, n numeric(8,2));"
                     "INSERT INTO events SELECT g, 'k' || g % 5, now(), g / 7.0 FROM generate_series(1, 5000) g")
    raw = {
        "name": "cluster",
        "source": {"dsn": source_dsn, "tables": ["public.events"]},
        "target": {"iceberg": {"warehouse": str(tmp_path / "wh"), "catalog_name": "hrcluster"}},
        "staging": {"path": str(tmp_path / "staging"), "flush_seconds": 0.5},
        "snapshot": {"chunk_pages": 8},
        "spark": {"master": spark_cluster.url, "conf": {"spark.executor.memory": "1g", "spark.cores.max": "2"}},
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw))
    cmd = [sys.executable, "-m", "headrace.cli", "run", "-c", str(path), "--until-caught-up"]
    before = spark_cluster.executor_tasks()
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "lane=spark lane_reason=cluster" in result.stderr, "the copy's groups did not run as Spark jobs"
    copied = spark_cluster.executor_tasks()
    assert copied > before, "no task ran on the cluster's executors for the copy"
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("UPDATE events SET kind = 'changed' WHERE id % 3 = 0; DELETE FROM events WHERE id > 4900")
    path.write_text(yaml.safe_dump({**raw, "engine": "spark"}))
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    batches = [line for line in result.stderr.splitlines() if " apply.batch " in line]
    assert batches and all("build_lane=spark" in line for line in batches), batches
    assert spark_cluster.executor_tasks() > copied, "no task ran on the cluster's executors for the changes"
    # Read the cluster-written tables back through this process's local session.
    local = Pipeline(parse_config({**raw, "spark": {"master": "local[2]"}}), spark=spark)
    assert assert_same(local, source_dsn, "public.events") == 4900
