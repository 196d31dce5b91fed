"""Initial copies written as Parquet by pyarrow and committed through Iceberg's Java API (py4j).

Spark's writer turns every Arrow batch into JVM rows first; a copy's chunks arrive as Arrow already
(``engines.chunks.chunk_rows``), so the copy's tasks (or the driver, for a small table) write them
with ``pyarrow.parquet`` into the table's data folder (``copy_sink``: Iceberg field ids on every
column, the table's codec, decimals as integers as the spec says), and the driver commits the files
with Iceberg's own API (``register``): each file's metrics read from its footer (``footer_metrics``),
then one overwrite (replace) or append, with no Spark job. The table object is the Spark catalog's
cached instance (``catalog.java_table``), so Spark SQL sees the commit at once.

A small table copied fresh (``create_with_rows``) is created with its one file in a single catalog
transaction instead: no ``CREATE TABLE`` through Spark SQL, no second commit. Measured on 200 tables
of 1,000 rows (bench/initial_copy.py --small-tables 200; 2 cores shared with other work), start until
every table is STREAMING, small tables already read through shared sessions (``permits``): 46.9 s with
the two commits (load average 10.0; per-table copy median 0.91 s), 33.7 s with one (load 8.4; 0.63 s).

A crash between a file's write and the commit leaves an orphan file in the data folder, which no
snapshot references: ``maintenance``'s ``remove_orphan_files`` deletes it.

``copy_sink_ahead`` is the sink a table's CREATE will give, told from the settings alone: a fresh copy
writes its first groups into it while the JVM starts and the table is created (~3.8 s of a 20M-row
copy's 27 s, issue 21), and checks it against ``copy_sink`` before its first commit
(``materialize.file_copy``).
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

from headrace.core.filesink import CODECS, FileSink, WrittenFile, open_folder
from headrace.core.names import path_segment
from headrace.core.rows import POSITION_COLUMNS
from headrace.core.spark_types import spark_type
from headrace.targets.iceberg.catalog import JavaCatalog, JavaFiles, java_files, java_table

if TYPE_CHECKING:
    import pyarrow as pa
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
    if settings.catalog.type == "rest":
        return None  # the server chooses the table's location
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
    ids = field_ids(spark, iceberg)
    if list(ids) != [*table.column_names, *POSITION_COLUMNS]:
        return None
    return table_sink(iceberg, ids)


def field_ids(spark: SparkSession, iceberg: Any) -> dict[str, int]:
    """Top-level column name -> field id of the py4j ``Table`` ``iceberg``, in order: read from its
    schema's JSON in one py4j call (walking the Java list took a call per field and an exception at
    its end, ~20% of a small table's copy under 8 threads)."""
    jvm: Any = spark.sparkContext._jvm
    schema = json.loads(str(jvm.org.apache.iceberg.SchemaParser.toJson(iceberg.schema())))
    return {str(f["name"]): int(f["id"]) for f in schema["fields"]}


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


def create_with_rows(java: JavaCatalog, namespace: str, name: str, struct_json: str, properties: dict[str, str],
                     rows: pa.Table, field_ids: dict[str, int]) -> int | None:
    """Create table ``namespace.name`` (Spark schema ``struct_json``, ``properties``) holding ``rows``,
    in one commit through the catalog's Java API; the rows it holds, or None when the table exists
    already (nothing done: the caller writes into it as usual).

    For a small table's copy: ``CREATE TABLE`` through Spark SQL, then a second commit for the rows,
    took ~3x the JVM work and py4j calls of this one transaction (issue 21, 200 tables of 1,000 rows).
    The table is what ``CREATE TABLE`` makes: Spark's schema converted by ``SparkSchemaUtil`` (the
    same fresh field ids, ``field_ids``, which the rows are written with), no partitioning. It is
    created in the catalog Spark's catalog wraps, and Spark SQL loads it from there on first use.
    """
    from py4j.protocol import Py4JJavaError

    schema = java.schema_util.convert(java.data_type.fromJson(struct_json))
    try:
        txn = java.iceberg.buildTable(java.identifier(namespace, name), schema).withProperties(
            java.java_map(properties)).createTransaction()
        table = txn.table()
        # The new table's fresh ids (1..N in order; nested fields after): those the rows are written with.
        sink = table_sink(table, field_ids) if table.schema().highestFieldId() == len(field_ids) else None
        if sink is None:
            return None  # the transaction is never committed: no table, the usual path makes it
        if rows.num_rows:
            append = txn.newAppend()
            metrics = java.files.metrics_config.forTable(table)
            append.appendFile(data_file(java.files, table, metrics,
                                        sink.write(rows, uuid.uuid4().hex)))
            append.commit()
        txn.commitTransaction()
    except Py4JJavaError as exc:
        if "AlreadyExistsException" in str(exc.java_exception.getClass().getName()):
            return None
        raise
    return rows.num_rows


def data_file(java: JavaFiles, iceberg: Any, metrics: Any, file: WrittenFile) -> Any:
    """The ``DataFile`` of a Parquet file written into ``iceberg``'s data folder, with its metrics
    (``metrics``: the table's ``MetricsConfig``) from its footer.

    The footer the writer kept (``WrittenFile.footer``) is parsed in the JVM from its bytes, and the
    size is the one written: the file is not read back. On the object store that read was a HEAD
    for the size and a HEAD and two ranged GETs for the footer, in series, for every file of every
    commit. Without a kept footer (a writer that did not keep it) the footer is read from the file
    (``footer_metrics``).
    """
    builder = java.data_files.builder(iceberg.spec()).withFormat("parquet")
    if file.footer is not None:
        parsed = java.metadata_converter.readParquetMetadata(java.bytes_in(file.footer), java.no_filter)
        found = java.parquet_util.footerMetrics(parsed, java.streams.empty(), metrics)
        return builder.withPath(file.path).withFileSizeInBytes(file.bytes).withMetrics(found).build()
    io = iceberg.io()
    data = io.newInputFile(file.path)
    return builder.withInputFile(data).withMetrics(footer_metrics(java, io, data, metrics)).build()


def footer_metrics(java: JavaFiles, io: Any, data: Any, metrics: Any) -> Any:
    """Iceberg's ``Metrics`` of the Parquet file ``data`` (an ``InputFile`` of the table's ``io``).

    ``ParquetUtil.fileMetrics`` opens the file with Parquet's default read options, and those make
    a new Hadoop ``Configuration``, which parses Hadoop's default XML files again at every call: a
    third of the JVM's CPU in a copy of 200 small tables (a JFR profile, 2026-11-28), in every
    commit of a driver batch too. With the ``HadoopFileIO`` headrace configures, the footer is read
    with the IO's own ``Configuration`` (Parquet's ``readFooter``) and measured by the same
    ``ParquetUtil.footerMetrics`` that ``fileMetrics`` calls: the same metrics, 4-5 ms less a file.
    Any other ``FileIO`` (a REST catalog may name its own) keeps ``fileMetrics``.
    """
    from py4j.protocol import Py4JError

    try:
        conf = io.conf()  # HadoopFileIO's; no such method on other FileIOs
    except Py4JError:
        return java.parquet_util.fileMetrics(data, metrics)
    footer = java.footers.readFooter(conf, java.path(data.location()))
    return java.parquet_util.footerMetrics(footer, java.streams.empty(), metrics)


def register(spark: SparkSession, name: str, written: list[WrittenFile], replace: bool) -> int:
    """Commit ``written`` to table ``name`` in one snapshot: instead of every row (``replace``) or
    added to them; return the rows the table then holds (from the snapshot summary, no scan)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    iceberg = java_table(spark, name)
    api = jvm.org.apache.iceberg
    java = java_files(jvm)
    metrics = java.metrics_config.forTable(iceberg)
    if replace:
        update = iceberg.newOverwrite().overwriteByRowFilter(api.expressions.Expressions.alwaysTrue())
    else:
        update = iceberg.newAppend()
    for file in written:
        built = data_file(java, iceberg, metrics, file)
        if replace:
            update.addFile(built)
        else:
            update.appendFile(built)
    update.commit()
    snapshot = iceberg.currentSnapshot()
    return 0 if snapshot is None else int(snapshot.summary().getOrDefault("total-records", "0"))
