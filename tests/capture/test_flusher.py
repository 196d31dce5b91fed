"""Capture's flush thread: flushes are registered in the order handed over, spills with the flush
after them, and after a failed flush nothing later is registered (a gap in the log would lose
changes); the failure reaches capture's thread.

The flusher is driven with plain functions standing for "write files" and "register" (the real
ones, with PostgreSQL and staged files, run in the e2e crash and pipeline tests)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from headrace.capture.buffer import TableBuffer
from headrace.capture.flusher import Flusher, FlushJob
from headrace.capture.staging import write_files
from headrace.core.schema import Column, ColumnType, TableSchema, TypeKind
from headrace.log.index import StagedFile
from headrace.log.store import StagingStore

SCHEMA = TableSchema(1, "public", "t", (Column("id", ColumnType(TypeKind.INT, "integer"), 23),), ("id",))


def _job(first_lsn: int, rows: int, end_lsn: int | None) -> FlushJob:
    tb = TableBuffer(SCHEMA)
    for i in range(rows):
        tb.buffer.append("I", first_lsn + i, 1, 0, 1, f'{{"id":"{i}"}}')
    return FlushJob([(SCHEMA.oid, tb)], end_lsn)


def _files(buffers: list[tuple[int, TableBuffer]]) -> list[StagedFile]:
    return [StagedFile(oid, f"f{tb.buffer.min_lsn}", len(tb.buffer), 1, tb.buffer.min_lsn, tb.buffer.max_lsn,
                       tb.schema) for oid, tb in buffers]


def test_flushes_are_registered_in_order_with_their_spills() -> None:
    registered: list[tuple[list[str], int]] = []
    flusher = Flusher(_files, lambda files, end, _token: registered.append(([f.path for f in files], end)), depth=2)
    try:
        for job in (_job(100, 3, 110), _job(200, 2, None), _job(300, 1, 310), FlushJob([], 410)):
            flusher.submit(job, keep_alive=lambda: None)
        flusher.drain(keep_alive=lambda: None)
    finally:
        flusher.close()
    # The spill (no end position) is registered with the flush after it; an empty flush still
    # registers its position (an idle acknowledgement).
    assert registered == [(["f100"], 110), (["f200", "f300"], 310), ([], 410)]
    assert flusher.idle


def test_after_a_failed_flush_nothing_later_is_registered() -> None:
    registered: list[int] = []
    release = threading.Event()

    def write(buffers: list[tuple[int, TableBuffer]]) -> list[StagedFile]:
        release.wait(10)  # the later jobs are queued before this one fails
        if buffers[0][1].buffer.min_lsn == 200:
            raise OSError(28, "No space left on device")
        return _files(buffers)

    flusher = Flusher(write, lambda files, end, _token: registered.append(end), depth=3)
    try:
        for job in (_job(100, 1, 110), _job(200, 1, 210), _job(300, 1, 310)):
            flusher.submit(job, keep_alive=lambda: None)
        release.set()
        with pytest.raises(OSError, match="No space left"):
            flusher.drain(keep_alive=lambda: None)
        with pytest.raises(OSError):  # capture's next hand-over fails too: the attempt is over
            flusher.submit(_job(400, 1, 410), keep_alive=lambda: None)
    finally:
        flusher.close()
    assert registered == [110]


def test_a_full_queue_makes_capture_wait_and_keep_the_connection_alive() -> None:
    release = threading.Event()
    kept_alive = threading.Event()

    def write(buffers: list[tuple[int, TableBuffer]]) -> list[StagedFile]:
        release.wait(10)
        return _files(buffers)

    def keep_alive() -> None:  # called while capture waits: lets the writer go on
        kept_alive.set()
        release.set()

    registered: list[int] = []
    flusher = Flusher(write, lambda files, end, _token: registered.append(end), depth=1)
    try:
        flusher.submit(_job(100, 1, 110), keep_alive)  # taken by the thread at once
        flusher.submit(_job(200, 1, 210), keep_alive)  # waits in the queue
        flusher.submit(_job(300, 1, 310), keep_alive)  # waits for room, keeping the connection alive
        flusher.drain(keep_alive)
    finally:
        flusher.close()
    assert kept_alive.is_set()
    assert registered == [110, 210, 310]


def test_files_written_side_by_side_are_all_kept_when_one_fails(tmp_path: Path) -> None:
    staging = StagingStore.open(tmp_path / "staging")
    good = [(1, _job(100, 3, None).buffers[0][1]), (2, _job(200, 2, None).buffers[0][1])]
    with ThreadPoolExecutor(max_workers=4) as pool:
        written: list[StagedFile] = []
        write_files(staging, good, written, pool)
        assert sorted(f.rows for f in written) == [2, 3]
        assert all(staging.exists(f.path) for f in written)
        # A write that fails (an empty buffer has no LSN range) is raised once the others are done,
        # and their files are in ``written`` for the caller to delete.
        written = []
        with pytest.raises(ValueError):
            write_files(staging, [*good, (3, TableBuffer(SCHEMA))], written, pool)
        assert len(written) == 2
