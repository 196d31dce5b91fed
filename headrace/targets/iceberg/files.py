"""Initial copies written as Parquet by pyarrow and committed through Iceberg's Java API (py4j).

Spark's writer turns every Arrow batch into JVM rows first; a copy's chunks arrive as Arrow already
(``snapshot_job.chunk_rows``), so the copy's tasks (or the driver, for a small table) write them
with ``pyarrow.parquet`` into the table's data folder (``copy_sink``: Iceberg field ids on every
column, the table's codec, decimals as integers as the spec says), and the driver commits the files
with Iceberg's own API (``register``): each file's metrics read from its footer by ``ParquetUtil``,
then one overwrite (replace) or append, with no Spark job. The table object is the Spark catalog's
cached instance (``catalog.java_table``), so Spark SQL sees the commit at once.

A crash between a file's write and the commit leaves an orphan file in the data folder, which no
snapshot references: ``maintenance``'s ``remove_orphan_files`` deletes it.

``copy_sink_ahead`` is the sink a table's CREATE will give, told from the settings alone: a fresh copy
writes its first groups into it while the JVM starts and the table is created (~3.8 s of a 20M-row
copy's 27 s, issue 21), and checks it against ``copy_sink`` before its first commit
(``materialize.file_copy``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from headrace.core.filesink import CODECS, FileSink, WrittenFile, open_folder
from headrace.core.names import path_segment
from headrace.core.rows import POSITION_COLUMNS
from headrace.core.spark_types import spark_type
from headrace.targets.iceberg.catalog import java_table

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from headrace.core.schema import TableSchema
    from headrace.targets.iceberg.config import IcebergConfig

CODEC_PROPERTY = "write.parquet.compression-codec"
DEFAULT_CODEC = "zstd"  # what Iceberg (1.4 on) writes into a new table's properties, and reads when absent


def copy_sink_ahead(settings: IcebergConfig, table: TableSchema) -> FileSink | None:
    """The sink ``copy_sink`` will give once ``CREATE TABLE`` (``IcebergTarget.ensure_table``) has made
    ``table``, told without Spark; None where it cannot be told (a nested column type) or reached.

    - field ids: Iceberg gives a new table's top-level fields fresh ids 1..N in order (the source
      columns, then ``_hr_lsn``, ``_hr_seq``, ``_hr_commit_ts``), nested fields after them;
    - folder: both catalogs put a table without LOCATION at ``<warehouse>/<namespace>/<table>``
      (``HadoopCatalog``/``JdbcCatalog.defaultWarehouseLocation``, the JDBC one unless the namespace
      has a location of its own), names mapped by ``path_segment`` as ``IcebergTarget.table_name``
      maps them; the default location provider writes data files into its ``data`` folder.

    A table that exists already, a namespace with a location, ``write.data.path`` or an object-store
    layout give another sink: the copy checks this one against ``copy_sink``'s before its first commit.
    """
    from pyspark.sql.types import ArrayType, MapType, StructType

    if any(isinstance(spark_type(c.type), (ArrayType, MapType, StructType)) for c in table.columns):
        return None
    names = [*table.column_names, *POSITION_COLUMNS]
    namespace = path_segment(settings.namespace or table.target_schema)
    location = f"{settings.warehouse.rstrip('/')}/{namespace}/{path_segment(table.target_table)}/data"
    opened = open_folder(location)
    if opened is None:
        return None
    return FileSink(location, *opened, field_ids={n: i for i, n in enumerate(names, start=1)},
                    compression=CODECS[DEFAULT_CODEC])


def copy_sink(spark: SparkSession, name: str, table: TableSchema) -> FileSink | None:
    """A sink into table ``name``'s data folder, or None: columns other than the row shape's (a
    table kept from an earlier shape), or a location ``pyarrow.fs`` cannot reach (``s3a://``...)."""
    iceberg = java_table(spark, name)
    ids = {str(f.name()): int(f.fieldId()) for f in iceberg.schema().columns()}
    if list(ids) != [*table.column_names, *POSITION_COLUMNS]:
        return None
    return table_sink(iceberg, ids)


def table_sink(iceberg: Any, field_ids: dict[str, int]) -> FileSink | None:
    """A sink into the data folder the py4j ``Table`` ``iceberg``'s own writers use (its location
    provider: ``write.data.path``, or ``<table>/data``), in its codec, with ``field_ids``; None for a
    location ``pyarrow.fs`` cannot reach (``s3a://``...)."""
    location = str(iceberg.locationProvider().newDataLocation("probe.parquet")).rsplit("/", 1)[0]
    opened = open_folder(location)
    if opened is None:
        return None
    codec = str(iceberg.properties().getOrDefault(CODEC_PROPERTY, DEFAULT_CODEC)).lower()
    return FileSink(location, *opened, field_ids=field_ids, compression=CODECS.get(codec, DEFAULT_CODEC))


def register(spark: SparkSession, name: str, written: list[WrittenFile], replace: bool) -> int:
    """Commit ``written`` to table ``name`` in one snapshot: instead of every row (``replace``) or
    added to them; return the rows the table then holds (from the snapshot summary, no scan)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    iceberg = java_table(spark, name)
    api = jvm.org.apache.iceberg
    metrics_config = api.MetricsConfig.forTable(iceberg)
    if replace:
        update = iceberg.newOverwrite().overwriteByRowFilter(api.expressions.Expressions.alwaysTrue())
    else:
        update = iceberg.newAppend()
    for file in written:
        data = iceberg.io().newInputFile(file.path)
        built = (api.DataFiles.builder(iceberg.spec()).withInputFile(data).withFormat("parquet")
                 .withMetrics(api.parquet.ParquetUtil.fileMetrics(data, metrics_config)).build())
        if replace:
            update.addFile(built)
        else:
            update.appendFile(built)
    update.commit()
    snapshot = iceberg.currentSnapshot()
    return 0 if snapshot is None else int(snapshot.summary().getOrDefault("total-records", "0"))
