"""A copy's chunks written as Parquet by pyarrow straight from the reader's Arrow, no Spark rows.

A chunk is read, put in the row shape (``snapshot_job.chunk_rows``) batch by batch and written into
the target's ``FileSink``, one file a chunk; the driver then registers a group's files in one commit
(``materialize.initial_copy``). The same per-chunk work runs in two places:

- ``copy_chunks_to_files``: a Spark job, one task per core, each task copying its run of chunks (on
  a cluster, where the executors are the copy's cores);
- ``copy_chunks_on_driver``: threads of the driver (local mode, where the driver's cores are Spark's):
  the copy starts at once instead of waiting for the JVM's start and first job and the Python
  workers' start and imports, and each group is copied faster than by a Spark job on the same cores
  (``CopyLanes``). The reader (ADBC) and the Parquet writer run in native code without the GIL, so
  two threads use two cores as two Spark tasks do.

``CopyLanes`` chooses between them. ``warm_copy_workers`` is the warm-up on a cluster: a tiny job,
one task per core, importing what copy tasks import, so that the Python workers Spark keeps
(``spark.python.worker.reuse``) are ready for the first group.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from headrace.core.filesink import FileSink, WrittenFile
from headrace.core.lanes import Engine, Lane, NotOnLane
from headrace.core.position import Position
from headrace.core.schema import TableSchema
from headrace.materialize.lanes import copy_lane
from headrace.materialize.snapshot_job import chunk_indexes, chunk_rows, chunk_tasks
from headrace.source.base import ChunkRead
from headrace.spark import local_cores

# What a file-writing copy task reports for each chunk: no rows, only where they went.
FILE_RESULT = StructType([StructField("chunk", LongType(), False), StructField("path", StringType(), True),
                          StructField("bytes", LongType(), False), StructField("rows", LongType(), False)])
# What copy tasks import beyond pyspark's worker (unpickling the task's function imports the rest).
COPY_TASK_MODULES = ("pyarrow.parquet", "pyarrow.compute", "adbc_driver_manager", "adbc_driver_postgresql.dbapi",
                     "headrace.core.filesink", "headrace.materialize.chunk_files",
                     "headrace.source.postgres.binary_copy")
WARM_RESULT = StructType([StructField("pid", LongType(), False)])


@dataclass(frozen=True)
class ChunkFile:
    """What a copy task did with chunk ``chunk`` (an index into the job's ranges): wrote ``file``
    (None: an empty chunk), or left it to Spark's casts (``needs_spark``)."""

    chunk: int
    file: WrittenFile | None
    needs_spark: bool = False


def copy_chunk_file(table: TableSchema, reader: ChunkRead, chunk: tuple[int, int], lsn: int, sink: FileSink,
                    stem: str, index: int) -> ChunkFile:
    """Copy one chunk into ``<stem>.parquet`` of ``sink`` (wherever this runs: a Spark task, a driver
    thread); a chunk holding a value ``chunk_rows`` refuses writes nothing and comes back ``needs_spark``."""

    def parts() -> Iterator[pa.Table]:
        for batch in reader.read(*chunk):  # batch by batch: the file is written as the chunk comes
            rows = chunk_rows(table, reader.routes, [batch], lsn)
            if rows is None:
                raise NotOnLane("a value only Spark's casts decide")
            yield rows

    try:
        written = sink.write_parts(parts(), stem, empty=False)
    except NotOnLane:
        return ChunkFile(index, None, needs_spark=True)  # the partial file is gone
    return ChunkFile(index, written)


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
                 "rows": [-1 if done.needs_spark else file.rows if file else 0]}, schema=result_schema)

    results = chunk_tasks(spark, len(plan), tasks).mapInArrow(write_partition, FILE_RESULT).collect()
    out = []
    for r in sorted(results, key=lambda r: r["chunk"]):
        written = WrittenFile(r["path"], r["bytes"], r["rows"]) if r["path"] is not None else None
        out.append(ChunkFile(r["chunk"], written, needs_spark=r["rows"] < 0))
    return out


def copy_chunks_on_driver(table: TableSchema, reader: ChunkRead, chunks: list[tuple[int, int]],
                          position: Position, sink: FileSink, threads: int) -> list[ChunkFile]:
    """``copy_chunks_to_files`` without Spark: ``threads`` threads of this process, each copying a
    contiguous run of ``chunks`` one after another (as a task does), so at most ``threads`` source
    connections at once."""
    plan, attempt = list(chunks), uuid.uuid4().hex
    count = max(1, min(len(plan), threads))
    runs = [range(len(plan) * i // count, len(plan) * (i + 1) // count) for i in range(count)]

    def copy_run(run: range) -> list[ChunkFile]:
        return [copy_chunk_file(table, reader, plan[i], position.lsn, sink, f"{attempt}-{i:05d}", i) for i in run]

    with ThreadPoolExecutor(count, thread_name_prefix="copy-driver") as pool:
        return [done for run in pool.map(copy_run, runs) for done in run]


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
        import os

        for name in modules:
            with contextlib.suppress(ImportError):  # a source without this driver: its tasks do not import it
                importlib.import_module(name)
        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict({"pid": [os.getpid()]}, schema=schema)

    spark.range(0, cores, 1, numPartitions=cores).mapInArrow(warm, WARM_RESULT).collect()


class SparkWarmth(Protocol):
    """The run's Spark session, which a cluster's copy has warmed (``run.spark_on_demand.SparkOnDemand``)."""

    def warm_in_background(self) -> None:
        """Start the session if need be and warm it, on a thread of its own."""


class CopyLanes:
    """Who copies each group of a file-writing copy, and with how many tasks: in local mode the
    driver's threads, every group; on a cluster Spark's jobs, on the executors.

    In local mode the driver's cores are Spark's, known before the session runs: the driver copies on
    them from the first group, and no Spark job runs for the copy (so none is warmed up). Measured on
    20M rows into Iceberg, 2 cores (docs/benchmarks-history.md, "Initial copy"): a group of 1.18M rows took
    1.3 s on the driver's two threads against 1.6 s as a warm job of two tasks (the Python workers
    take the rows through the JVM's pipes), and warming the workers beside the copy took 12 s of the
    cores: end to end 29.5 s and 50 CPU-seconds against 34.5-37 s and 61 before, when the driver
    copied only until the session was warm. On a cluster the warm-up starts here (``warm_now``), or
    once the copy's table exists (``warm``): an Iceberg table's CREATE then does not wait behind it.
    """

    def __init__(self, spark: SparkSession, master: str, conf: Mapping[str, str], warmth: SparkWarmth | None,
                 permits: int, warm_now: bool = True, engine: Engine = "auto") -> None:
        cores = local_cores(master, conf)
        self._spark = spark
        self._warmth = warmth
        self.lane = copy_lane(engine, master, conf)
        self._on_driver = self.lane.lane is Lane.DRIVER
        if warm_now:
            self.warm()
        if cores is None:
            # The session's own figure, where it runs (engine: driver on a cluster: the driver's cores).
            cores = spark.sparkContext.defaultParallelism if not self._on_driver else (os.cpu_count() or 1)
        self.tasks = max(1, min(permits, cores))
        self._seconds: dict[int, float] = {}

    def warm(self) -> None:
        """On a cluster, have the executors' Python workers warmed in the background (once)."""
        if self._warmth is not None and not self._on_driver:
            self._warmth.warm_in_background()

    def copy(self, group: int, table: TableSchema, reader: ChunkRead, chunks: list[tuple[int, int]],
             position: Position, sink: FileSink) -> list[ChunkFile]:
        """Copy group number ``group``'s ``chunks`` into ``sink``, in this copy's lane."""
        began = time.monotonic()
        if self._on_driver:
            files = copy_chunks_on_driver(table, reader, chunks, position, sink, self.tasks)
        else:
            files = copy_chunks_to_files(self._spark, table, reader, chunks, position, sink, self.tasks)
        self._seconds[group] = time.monotonic() - began
        return files

    def timing(self, group: int) -> dict[str, object]:
        """Who copied the group and how long its job took, for its progress event."""
        return {"lane": self.lane.lane.value, "lane_reason": self.lane.reason,
                "job_s": round(self._seconds.get(group, 0.0), 2)}
