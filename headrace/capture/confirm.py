"""When capture confirms the slot: only what is registered in the staged log, bounded in state first.

The replication connection is confirmed from capture's own thread (``_ack``, ``_keep_alive``,
``_confirm``); the flusher's thread registers files with their position (``_register``) and
publishes it as ``captured_lsn``. psycopg2 may forward a confirmation on its own (the stream's
``forwardable``), so the most a confirmation may carry is recorded in state before anything can
send it (``_bound``): start-up tells those advances from someone else's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from headrace.capture.backpressure import Backpressure
from headrace.capture.staging import count_changes
from headrace.core.faults import crash_point
from headrace.log.index import LogIndex, StagedFile
from headrace.logs import event
from headrace.source.base import ChangeStream, Source

log = logging.getLogger("headrace.capture")

# How long a stop waits for the source to take its last confirmation (``_settle``).
SETTLE_SECONDS = 3.0


class SlotConfirmation:
    """Capture's positions and their confirmation (``capture.loop.Capture`` is one)."""

    source: Source
    captured_lsn: int  # end LSN of the last transaction registered in the log
    changes_captured: dict[tuple[int, str], int]
    backpressure: Backpressure
    on_staged: Callable[[], None]
    _source: Any
    _source_lock: threading.Lock
    _stop: threading.Event
    _halt: threading.Event
    _acked: int  # the position last confirmed to the stream
    _bounded: int  # the most a confirmation may carry, as recorded in state (acked_lsn)
    _forwarded: int  # a closed stream's ``forwardable``: recorded before its slot is checked again
    _streamed: bool  # the current connection attempt registered a flush

    def _closed(self, stream: ChangeStream) -> None:
        stream.close()
        self._forwarded = max(self._forwarded, stream.forwardable)

    def _bound(self, index: LogIndex, reach: int) -> None:
        """Record in state that the slot may be confirmed up to ``reach`` (before anything can send
        it): start-up and reconnection refuse a slot beyond the recorded bound as moved by someone else."""
        index.register([], self.captured_lsn, reach)
        self._bounded = max(self._bounded, reach)

    def _ack(self, stream: ChangeStream) -> None:
        """Confirm the slot up to what the flusher registered, if it moved (capture's thread only)."""
        registered = self.captured_lsn
        if registered > self._acked:
            stream.acknowledge(registered)
            self._acked = registered

    def _settle(self, index: LogIndex, source: Any, stream: ChangeStream) -> None:
        """Stopping, after the last ``_ack``: wait (at most ``SETTLE_SECONDS``) until the source holds
        it, reading and dropping what the server still sends (past what is registered: a restart
        reads it again). A sender still writing to a closed connection can end on the broken pipe
        before it reads the confirmation, leaving the slot behind: its WAL kept, and sent again."""
        deadline = time.monotonic() + SETTLE_SECONDS
        while True:
            with self._source_lock:
                confirmed = self.source.confirmed_position(source)
            if confirmed is None or confirmed >= self._acked:
                return
            if time.monotonic() >= deadline:
                event(log, "capture.unconfirmed", logging.WARNING, acked=self.source.format_position(self._acked),
                      confirmed=self.source.format_position(confirmed))
                return
            stream.read(max_messages=10_000, timeout=0.05)
            if stream.forwardable > self._bounded:
                self._bound(index, stream.forwardable)
            stream.acknowledge(self._acked)

    def _keep_alive(self, stream: ChangeStream) -> None:
        """While capture waits for the flusher: a status message (registered position), so the server
        does not time the replication connection out."""
        stream.acknowledge(self.captured_lsn)
        self._acked = max(self._acked, self.captured_lsn)
        if self._stop.is_set():
            # Stopping while the flusher waits for staging space: it gives up (as capture itself
            # did before the flush had a thread), so stopping never waits for a full disk.
            self._halt.set()

    def _confirm(self, index: LogIndex, stream: ChangeStream) -> None:
        """Confirm the captured position again (while paused); the confirmation may carry
        psycopg2's forwarded position, so bound it in state first."""
        assert self._source is not None
        with self._source_lock:
            bound = self.source.flushed_position(self._source)
        index.register([], self.captured_lsn, bound)
        stream.acknowledge(self.captured_lsn)

    def _register(self, index: LogIndex, files: list[StagedFile], end_lsn: int, token: str | None = None) -> None:
        """The flusher's thread: register ``files`` and the position ``end_lsn`` (with the source's
        ``token`` for it) in one transaction, then publish the position (``captured_lsn``) for
        capture's thread to confirm."""
        if files:
            crash_point("capture.after_write")
        # Anything psycopg2 forwards the confirmation to comes from a keepalive read before it is
        # sent, so at most the server's flushed WAL now. The source connection is capture's too.
        with self._source_lock:
            bound = self.source.flushed_position(self._source) if self._source is not None else end_lsn
        index.register(files, end_lsn, bound, token)  # durable and registered: now the slot may move
        self._bounded = max(self._bounded, bound)
        if files:
            crash_point("capture.after_register")
            count_changes(self.changes_captured, files)
            self.on_staged()  # the run loop applies them now, not at its next timed pass
        self.captured_lsn = max(self.captured_lsn, end_lsn)
        self._streamed = True  # this attempt got somewhere: the next failure starts the backoff over
        self.backpressure.staged(sum(f.rows for f in files), sum(f.bytes for f in files))
        if files:
            event(log, "capture.flush", files=len(files), rows=sum(f.rows for f in files),
                  captured_lsn=self.source.format_position(end_lsn))
