"""The initial copy as Spark jobs: one task per run of chunks, each read by the source's chunk reader.

The driver only plans chunks; rows never pass through it. ``chunk_dataframe``: the chunks as a
DataFrame in the row shape, cast by Spark with the same expressions as the change stream
(``engines.spark.casts``), so a value looks the same in the target whichever path wrote it; the
source says how each column comes (``source.base.ChunkRead``): typed (PostgreSQL's binary COPY into
Arrow) or as text. A source whose chunks each have their own snapshot (MySQL) adds a ``_pos``
column: each row's position, instead of the round's. ``copy_chunks_to_files``: the tasks write
Parquet themselves (``engines.chunks.copy_chunk_file``), no Spark rows. ``warm_copy_workers``: the
warm-up on a cluster, a tiny job, one task per core, importing what copy tasks import, so that the
Python workers Spark keeps (``spark.python.worker.reuse``) are ready for the first group.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Callable, Iterable, Iterator

import pyarrow as pa
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from headrace.core.filesink import FileSink, WrittenFile
from headrace.core.position import Position
from headrace.core.schema import HR_COMMIT_TS, HR_LSN, HR_SEQ, TableSchema
from headrace.core.spark_types import ValueRules
from headrace.engines.chunks import ChunkFile, copy_chunk_file, read_schema
from headrace.engines.spark.casts import cast_text, changed_value_counts
from headrace.source.base import POSITION_COLUMN, ChunkRead, Route

# (column, reason) -> values the casts changed (see ``changed_value_counts``)
ValueCounts = dict[tuple[str, str], int]


_observations = itertools.count()

def chunk_dataframe(
    spark: SparkSession,
    table: TableSchema,
    reader: ChunkRead,
    chunks: list[tuple[int, int]],
    position: Position,
    rules: ValueRules | None = None,
    on_changed: Callable[[Callable[[], ValueCounts]], None] | None = None,
    on_position: Callable[[Callable[[], int | None]], None] | None = None,
    tasks: int | None = None,
) -> DataFrame:
    """Rows of ``table`` in ``chunks`` as ``reader`` reads them, in the Target row shape, read by
    ``tasks`` Spark tasks (``chunk_tasks``).

    Lazy: the copy runs when the DataFrame is written (a snapshot the reader imports must stay
    valid until then). Every row carries ``position`` (seq 0), or its chunk's own position when the
    reader gives one per row, and a NULL commit time. ``on_changed`` receives a function giving the
    values the casts changed (``values.infinity: clamp``), to be called only after an action on the
    DataFrame completed: counted by the same scan (a Spark ``Observation``). ``on_position`` likewise
    receives a function giving the smallest per-row position read (None: no rows, or none per row).
    """
    if not chunks:
        raise ValueError(f"no chunks to copy for {table.qualified_name}; plan_chunks gives at least one")
    routes = reader.routes
    schema = read_schema(table, routes)
    if reader.per_row_position:
        schema = StructType([*schema.fields, StructField(POSITION_COLUMN, LongType(), False)])
    read = reader.read
    plan = list(chunks)

    def copy_partition(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for index in chunk_indexes(batches):
            yield from read(*plan[index])

    text = chunk_tasks(spark, len(plan), tasks).mapInArrow(copy_partition, schema)
    # The text each column's casts see: a SPLIT column's text holds only the values outside the
    # binary range (infinities, BC, beyond 9999), the only ones the range rules change.
    texts = {i: F.col(f"t{i}" if route is Route.SPLIT else f"c{i}")
             for i, route in enumerate(routes) if route is not Route.BINARY}
    if on_changed is not None:
        text = _observe_changed_values(text, table, texts, rules or ValueRules(), on_changed)
    if on_position is not None and reader.per_row_position:
        seen = Observation(f"copy_position_{table.oid}_{next(_observations)}")
        text = text.observe(seen, F.min(F.col(POSITION_COLUMN)).alias("_minpos"))
        on_position(lambda: seen.get.get("_minpos"))
    columns = []
    for i, (col, route) in enumerate(zip(table.columns, routes, strict=True)):
        if route is Route.BINARY:
            value = F.col(f"c{i}")
        elif route is Route.SPLIT:
            value = F.coalesce(F.col(f"c{i}"), cast_text(texts[i], col.type, rules, col.name))
        else:
            value = cast_text(texts[i], col.type, rules, col.name)
        columns.append(value.alias(col.name))
    lsn = F.col(POSITION_COLUMN) if reader.per_row_position else F.lit(position.lsn).cast("bigint")
    return text.select(
        *columns,
        lsn.alias(HR_LSN),
        F.lit(0).cast("bigint").alias(HR_SEQ),
        F.lit(None).cast("timestamp").alias(HR_COMMIT_TS),
    )


def chunk_tasks(spark: SparkSession, count: int, tasks: int | None) -> DataFrame:
    """The indexes ``0..count-1`` of a job's chunks spread over ``tasks`` Spark tasks (None: one task
    a chunk), for a ``mapInArrow`` that copies each index it gets (``chunk_indexes``).

    ``spark.range`` gives each partition a contiguous run of indexes. Fewer tasks than chunks bound
    the source connections a job holds at once to ``tasks`` however many cores run it (a task reads
    its chunks one after another), and keep those cores evenly busy.
    """
    return spark.range(0, count, 1, numPartitions=max(1, min(count, tasks or count)))


def chunk_indexes(batches: Iterable[pa.RecordBatch]) -> Iterator[int]:
    """On an executor: the chunk indexes of a ``chunk_tasks`` partition."""
    for batch in batches:
        yield from batch.column(0).to_pylist()


def _observe_changed_values(text: DataFrame, table: TableSchema, texts: dict[int, Column], rules: ValueRules,
                            on_changed: Callable[[Callable[[], ValueCounts]], None]) -> DataFrame:
    """``text`` counting the values the casts will change (of columns with ``texts``), via ``on_changed``."""
    counts = changed_value_counts(
        [(col.name, col.type, texts[i]) for i, col in enumerate(table.columns) if i in texts], rules)
    if not counts:
        return text
    # A name per DataFrame: an observation whose write failed stays registered under its name.
    observation = Observation(f"values_changed_{table.oid}_{next(_observations)}")
    text = text.observe(observation, *[total.alias(f"_vc{i}") for i, (_, _, total) in enumerate(counts)])

    def read() -> ValueCounts:
        got = observation.get  # blocks until the first action on the DataFrame finished
        found = {(name, reason): int(got.get(f"_vc{i}") or 0) for i, (name, reason, _) in enumerate(counts)}
        return {k: n for k, n in found.items() if n}

    on_changed(read)
    return text


# What a file-writing copy task reports for each chunk: no rows, only where they went.
FILE_RESULT = StructType([StructField("chunk", LongType(), False), StructField("path", StringType(), True),
                          StructField("bytes", LongType(), False), StructField("rows", LongType(), False),
                          StructField("footer", BinaryType(), True)])


# What copy tasks import beyond pyspark's worker (unpickling the task's function imports the rest).
COPY_TASK_MODULES = ("pyarrow.parquet", "pyarrow.compute", "psycopg2", "headrace._copy_binary",
                     "adbc_driver_manager", "adbc_driver_postgresql.dbapi",
                     "headrace.core.filesink", "headrace.engines.chunks",
                     "headrace.source.postgres.binary_copy")


WARM_RESULT = StructType([StructField("pid", LongType(), False)])


def copy_chunks_to_files(spark: SparkSession, table: TableSchema, reader: ChunkRead,
                         chunks: list[tuple[int, int]], position: Position, sink: FileSink,
                         tasks: int | None = None) -> list[ChunkFile]:
    """Copy ``chunks`` in one Spark job whose ``tasks`` write Parquet into ``sink`` themselves.

    Tasks as in ``chunk_dataframe`` (``chunk_tasks``), but no Spark rows: a task copies each of its
    chunks (``copy_chunk_file``), sending the driver only each file's path, size and row count.
    """
    from pyspark.sql.pandas.types import to_arrow_schema

    plan, lsn = list(chunks), position.lsn
    result_schema = to_arrow_schema(FILE_RESULT)
    attempt = uuid.uuid4().hex  # file names unique per job, so a retried task never meets an old file

    def write_partition(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for index in chunk_indexes(batches):
            done = copy_chunk_file(table, reader, plan[index], lsn, sink, f"{attempt}-{index:05d}", index)
            file = done.file
            yield pa.RecordBatch.from_pydict(
                {"chunk": [index], "path": [file.path if file else None], "bytes": [file.bytes if file else 0],
                 "rows": [-1 if done.needs_spark else file.rows if file else 0],
                 "footer": [file.footer if file else None]}, schema=result_schema)

    results = chunk_tasks(spark, len(plan), tasks).mapInArrow(write_partition, FILE_RESULT).collect()
    out = []
    for r in sorted(results, key=lambda r: r["chunk"]):
        written = (WrittenFile(r["path"], r["bytes"], r["rows"], None if r["footer"] is None else bytes(r["footer"]))
                   if r["path"] is not None else None)
        out.append(ChunkFile(r["chunk"], written, needs_spark=r["rows"] < 0))
    return out


def warm_copy_workers(spark: SparkSession) -> None:
    """Run a job of one task per core that imports what copy tasks import (Spark keeps the Python
    workers it started for the next jobs' tasks)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    cores = max(1, spark.sparkContext.defaultParallelism)
    schema = to_arrow_schema(WARM_RESULT)
    modules = COPY_TASK_MODULES

    def warm(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import contextlib
        import importlib

        for name in modules:
            with contextlib.suppress(ImportError):  # a source without this driver: its tasks do not import it
                importlib.import_module(name)
        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict({"pid": [os.getpid()]}, schema=schema)

    spark.range(0, cores, 1, numPartitions=cores).mapInArrow(warm, WARM_RESULT).collect()
