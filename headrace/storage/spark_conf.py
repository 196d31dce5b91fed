"""What a Spark session needs to read and write ``s3://``: the S3A jars and the Hadoop settings.

The jars (``hadoop-aws`` and the ``aws-java-sdk-bundle`` it was built against) come from a folder:
``storage.s3a_jars``, ``HEADRACE_S3A_JARS``, or ``<virtualenv>/share/headrace/s3a`` where
``scripts/bootstrap.sh`` puts the two taken from PyPI's ``sagemaker-pyspark`` source archive (no
Maven needed). Users with Maven set ``spark.jars.packages`` to ``org.apache.hadoop:hadoop-aws``
matching their Hadoop (3.3.4 for pyspark 3.5) and the folder is not used.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from headrace import storage
from headrace.core.errors import ConfigError
from headrace.storage import access, current_config

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

JAR_PREFIXES = ("hadoop-aws-", "aws-java-sdk-bundle-")
CREDENTIAL_KEYS = {"fs.s3a.access.key", "fs.s3a.secret.key", "fs.s3a.session.token"}
DEFAULT_FOLDER = Path(sys.prefix) / "share" / "headrace" / "s3a"


def jars_folder() -> Path:
    """Where the S3A jars are looked for (module docstring)."""
    chosen = current_config().s3a_jars or os.environ.get("HEADRACE_S3A_JARS")
    return Path(chosen) if chosen else DEFAULT_FOLDER


def s3a_jars() -> list[str]:
    """The S3A jars found (both or none)."""
    folder = jars_folder()
    found = [next(iter(sorted(folder.glob(f"{p}*.jar"))), None) for p in JAR_PREFIXES] if folder.is_dir() else []
    return [str(j) for j in found] if found and all(found) else []


def _packages_bring_s3a(user_conf: Mapping[str, str]) -> bool:
    return "hadoop-aws" in user_conf.get("spark.jars.packages", "")


def require_s3a(user_conf: Mapping[str, str]) -> None:
    """A ConfigError with the fix when ``s3://`` is used and Spark would have no S3A filesystem."""
    if not _packages_bring_s3a(user_conf) and not s3a_jars():
        raise ConfigError(
            f"s3:// paths need Spark's S3A filesystem and no hadoop-aws jars are in {jars_folder()}: run"
            " scripts/bootstrap.sh (it takes them from PyPI), set storage.s3a_jars to a folder holding"
            " hadoop-aws and aws-java-sdk-bundle, or set spark.conf spark.jars.packages to"
            " org.apache.hadoop:hadoop-aws:3.3.4"
        )


def storage_session_conf(master: str, user_conf: Mapping[str, str], with_jars: bool | None = None) -> dict[str, str]:
    """Spark conf for the store: the S3A jars when found and the store is in use or ``with_jars`` (on
    the driver's class path; shipped with ``spark.jars`` to a cluster's executors), and the ``spark.hadoop.fs.s3a.*`` settings but the
    credentials: the JVM is started with its conf on the command line, where any user of the machine
    could read a secret; they are set on the running session instead (``apply_hadoop_conf``)."""
    conf = {f"spark.hadoop.{k}": v for k, v in access().hadoop_conf().items() if k not in CREDENTIAL_KEYS}
    # Only where the store is used (or asked for: a session shared by tests): the 192 MB SDK bundle
    # on the class path would be searched by every class lookup of every other session.
    wanted = storage.in_use() if with_jars is None else with_jars
    jars = [] if _packages_bring_s3a(user_conf) or not wanted else s3a_jars()
    if jars:
        conf["spark.driver.extraClassPath"] = os.pathsep.join(jars)
        if not master.startswith("local"):
            conf["spark.jars"] = ",".join(jars)
    return conf


def apply_hadoop_conf(spark: SparkSession) -> None:
    """Set the store's Hadoop settings on a running session (one started before the config was read:
    its ``spark.hadoop.*`` conf was fixed then), credentials included. S3A reads them when it opens a
    bucket; a cluster's tasks get them with the Hadoop conf Spark and Iceberg send along."""
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[union-attr]
    for key, value in access().hadoop_conf().items():
        hadoop.set(key, value)
