"""What a Spark session needs for Iceberg: the runtime jars, its SQL extensions, and for a JDBC
catalog the PostgreSQL JDBC driver.

The Iceberg runtime comes from the ``snowpark-connect-deps-iceberg`` wheel (works offline); users
with Maven access may instead set ``spark.jars.packages`` in ``spark.conf`` and the wheel's jars are
then left out. A JDBC catalog adds the PostgreSQL JDBC driver from Debian's
``libpostgresql-jdbc-java`` the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from headrace.core.errors import ConfigError

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


def iceberg_session_conf(user_conf: Mapping[str, str] | None = None, jdbc_driver: bool = False) -> dict[str, str]:
    """Spark conf for Iceberg tables: the runtime jars (unless ``spark.jars.packages`` brings them),
    the SQL extensions (MERGE, procedures), and with ``jdbc_driver`` the PostgreSQL JDBC driver."""
    user_conf = user_conf or {}
    packages = user_conf.get("spark.jars.packages", "")
    conf = {
        "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        "spark.sql.iceberg.handle-timestamp-without-timezone": "true",
    }
    jars = [] if packages else iceberg_jars()
    if jdbc_driver and "org.postgresql:postgresql" not in packages:
        driver = jdbc_driver_jar()
        jars.append(driver)
        # java.sql.DriverManager only hands out drivers its caller's class loader sees: the driver
        # goes on the JVM's own class path too, not only in Spark's added-jars loader.
        conf["spark.driver.extraClassPath"] = driver
    if jars:
        conf["spark.jars"] = ",".join(jars)
    return conf


def hadoop_catalog_conf(warehouse: str, name: str = "headrace") -> dict[str, str]:
    """Spark conf registering a Hadoop catalog ``name`` on ``warehouse`` (to read a warehouse in PySpark)."""
    return {
        f"spark.sql.catalog.{name}": "org.apache.iceberg.spark.SparkCatalog",
        f"spark.sql.catalog.{name}.type": "hadoop",
        f"spark.sql.catalog.{name}.warehouse": warehouse,
    }
