"""Capture's staged files in the store: leftovers of a crash, and a staging store that cannot take files.

A flush writes its files before registering them; a crash or a full disk between the two leaves
files no one registered. Those are deleted before capture writes again, and their changes are read
from the slot again (it was never confirmed past them).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable

from headrace.core.backoff import Backoff
from headrace.log.index import LogIndex, StagedFile
from headrace.log.store import StagingStore
from headrace.logs import event
from headrace.outage import storage_unavailable

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
