"""A throwaway Spark standalone cluster (a master and one worker on loopback), started from pyspark's own
``bin/spark-class``: for the cluster tests and ``bench/cluster.py``, as ``ThrowawayPostgres`` is for
PostgreSQL. A user's cluster is theirs; headrace only points ``spark.master`` at it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from headrace.core.ports import free_port


class ThrowawaySparkCluster:
    """``start()`` a master and a worker of ``cores`` cores; ``url`` is the master's; executors log
    under ``logs/work``."""

    def __init__(self, logs: Path, cores: int = 2, memory: str = "2g") -> None:
        self.logs = logs
        self.cores = cores
        self.memory = memory
        self.url = ""
        self._procs: list[subprocess.Popen[bytes]] = []

    def start(self, timeout: float = 60.0) -> ThrowawaySparkCluster:
        import pyspark

        self.logs.mkdir(parents=True, exist_ok=True)
        home = Path(pyspark.__file__).parent
        spark_class = str(home / "bin" / "spark-class")
        env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1",
               "PYSPARK_PYTHON": sys.executable, "SPARK_WORKER_DIR": str(self.logs / "work")}
        port = free_port()
        self.url = f"spark://127.0.0.1:{port}"
        master_log = self.logs / "master.log"
        with open(master_log, "w") as master_out, open(self.logs / "worker.log", "w") as worker_out:
            self._procs.append(subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                 "--webui-port", str(free_port())], env=env, stdout=master_out, stderr=subprocess.STDOUT))
            self._procs.append(subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
                 "--cores", str(self.cores), "--memory", self.memory, "--webui-port", str(free_port())],
                env=env, stdout=worker_out, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + timeout
        while "Registering worker" not in master_log.read_text():
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the Spark worker did not register in {timeout:g} s: {master_log}")
            time.sleep(0.5)
        return self

    def executor_tasks(self) -> int:
        """Tasks the executors finished so far, from their logs."""
        return sum(p.read_text(errors="replace").count("Finished task") for p in (self.logs / "work").rglob("stderr"))

    def stop(self) -> None:
        for proc in reversed(self._procs):
            proc.terminate()
            proc.wait(30)
        self._procs = []
