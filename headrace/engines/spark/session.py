"""SparkSession factory: master URL, the conf the configured target asks for, and the user's conf.

Local mode (``local[*]``) is the default; any other master URL (``spark://``, ``yarn``,
``k8s://``) runs the same jobs on a cluster. What a target needs in the session (Iceberg's runtime
jars and SQL extensions, a JDBC driver) comes from its plugin (``headrace.targets.registry``):
``target_conf`` below, usually ``config.target.spark_conf(config.spark.conf)``.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import tempfile
import time
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from headrace.logs import event

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("headrace.spark")

# Keys holding lists: a target's entries and the user's are joined, not replaced (separator).
_LISTS = {"spark.jars": ",", "spark.sql.extensions": ",", "spark.driver.extraClassPath": os.pathsep}


def merged_conf(target_conf: Mapping[str, str], user_conf: Mapping[str, str]) -> dict[str, str]:
    """``user_conf`` over ``target_conf``; list-valued keys keep both (the target's entries first)."""
    conf = {**target_conf, **user_conf}
    for key, sep in _LISTS.items():
        parts = [c[key] for c in (target_conf, user_conf) if c.get(key)]
        if parts:
            conf[key] = sep.join(dict.fromkeys(parts))
    return conf


def _package_zip() -> str:
    """Zip the headrace package so executors on a cluster can import the task code."""
    package_dir = Path(__file__).parent
    fd, path = tempfile.mkstemp(prefix="headrace-", suffix=".zip")
    os.close(fd)
    with zipfile.ZipFile(path, "w") as zf:
        for file in package_dir.rglob("*.py"):
            zf.write(file, str(file.relative_to(package_dir.parent)))
    return path


def build_session(
    master: str = "local[*]",
    conf: Mapping[str, str] | None = None,
    app_name: str = "headrace",
    target_conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Create (or return the running) SparkSession set up for headrace.

    ``conf`` is the user's ``spark.conf``; ``target_conf`` what the target needs (its plugin's
    ``spark_conf``): list-valued keys such as ``spark.jars`` keep both. Spark's session time zone
    is UTC so timestamps round-trip unchanged.
    """
    from pyspark.sql import SparkSession

    from headrace.storage.spark_conf import apply_hadoop_conf, storage_session_conf

    started = time.monotonic()
    user_conf = conf or {}
    conf = merged_conf(merged_conf(storage_session_conf(master, user_conf), target_conf or {}), user_conf)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local") or "127.0.0.1" in master or "localhost" in master:
        # Keep a local driver on loopback; a cluster driver binds where SPARK_LOCAL_IP says.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName(app_name).master(master)
    defaults = {
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",  # headrace logs its own progress
        "spark.sql.shuffle.partitions": "4",
        "spark.driver.memory": "2g",
        "spark.sql.adaptive.enabled": "true",
        "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
        "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # PostgreSQL stores dates and timestamps in the proleptic Gregorian calendar, as Spark 3 does;
        # the default rebase modes refuse (EXCEPTION) or shift (LEGACY) dates before 1582-10-15.
        # CORRECTED writes and reads the values as they are, which DuckDB and Iceberg readers expect.
        "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED",
        "spark.sql.parquet.datetimeRebaseModeInRead": "CORRECTED",
        "spark.sql.parquet.int96RebaseModeInWrite": "CORRECTED",
        "spark.sql.parquet.int96RebaseModeInRead": "CORRECTED",
        "spark.sql.avro.datetimeRebaseModeInWrite": "CORRECTED",
        "spark.sql.avro.datetimeRebaseModeInRead": "CORRECTED",
        # PostgreSQL column names are case-sensitive ("ID" and id are two columns); Spark's default
        # would resolve both to one and fail the table.
        "spark.sql.caseSensitive": "true",
        # Apply batches of several tables run as jobs from several driver threads (``apply.concurrency``),
        # each thread in its own pool (``use_pool``): FAIR shares the cores between them, so one big
        # table's MERGE does not queue every small table's job behind it as FIFO would.
        "spark.scheduler.mode": "FAIR",
    }
    settings = {**defaults, **conf}
    for key, value in settings.items():
        builder = builder.config(key, value)
    _ensure_gateway({**settings, "spark.master": master, "spark.app.name": app_name})
    session = builder.getOrCreate()
    # A session that was running already keeps its runtime conf: headrace's names need this one.
    session.conf.set("spark.sql.caseSensitive", "true")
    apply_hadoop_conf(session)  # the object store's settings, also on a session started before them
    _no_checksum_files(session)
    if not master.startswith("local"):
        session.sparkContext.addPyFile(_package_zip())
    session.sparkContext.setLogLevel("WARN")
    event(log, "spark.started", master=master, seconds=round(time.monotonic() - started, 2))
    return session


def _no_checksum_files(session: SparkSession) -> None:
    """The JVM's local filesystem writes no ``.crc`` file beside each file it writes.

    Without Hadoop's native library (not shipped with pyspark) the local filesystem sets every new
    file's permissions by running ``chmod`` in a child process, ~3.5 ms each, and the checksum file
    beside it is a second file and a second ``chmod``. An Iceberg commit into a local warehouse
    writes four to five files: 200 small tables copied into Iceberg started 3,602 processes (a JFR
    recording, 2026-11-28); without the checksum files 2,002. Only the driver's JVM (and a local
    master's tasks, in the same JVM) is changed: Hadoop caches one local filesystem per user, and
    this is it. Files are still verified against a ``.crc`` file where one exists.
    """
    context = session.sparkContext
    jvm: Any = context._jvm
    jvm.org.apache.hadoop.fs.FileSystem.getLocal(context._jsc.hadoopConfiguration()).setWriteChecksum(False)  # type: ignore[union-attr]


def _ensure_gateway(conf: Mapping[str, str]) -> None:
    """Start the JVM our way (``spark_gateway``: no fork hazard in a threaded process) unless it runs;
    ``getOrCreate`` then finds it instead of launching one with pyspark's ``preexec_fn``."""
    from pyspark import SparkContext

    from headrace.engines.spark.gateway import launch_gateway

    with SparkContext._lock:
        if SparkContext._gateway is None:
            SparkContext._ensure_initialized(gateway=launch_gateway(conf))


def use_pool(spark: SparkSession, pool: str) -> None:
    """Run this thread's Spark jobs in scheduler pool ``pool`` (FAIR mode shares the cores between
    pools). PySpark pins each Python thread to a JVM thread, so the setting is the thread's own."""
    spark.sparkContext.setLocalProperty("spark.scheduler.pool", pool)


def local_cores(master: str, conf: Mapping[str, str] | None = None) -> int | None:
    """The task slots a ``local`` master gives (``local`` 1, ``local[N]`` N, ``local[*]`` every core,
    ``local[N,F]`` N; ``spark.default.parallelism`` first when set): known before the session starts.
    None for any other master (a cluster's cores are known once its executors register)."""
    match = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?", master.strip())
    if match is None:
        return None
    if conf and conf.get("spark.default.parallelism", "").strip().isdigit():
        return max(1, int(conf["spark.default.parallelism"]))
    cores = match.group(1)
    if cores is None:
        return 1
    if cores == "*":
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, int(cores))
