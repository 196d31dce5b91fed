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
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from headrace.core.filesink import CODECS, FileSink, WrittenFile, open_folder
from headrace.core.rows import HR_COMMIT_TS, HR_LSN, HR_SEQ
from headrace.targets.iceberg.catalog import java_table

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from headrace.core.schema import TableSchema

CODEC_PROPERTY = "write.parquet.compression-codec"


def copy_sink(spark: SparkSession, name: str, table: TableSchema) -> FileSink | None:
    """A sink into table ``name``'s data folder, or None: columns other than the row shape's (a
    table kept from an earlier shape), or a location ``pyarrow.fs`` cannot reach (``s3a://``...)."""
    iceberg = java_table(spark, name)
    ids = {str(f.name()): int(f.fieldId()) for f in iceberg.schema().columns()}
    if list(ids) != [*table.column_names, HR_LSN, HR_SEQ, HR_COMMIT_TS]:
        return None
    # The folder the table's own writers use (its location provider: write.data.path, or <table>/data).
    location = str(iceberg.locationProvider().newDataLocation("probe.parquet")).rsplit("/", 1)[0]
    opened = open_folder(location)
    if opened is None:
        return None
    codec = str(iceberg.properties().getOrDefault(CODEC_PROPERTY, "zstd")).lower()
    return FileSink(location, *opened, field_ids=ids, compression=CODECS.get(codec, "zstd"))


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
