"""Backpressure: capture stops reading WAL while too many staged changes wait to be applied.

The bound is ``staging.max_pending_rows`` / ``max_pending_bytes`` over the tables that apply
changes (``LogIndex.pending_totals``); while over it, the slot keeps the WAL on the source and
capture only confirms its position now and then, so the server does not time the connection out.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from headrace.config import StagingConfig
from headrace.log.index import LogIndex
from headrace.logs import event

log = logging.getLogger("headrace.capture")

PAUSED_STATUS_S = 1.0  # while paused, confirm this often (keeps the walsender alive)


class Backpressure:
    """The bound on staged-but-unapplied changes, and the wait while capture is over it."""

    def __init__(self, policy: StagingConfig) -> None:
        self.policy = policy
        self.paused = False  # not reading WAL until the backlog shrinks
        self.pending_rows = 0  # the backlog when last looked at
        self.pending_bytes = 0
        self._checked_at = float("-inf")
        self._staged_rows = self._staged_bytes = 0  # registered since the backlog was last looked at

    def staged(self, rows: int, nbytes: int) -> None:
        """Note a registered flush (a large one makes the next look come sooner)."""
        self._staged_rows += rows
        self._staged_bytes += nbytes

    def over_bound(self, index: LogIndex) -> bool:
        """Staged-but-unapplied changes exceed the bound (looked at at most twice a second)."""
        policy = self.policy
        if policy.max_pending_rows is None and policy.max_pending_bytes is None:
            return False
        now = time.monotonic()
        # At most twice a second, unless a quarter of the bound was staged since the last look:
        # a fast reader would otherwise stage many times the bound between two looks.
        quick = ((policy.max_pending_rows is not None and 4 * self._staged_rows >= policy.max_pending_rows)
                 or (policy.max_pending_bytes is not None and 4 * self._staged_bytes >= policy.max_pending_bytes))
        if now - self._checked_at < 0.5 and not quick:
            return False
        self._checked_at = now
        self._staged_rows = self._staged_bytes = 0
        return self._exceeded(index)

    def wait(self, index: LogIndex, stop: threading.Event, confirm: Callable[[], None]) -> None:
        """Return once the backlog is back under the bound (or ``stop`` is set), calling ``confirm``
        every ``PAUSED_STATUS_S`` meanwhile (wal_sender_timeout)."""
        self.paused = True
        event(log, "capture.paused", pending_rows=self.pending_rows, pending_bytes=self.pending_bytes)
        last_status = time.monotonic()
        try:
            while not stop.wait(0.5) and self._exceeded(index):
                if time.monotonic() - last_status >= PAUSED_STATUS_S:
                    confirm()
                    last_status = time.monotonic()
        finally:
            self.paused = False
        event(log, "capture.resumed", pending_rows=self.pending_rows, pending_bytes=self.pending_bytes)

    def _exceeded(self, index: LogIndex) -> bool:
        policy = self.policy
        rows, nbytes = index.pending_totals()
        self.pending_rows, self.pending_bytes = rows, nbytes
        return ((policy.max_pending_rows is not None and rows > policy.max_pending_rows)
                or (policy.max_pending_bytes is not None and nbytes > policy.max_pending_bytes))
