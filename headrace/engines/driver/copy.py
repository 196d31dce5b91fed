"""A copy's chunks written by threads of this process: the driver engine's copy, no Spark job.

In local mode the driver's cores are Spark's: threads copy each group's chunks at once instead of
waiting for the JVM's start and first job, and the reader (ADBC) and the Parquet writer run in native
code without the GIL, so two threads use two cores as two Spark tasks do (``materialize.copy_lanes``
chooses). Each chunk's work is the one a Spark task does (``engines.chunks.copy_chunk_file``).
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

from headrace.core.filesink import FileSink
from headrace.core.position import Position
from headrace.core.schema import TableSchema
from headrace.engines.chunks import ChunkFile, copy_chunk_file
from headrace.source.base import ChunkRead


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

