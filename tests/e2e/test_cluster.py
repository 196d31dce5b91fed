"""The same pipeline on a Spark standalone cluster (master + worker on loopback), not local mode."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pyspark
import pytest
import yaml

from headrace.config import parse_config
from headrace.pipeline import Pipeline
from headrace.source.postgres.throwaway import free_port
from tests.e2e.helpers import assert_same


@pytest.fixture(scope="module")
def cluster_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the cluster's master, worker and executors log (executors under ``work/``)."""
    return tmp_path_factory.mktemp("spark-cluster")


def executor_tasks(logs: Path) -> int:
    """Tasks the cluster's executors finished, from their logs."""
    return sum(p.read_text(errors="replace").count("Finished task") for p in (logs / "work").rglob("stderr"))


@pytest.fixture(scope="module")
def spark_cluster(cluster_logs: Path) -> Iterator[str]:
    """A standalone master and one worker started from pyspark's own bin/spark-class."""
    home = Path(pyspark.__file__).parent
    spark_class = str(home / "bin" / "spark-class")
    logs = cluster_logs
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": sys.executable, "SPARK_WORKER_DIR": str(logs / "work")}
    port, ui1, ui2 = free_port(), free_port(), free_port()
    url = f"spark://127.0.0.1:{port}"
    with open(logs / "master.log", "w") as master_log, open(logs / "worker.log", "w") as worker_log:
        master = subprocess.Popen([spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                   "--port", str(port), "--webui-port", str(ui1)],
                                  env=env, stdout=master_log, stderr=subprocess.STDOUT)
        worker = subprocess.Popen([spark_class, "org.apache.spark.deploy.worker.Worker", url, "--host",
                                   "127.0.0.1", "--cores", "2", "--memory", "2g", "--webui-port", str(ui2)],
                                  env=env, stdout=worker_log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while "Registering worker" not in (logs / "master.log").read_text():
                assert time.monotonic() < deadline, (logs / "master.log").read_text()[-2000:]
                time.sleep(0.5)
            yield url
        finally:
            for proc in (worker, master):
                proc.terminate()
                proc.wait(30)


def test_pipeline_runs_on_a_standalone_cluster(spark_cluster: str, cluster_logs: Path, source_dsn: str,
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
        "spark": {"master": spark_cluster, "conf": {"spark.executor.memory": "1g", "spark.cores.max": "2"}},
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw))
    cmd = [sys.executable, "-m", "headrace.cli", "run", "-c", str(path), "--until-caught-up"]
    before = executor_tasks(cluster_logs)
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "lane=spark lane_reason=cluster" in result.stderr, "the copy's groups did not run as Spark jobs"
    copied = executor_tasks(cluster_logs)
    assert copied > before, "no task ran on the cluster's executors for the copy"
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("UPDATE events SET kind = 'changed' WHERE id % 3 = 0; DELETE FROM events WHERE id > 4900")
    path.write_text(yaml.safe_dump({**raw, "engine": "spark"}))
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    batches = [line for line in result.stderr.splitlines() if " apply.batch " in line]
    assert batches and all("build_lane=spark" in line for line in batches), batches
    assert executor_tasks(cluster_logs) > copied, "no task ran on the cluster's executors for the changes"
    # Read the cluster-written tables back through this process's local session.
    local = Pipeline(parse_config({**raw, "spark": {"master": "local[2]"}}), spark=spark)
    assert assert_same(local, source_dsn, "public.events") == 4900
