"""Capture's staged files in the store: writing them, leftovers of a crash, and a store that cannot take files.

A flush writes its files before registering them; a crash or a full disk between the two leaves
files no one registered. Those are deleted before capture writes again, and their changes are read
from the slot again (it was never confirmed past them).
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from headrace.capture.buffer import TableBuffer
from headrace.core.backoff import Backoff
from headrace.log.facts import FileFacts
from headrace.log.index import LogIndex, StagedFile
from headrace.log.store import StagingStore
from headrace.logs import event
from headrace.outage_signs import storage_unavailable

log = logging.getLogger("headrace.capture")


def remove_orphans(staging: StagingStore, index: LogIndex) -> None:
    """Delete staged files written but never registered (a crash between write and register).

    Runs before capture writes anything, so every unregistered file is a leftover; its changes are
    read from the slot again.
    """
    removed = 0
    for location in staging.orphans(index.registered_paths()):
        removed += staging.delete(location)
    if removed:
        event(log, "capture.orphans_removed", files=removed)


def spill_folder(staging: StagingStore, pipeline: str) -> Path:
    """Where transactions streamed while in progress are spilled (``capture.spill``): beside the staged
    files (``_streamed``, which holds no Parquet) when staging is a local folder, else the machine's
    temporary folder (spill files are read back on this machine only)."""
    if staging.local:
        return Path(staging.root) / "_streamed"
    return Path(tempfile.gettempdir()) / f"headrace-{pipeline}-streamed"


def write_waiting(write: Callable[[list[StagedFile]], None], staging: StagingStore, backoff: Backoff,
                  stop: threading.Event, keep_alive: Callable[[], None],
                  report: Callable[[str | None], None]) -> list[StagedFile]:
    """``write`` (appending each file it finishes to the list given), again and again with backoff
    while the staging store cannot take files (full, over quota, read-only); the files written.

    The caller reads no WAL meanwhile (the server keeps it) and keeps what it buffered in memory;
    ``keep_alive`` is called between attempts (a status message, so the server does not time the
    replication connection out). The files of a failed attempt are deleted before the next one.
    ``report`` gets the reason when the wait starts and None when it ends: one log line each.
    """
    failures = 0
    try:
        while True:
            written: list[StagedFile] = []
            try:
                write(written)
                return written
            except OSError as exc:
                if not storage_unavailable(exc) or stop.is_set():
                    raise
                for f in written:  # a failed write removed its own temporary file already
                    with contextlib.suppress(OSError):
                        staging.delete(f.path)
                failures += 1
                if failures == 1:
                    reason = (f"staging directory {staging} cannot take files ({str(exc).strip()}): free"
                              " space or fix its permissions; capture waits (the slot keeps the WAL) and resumes"
                              " by itself")
                    report(reason)
                    event(log, "capture.staging_unavailable", logging.WARNING, error=reason)
                stop.wait(backoff.delay(failures))
                keep_alive()
    finally:
        if failures:
            report(None)
            event(log, "capture.staging_available", waited_attempts=failures)


def staged_file(staging: StagingStore, oid: int, tb: TableBuffer) -> StagedFile:
    """Write one table's buffer as a staged file (durably); the file as the log index registers it."""
    location, size = staging.write(oid, tb.buffer)
    return StagedFile(oid, location, len(tb.buffer), size, tb.buffer.min_lsn, tb.buffer.max_lsn, tb.schema,
                      tb.buffer.facts)


def write_files(staging: StagingStore, buffers: list[tuple[int, TableBuffer]], written: list[StagedFile],
                pool: ThreadPoolExecutor | None) -> None:
    """One staged file per buffer, appended to ``written`` as each is finished; side by side on
    ``pool`` when there are several.

    Side by side because Parquet encoding and fsync release the GIL, and the filesystem commits
    concurrent fsyncs together. Every write is waited for, so a failed one leaves the others' files
    in ``written`` (for the caller to delete) before its error is raised.
    """
    if len(buffers) == 1 or pool is None:
        written.extend(staged_file(staging, oid, tb) for oid, tb in buffers)
        return
    futures = [pool.submit(staged_file, staging, oid, tb) for oid, tb in buffers]
    failure: BaseException | None = None
    for future in futures:
        try:
            written.append(future.result())
        except BaseException as exc:  # noqa: BLE001 - raised below, after the others finished
            failure = failure or exc
    if failure is not None:
        raise failure


def count_changes(counts: dict[tuple[int, str], int], files: list[StagedFile]) -> None:
    """Add the files' rows to ``counts`` (per table and op: capture's ``changes_captured``)."""
    for f in files:
        facts = f.facts or FileFacts()
        for op, n in (("I", facts.inserts), ("U", facts.updates), ("D", facts.deletes), ("T", facts.truncates)):
            if n:
                counts[(f.table_oid, op)] = counts.get((f.table_oid, op), 0) + n
