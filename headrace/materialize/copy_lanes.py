"""Who copies each group of a file-writing copy: the driver's threads or Spark's jobs (the lane from
``materialize.lanes.copy_lane``), with how many tasks, and how long each group took."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Protocol

from pyspark.sql import SparkSession

from headrace.core.filesink import FileSink
from headrace.core.lanes import Engine, Lane
from headrace.core.position import Position
from headrace.core.schema import TableSchema
from headrace.engines.chunks import ChunkFile
from headrace.engines.driver.copy import copy_chunks_on_driver
from headrace.engines.spark.copy import copy_chunks_to_files
from headrace.engines.spark.session import local_cores
from headrace.materialize.lanes import copy_lane
from headrace.source.base import ChunkRead


class SparkWarmth(Protocol):
    """The run's Spark session, which a cluster's copy has warmed (``engines.spark.on_demand.SparkOnDemand``)."""

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
