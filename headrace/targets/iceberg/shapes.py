"""What an Iceberg table of headrace's looks like: its properties (``TABLE_PROPERTIES``), the Spark
schema of its rows and of a batch, and the session a JDBC catalog needs."""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from headrace.core.errors import ConfigError
from headrace.core.rows import HR_COMMIT_TS, HR_LSN, HR_OP, HR_SEQ, HR_UNCHANGED
from headrace.core.schema import TableSchema
from headrace.core.spark_types import spark_type
from headrace.targets.iceberg import write_mode
from headrace.targets.iceberg.session import JDBC_DRIVER_JAR

WRITE_MODE = "merge-on-read"

TABLE_PROPERTIES = {
    "format-version": "2",
    "write.delete.mode": WRITE_MODE,
    "write.update.mode": WRITE_MODE,
    "write.merge.mode": WRITE_MODE,
    write_mode.SET_BY_HEADRACE: WRITE_MODE,  # the mode is headrace's to follow the size (``write_mode``)
    # One position-delete file per batch (per write task), as Iceberg wrote them before 1.8. Its default
    # since, "file", writes one delete file per data file the batch touches and rewrites that data file's
    # earlier delete file into it (read, merged, written again): a small batch of random keys touches
    # every data file, so each batch wrote ~one delete file per data file in the table (19 at 25 data
    # files, 130 at 130) and its cost grew with every batch until compaction. Readers (DuckDB,
    # pyiceberg, Spark) apply either kind; compaction (``maintenance``) removes both.
    "write.delete.granularity": "partition",
    # Every commit writes a new metadata file and by default keeps the old ones: a table committed
    # each second (the freshness the defaults give) piled up one per commit, each listing every
    # snapshot. Iceberg (Java and pyiceberg) deletes the oldest after each commit beyond this many.
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "20",
}


def require_jdbc_driver(spark: SparkSession) -> None:
    """Refuse a session started without the PostgreSQL JDBC driver: Spark's jars and class path are
    fixed when its JVM starts, so the catalog would fail later with "No suitable driver"."""
    conf = spark.sparkContext.getConf()
    places = ("spark.jars", "spark.jars.packages", "spark.driver.extraClassPath")
    if not any("postgresql" in conf.get(key, "") for key in places):
        raise ConfigError(
            "target.iceberg.catalog type jdbc needs the PostgreSQL JDBC driver on Spark's class path, and this"
            " Spark session was started without it: install Debian's libpostgresql-jdbc-java"
            f" ({JDBC_DRIVER_JAR}; headrace adds it), or set spark.conf.spark.jars.packages to"
            " org.postgresql:postgresql:42.7.4 where Maven is reachable"
        )


def row_struct(table: TableSchema) -> StructType:
    """The Spark schema of the Iceberg table's rows: the source columns, then the positions."""
    fields = [StructField(c.name, spark_type(c.type)) for c in table.columns]
    fields += [StructField(HR_LSN, LongType()), StructField(HR_SEQ, LongType()),
               StructField(HR_COMMIT_TS, TimestampType())]
    return StructType(fields)


def batch_struct(table: TableSchema) -> StructType:
    """The Spark schema of a keyed table's batch: the row shape (``_shaped``), then op and unchanged."""
    return StructType([*row_struct(table).fields, StructField(HR_OP, StringType()),
                       StructField(HR_UNCHANGED, StringType())])
