"""A copy's chunks written as Parquet files and registered group by group, possibly before the table exists.

A fresh copy's tasks (or the driver's threads, ``copy_lanes.CopyLanes``) write each group's chunks
into the target's ``FileSink``; the driver registers a group's files in one commit and then marks
its chunks done (``FileCopy``). The next group's job runs while a group commits.

Ahead of the table (issue 21): an Iceberg table is created through Spark SQL, and its sink (field
ids, data folder) comes from the created table, so a copy that asked for it first waited for the JVM
(the first file 4.35 s after launch on 20M rows, against DuckLake's 0.41 s). A target that can tell
its sink ahead (``TargetPlugin.copy_sink_ahead``) lets the copy's job thread write its first groups
into that sink while the JVM starts and the table is created; the first commit waits for the table
and checks the sink it really has (``Target.copy_sink``). The same folder and field ids: the files
are registered as they are. Anything else (a table of another history, a namespace or table with a
location of its own): the files written so far are deleted, and the copy starts over into the real
sink, or through Spark when the table as it is takes no files (``FileCopyEnd.TO_SPARK``). Nothing is
committed or marked done before that check, so a crash meanwhile leaves orphan files only.

Groups that finished while the commit loop was busy (those copied while the JVM started, above: 7-9
of a 20M-row copy's 12; or any, when commits are slower than jobs) are registered together, in one
commit of at most ``GROUPS_PER_COMMIT`` groups: each commit rewrites the table's metadata, 0.2 s on
local disk and 0.4-2.6 s on an object store (moto, 2026-11-28), so the copy no longer ends with a
queue of commits the jobs had long finished for.

On a cluster the session is warmed for the copy's tasks only once the table exists, and only if
groups are left to copy: a warm-up started at once ran 11 s beside the CREATE. In local mode the
driver's threads copy every group (``copy_lanes.CopyLanes``). The quiet 20M runs are
docs/benchmarks-history.md's.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from enum import Enum
from typing import TYPE_CHECKING, Any

from headrace.core.faults import crash_point
from headrace.core.filesink import FileSink, WrittenFile
from headrace.core.position import Position
from headrace.core.schema import TableSchema
from headrace.core.spark_types import value_rules
from headrace.engines.chunks import ChunkFile
from headrace.engines.spark.copy import ValueCounts, chunk_dataframe
from headrace.logs import event
from headrace.materialize.copy_bars import BARS
from headrace.materialize.copy_lanes import CopyLanes
from headrace.materialize.permits import Permits
from headrace.source.base import ChunkRead
from headrace.state.progress import Chunk, ProgressStore

if TYPE_CHECKING:
    from headrace.materialize.initial_copy import InitialCopy

log = logging.getLogger("headrace.snapshot")

# Chunks a copy task writes one after another in a group's job: a group holds this many per task. Two
# make a group ~64 MB of heap a core (default chunk_pages), so few commits, and little redone after a crash.
CHUNKS_PER_TASK = 2
# Finished groups one commit may take (module docstring): at most ~1 GB of source a crash makes copy again.
GROUPS_PER_COMMIT = 8


class FileCopyEnd(Enum):
    """How a file copy ended without copying every chunk."""

    STOPPED = "stopped"  # asked to stop: progress is kept, the next run resumes
    TO_SPARK = "to_spark"  # the table as it is takes no files: every chunk goes through Spark


@dataclass(frozen=True)
class _Refused:
    """The sink written ahead is not the table's (its files are deleted); ``real``: the table's own."""

    real: FileSink | None


class FileCopy:
    """One table's chunks ``todo`` copied as files, for the copy ``copy`` (module docstring)."""

    def __init__(self, copy: InitialCopy, progress: ProgressStore, oid: int, schema: TableSchema,
                 reader: ChunkRead, position: Position, permits: Permits) -> None:
        self.copy = copy
        self.progress = progress
        self.oid = oid
        self.schema = schema
        self.reader = reader
        self.position = position
        self.permits = permits

    def run(self, sink: FileSink, ahead: bool, todo: list[Chunk], report: tuple[int, int, int, float]
            ) -> int | FileCopyEnd:
        """Copy ``todo`` into ``sink`` (told ahead of the table: ``ahead``); the rows copied.

        ``report``: the chunks done before, the chunks in all, the rows done before, the copy's start.
        """
        copied = self._groups(sink, ahead, todo, report)
        if not isinstance(copied, _Refused):
            return copied
        if copied.real is None:
            return FileCopyEnd.TO_SPARK
        redone = self._groups(copied.real, False, todo, report)
        assert not isinstance(redone, _Refused)
        return redone

    def _groups(self, sink: FileSink, ahead: bool, todo: list[Chunk], report: tuple[int, int, int, float]
                ) -> int | FileCopyEnd | _Refused:
        """Copy ``todo`` with tasks that write Parquet into ``sink``, a group of chunks a Spark job, each
        group registered in one commit and then marked done.

        The next group's job runs while a group commits (one job at a time, so the source connections
        stay those of one job's tasks), and a job has one task per core it may use (at most the
        permits, each task copying its share of the group): the cores never wait for a commit, nor for
        one task left over. Measured on 20M rows: docs/benchmarks-history.md, "Initial copy". Chunks whose
        values need Spark's casts are appended through ``write_snapshot`` after their group's files.
        """
        copy, name = self.copy, self.schema.qualified_name
        lanes = CopyLanes(copy.spark, copy.config.spark.master, copy.config.spark.conf, copy.warmth,
                          self.permits.total, warm_now=not ahead, engine=copy.config.engine)
        tasks = lanes.tasks
        size = tasks * CHUNKS_PER_TASK
        groups = [todo[i:i + size] for i in range(0, len(todo), size)]
        ended = threading.Event()  # the commits stopped: jobs not yet started do not start

        def job(i: int, group: list[Chunk]) -> list[ChunkFile] | None:
            if copy.stop.is_set() or ended.is_set():
                return None
            with self.permits.take(min(tasks, len(group))):  # the job's tasks (or threads) read the chunks
                copy.watch.progressed(self.oid)
                return lanes.copy(i, self.schema, self.reader, [(c.start_page, c.end_page) for c in group],
                                  self.position, sink)

        done_before, total, rows_before, started = report
        copied = table_rows = 0
        futures: list[Future[list[ChunkFile] | None]] = []
        registered = sink  # the folder's name as the table spells it
        confirmed, refused = not ahead, None
        try:
            with ThreadPoolExecutor(1, thread_name_prefix="copy-job") as jobs:
                futures = [jobs.submit(job, i, group) for i, group in enumerate(groups)]
                try:
                    if ahead:  # the jobs copy meanwhile
                        real = self._table_ready(sink, started, futures)
                        if not all(f.done() for f in futures):
                            lanes.warm()  # a cluster's tasks for the groups left (not before: it slowed the CREATE)
                        if real is None or not same_place(sink, real):
                            refused = _Refused(real)
                            return refused  # the job under way ends; those after it do not start
                        registered, confirmed = real, True
                    i = 0
                    while i < len(groups):
                        waited = time.monotonic()
                        results = futures[i].result()
                        committing = time.monotonic()
                        if results is None:
                            event(log, "snapshot.paused", table=name, chunks_done=done_before + i * size)
                            return FileCopyEnd.STOPPED
                        taken = [(i, results), *finished_after(futures, i)]
                        written = [moved(r.file, registered) for _, done in taken for r in done if r.file]
                        after = copy.target.register_copy_files(self.schema, registered, written, replace=i == 0)
                        rest = [groups[g][r.chunk] for g, done in taken for r in done if r.needs_spark]
                        if rest:
                            after = self._copy_with_spark(rest, tasks)
                        rows, table_rows = after - table_rows, after
                        crash_point("snapshot.after_chunk")
                        copy.watch.progressed(self.oid)
                        chunks = [chunk for g, _ in taken for chunk in groups[g]]
                        self.progress.mark_done(self.oid, chunks, self.position.lsn, rows)
                        copied += rows
                        commit_s = round(time.monotonic() - committing, 2)
                        for g, _ in taken:  # where each group's time went: who copied it, its job, the wait, the commit
                            report_progress(name, done_before + g * size + len(groups[g]), total,
                                            rows_before + copied, started, **lanes.timing(g),
                                            waited_s=round(committing - waited, 2) if g == i else 0.0,
                                            commit_s=commit_s, groups_in_commit=len(taken))
                        i += len(taken)
                finally:
                    ended.set()
        finally:
            if not confirmed:  # the table is not there, or not as told: no file of this copy is kept
                deleted = discard(sink, futures)
                if refused is not None:
                    event(log, "snapshot.sink_mismatch", logging.WARNING, table=name, told=sink.location,
                          table_folder=refused.real.location if refused.real else None,
                          same_ids=refused.real is not None and refused.real.field_ids == sink.field_ids,
                          files_deleted=deleted,
                          then="copied again into the table's folder" if refused.real else "copied through Spark")
        return copied

    def _table_ready(self, sink: FileSink, started: float, futures: list[Future[list[ChunkFile] | None]]
                     ) -> FileSink | None:
        """Open the target, create the table and get its sink (``Target.copy_sink``: None when it takes
        no files), while the job thread copies into ``sink``."""
        target = self.copy.target  # the first use on this path: waits for the target (Iceberg: the JVM)
        target.ensure_table(self.schema)
        real = target.copy_sink(self.schema, True)
        event(log, "snapshot.table_ready", table=self.schema.qualified_name,
              seconds=round(time.monotonic() - started, 2), groups_copied=sum(f.done() for f in futures),
              sink_as_told=real is not None and same_place(sink, real))
        return real

    def _copy_with_spark(self, rest: list[Chunk], tasks: int) -> int:
        """Append chunks whose values only Spark's casts decide; the rows the table then holds."""
        copy, name = self.copy, self.schema.qualified_name
        event(log, "snapshot.spark_chunks", table=name, chunks=len(rest),
              reason="values only Spark's casts decide (infinities, BC or far-future dates, NaN numeric)")
        counted: list[Callable[[], ValueCounts]] = []
        with self.permits.take(min(tasks, len(rest))):
            df = chunk_dataframe(copy.spark, self.schema, self.reader, [(c.start_page, c.end_page) for c in rest],
                                 self.position, value_rules(name, copy.target, copy.config.values.infinity),
                                 counted.append, tasks=tasks)
            after = copy.target.write_snapshot(self.schema, df, self.position, replace=False)
        copy.values_changed(name, counted)
        return after


def finished_after(futures: list[Future[list[ChunkFile] | None]], i: int) -> list[tuple[int, list[ChunkFile]]]:
    """The groups after group ``i`` whose jobs have finished, in order up to the first that has not,
    at most ``GROUPS_PER_COMMIT - 1``: they join group ``i``'s commit (module docstring)."""
    taken: list[tuple[int, list[ChunkFile]]] = []
    for g in range(i + 1, min(len(futures), i + GROUPS_PER_COMMIT)):
        future = futures[g]
        if not future.done() or future.cancelled() or future.exception() is not None:
            break
        results = future.result()
        if results is None:
            break
        taken.append((g, results))
    return taken


def same_place(told: FileSink, real: FileSink) -> bool:
    """Files written into ``told`` are the table's as they are: the same folder, the same field ids
    (the codec may differ: any codec is valid Parquet)."""
    return told.fs_path == real.fs_path and told.field_ids == real.field_ids


def moved(file: WrittenFile, sink: FileSink) -> WrittenFile:
    """``file`` named from ``sink``'s location (the same folder spelled as the table spells it:
    ``file:/w/t/data`` for ``/w/t/data``)."""
    name = file.path.rsplit("/", 1)[-1]
    return replace(file, path=f"{sink.location.rstrip('/')}/{name}")


def discard(sink: FileSink, futures: list[Future[list[ChunkFile] | None]]) -> int:
    """Delete the files the finished jobs of ``futures`` wrote into ``sink``; how many."""
    deleted = 0
    for future in futures:
        if not future.done() or future.cancelled() or future.exception() is not None:
            continue
        for done in future.result() or []:
            if done.file is not None:
                with contextlib.suppress(OSError):  # cleaning up must not hide why the copy stopped
                    sink.filesystem.delete_file(f"{sink.fs_path}/{done.file.path.rsplit('/', 1)[-1]}")
                    deleted += 1
    return deleted


def report_progress(name: str, done: int, total: int, rows: int, started: float, **group: Any) -> None:
    """The ``snapshot.progress`` event (and the table's bar on a terminal, ``copy_bars``): ``done`` of ``total`` chunks."""
    secs = time.monotonic() - started
    event(log, "snapshot.progress", table=name, chunks_done=done, chunks_total=total, rows=rows,
          rows_per_s=int(rows / secs) if secs else 0, **group)
    BARS.show(name, done, total, rows)
