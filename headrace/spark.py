"""SparkSession factory: master URL, Iceberg runtime jars, and conf from the pipeline config.

Local mode (``local[*]``) is the default; any other master URL (``spark://``, ``yarn``,
``k8s://``) runs the same jobs on a cluster. The Iceberg runtime comes from the
``snowpark-connect-deps-iceberg`` wheel (works offline); users with Maven access may instead set
``spark.jars.packages`` in ``spark.conf`` and the wheel's jars are then left out. An Iceberg JDBC
catalog adds the PostgreSQL JDBC driver from Debian's ``libpostgresql-jdbc-java`` the same way.
"""

from __future__ import annotations

import os
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from headrace.core.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ICEBERG_JARS = (
    "iceberg-spark-runtime-3.5_2.12-1.9.2.jar",
    "iceberg-spark-extensions-3.5_2.12-1.9.2.jar",
)

# Debian's libpostgresql-jdbc-java (scripts/bootstrap.sh installs it) for Iceberg's JDBC catalog.
JDBC_DRIVER_JAR = "/usr/share/java/postgresql.jar"


def iceberg_jars() -> list[str]:
    """Paths of the Iceberg runtime jars shipped in the ``snowpark-connect-deps-iceberg`` wheel."""
    try:
        import snowpark_connect_deps_iceberg as deps
    except ImportError as exc:
        raise ConfigError(
            "the Iceberg runtime jars are missing: run `pip install snowpark-connect-deps-iceberg==1.0.1`, "
            "or set spark.conf.spark.jars.packages to org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:1.9.2"
        ) from exc
    folder = Path(deps.__file__).parent / "jars"
    jars = [folder / name for name in ICEBERG_JARS]
    missing = [str(j) for j in jars if not j.exists()]
    if missing:
        raise ConfigError(f"Iceberg jars not found: {missing}; reinstall snowpark-connect-deps-iceberg==1.0.1")
    return [str(j) for j in jars]


def jdbc_driver_jar() -> str:
    """The PostgreSQL JDBC driver jar Iceberg's JDBC catalog needs, or a ConfigError with the fix."""
    if not Path(JDBC_DRIVER_JAR).is_file():
        raise ConfigError(
            f"target.iceberg.catalog type jdbc needs the PostgreSQL JDBC driver, and {JDBC_DRIVER_JAR} is"
            " missing: run `apt-get install libpostgresql-jdbc-java`, or set spark.conf.spark.jars.packages"
            " to include org.postgresql:postgresql:42.7.4 where Maven is reachable"
        )
    return JDBC_DRIVER_JAR


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
    warehouse: str | None = None,
    jdbc_driver: bool = False,
) -> SparkSession:
    """Create (or return the running) SparkSession set up for headrace.

    ``warehouse`` registers the Iceberg Hadoop catalog ``headrace`` on that path. Spark's session
    time zone is UTC so timestamps round-trip unchanged. ``jdbc_driver`` puts the PostgreSQL JDBC
    driver on the class path (Iceberg's JDBC catalog) unless ``spark.jars.packages`` brings it.
    """
    from pyspark.sql import SparkSession

    conf = dict(conf or {})
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local") or "127.0.0.1" in master or "localhost" in master:
        # Keep a local driver on loopback; a cluster driver binds where SPARK_LOCAL_IP says.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName(app_name).master(master)
    defaults = {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",  # headrace logs its own progress
        "spark.sql.shuffle.partitions": "4",
        "spark.driver.memory": "2g",
        "spark.sql.adaptive.enabled": "true",
        "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
        "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
        "spark.sql.iceberg.handle-timestamp-without-timezone": "true",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # DuckLake registers Spark's Parquet files as they are; it stores microsecond timestamps.
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
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
    }
    jars = [] if "spark.jars.packages" in conf else iceberg_jars()
    if jdbc_driver and "org.postgresql:postgresql" not in conf.get("spark.jars.packages", ""):
        driver = jdbc_driver_jar()
        jars.append(driver)
        # java.sql.DriverManager only hands out drivers its caller's class loader sees: the driver
        # goes on the JVM's own class path too, not only in Spark's added-jars loader.
        existing_cp = conf.get("spark.driver.extraClassPath")
        conf["spark.driver.extraClassPath"] = os.pathsep.join([driver] + ([existing_cp] if existing_cp else []))
    if jars:
        existing = conf.get("spark.jars")
        defaults["spark.jars"] = ",".join(jars + ([existing] if existing else []))
    if warehouse:
        defaults["spark.sql.catalog.headrace"] = "org.apache.iceberg.spark.SparkCatalog"
        defaults["spark.sql.catalog.headrace.type"] = "hadoop"
        defaults["spark.sql.catalog.headrace.warehouse"] = warehouse
    for key, value in {**defaults, **conf}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    # A session that was running already keeps its runtime conf: headrace's names need this one.
    session.conf.set("spark.sql.caseSensitive", "true")
    if not master.startswith("local"):
        session.sparkContext.addPyFile(_package_zip())
    session.sparkContext.setLogLevel("WARN")
    return session
