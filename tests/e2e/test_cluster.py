"""The same pipeline on a Spark standalone cluster (master + worker on loopback), not local mode."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from headrace.config import parse_config
from headrace.engines.spark.standalone import ThrowawaySparkCluster
from headrace.pipeline import Pipeline
from tests.e2e.helpers import _norm, assert_same, kill_after_batches, run_command, source_rows
from tests.e2e.test_object_storage import iceberg_rows, pyiceberg_s3
from tests.objectstore import MotoServer


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


def _load(dsn: str, stop: threading.Event) -> None:
    """Inserts, updates and deletes on public.events in small transactions until ``stop``."""
    next_id = 10_000
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            with conn.transaction():
                conn.execute("INSERT INTO events SELECT g, 'live', now(), 1 FROM generate_series(%s::bigint, %s::bigint) g",
                             (next_id, next_id + 4))
                conn.execute("UPDATE events SET kind = 'upd', n = n + 1 WHERE id %% 97 = %s", (next_id % 97,))
                conn.execute("DELETE FROM events WHERE id = %s", (next_id - 7_000,))
            next_id += 5
            time.sleep(0.05)


def _iceberg_on_s3_equals_source(server: MotoServer, bucket: str, dsn: str) -> int:
    """public.events read from the Hadoop-catalog table on S3 by pyiceberg and by DuckDB (readers not
    ours), each equal to the source; the row count."""
    from pyiceberg.table import StaticTable

    schema, expected = source_rows(dsn, "public.events")
    folder = f"s3://{bucket}/warehouse/public/events/metadata"
    hint = server.client().get_object(Bucket=bucket, Key="warehouse/public/events/metadata/version-hint.text")
    metadata = f"{folder}/v{hint['Body'].read().decode().strip()}.metadata.json"
    table = StaticTable.from_metadata(metadata, properties=pyiceberg_s3(server))
    columns = tuple(schema.column_names)
    by_pyiceberg = sorted((tuple(_norm(v) for v in row.values()) for row in
                           table.scan(selected_fields=columns).to_arrow().to_pylist()), key=repr)
    assert by_pyiceberg == expected, f"pyiceberg: {len(by_pyiceberg)} rows, source {len(expected)}"
    assert iceberg_rows(server, metadata, list(columns)) == expected, "DuckDB read other rows than the source's"
    return len(expected)


@pytest.mark.slow  # ~2-3 min: three runs on the cluster, each starting a driver JVM and its executors
def test_cluster_with_staging_and_warehouse_on_s3_copies_streams_and_survives_kill_9(
        spark_cluster: ThrowawaySparkCluster, source_dsn: str, s3_server: MotoServer, s3_bucket: str,
        tmp_path: Path) -> None:
    """The executors reach the store through S3A (the jars shipped with spark.jars): the copy's groups
    and every batch are Spark jobs on the cluster, reading staged files from and writing table files to
    the bucket; a kill -9 under load and a restart leave the table equal to the source."""
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE events (id bigint PRIMARY KEY, kind text, seen timestamptz, n numeric(8,2));"
                     "INSERT INTO events SELECT g, 'k' || g % 5, now(), g / 7.0 FROM generate_series(1, 3000) g")
    raw = {
        "name": "clusters3", "engine": "spark",
        "source": {"dsn": source_dsn, "tables": ["public.events"]},
        "target": {"iceberg": {"warehouse": f"s3://{s3_bucket}/warehouse", "catalog_name": "hrclusters3"}},
        "staging": {"path": f"s3://{s3_bucket}/staging", "flush_seconds": 0.5},
        "snapshot": {"chunk_pages": 8},  # several chunks: the copy's tasks write their files with pyarrow
        "spark": {"master": spark_cluster.url, "conf": {"spark.executor.memory": "1g", "spark.cores.max": "2"}},
    }
    cmd = run_command(raw, tmp_path)
    before = spark_cluster.executor_tasks()
    result = subprocess.run([*cmd, "--until-caught-up"], capture_output=True, text=True, timeout=600)
    (tmp_path / "copy.log").write_text(result.stderr)
    assert result.returncode == 0, result.stderr[-4000:]
    copied = spark_cluster.executor_tasks()
    assert copied > before, "no task ran on the cluster's executors for the copy"
    assert _iceberg_on_s3_equals_source(s3_server, s3_bucket, source_dsn) == 3000

    stop = threading.Event()
    writer = threading.Thread(target=_load, args=(source_dsn, stop))
    writer.start()
    try:
        # A cluster run's first batches wait for its executors and S3A's first use: up to minutes on a
        # loaded machine, so the wait is longer than the local tests'.
        kill_after_batches(cmd, tmp_path / "killed.log", random.Random(5), timeout=600)
    finally:
        stop.set()
        writer.join()
    with psycopg.connect(source_dsn, autocommit=True) as conn:  # the restart has a batch of its own too
        conn.execute("UPDATE events SET kind = 'after' WHERE id % 11 = 0")
    result = subprocess.run([*cmd, "--until-caught-up"], capture_output=True, text=True, timeout=600)
    (tmp_path / "restart.log").write_text(result.stderr)
    assert result.returncode == 0, result.stderr[-4000:]
    batches = [line for line in result.stderr.splitlines() if " apply.batch " in line]
    assert batches and all("build_lane=spark" in line for line in batches), batches
    assert spark_cluster.executor_tasks() > copied, "no task ran on the cluster's executors for the changes"
    assert s3_server.keys(s3_bucket, "warehouse/public/events/data/"), "no table file was written to the bucket"
    assert _iceberg_on_s3_equals_source(s3_server, s3_bucket, source_dsn) > 3000
