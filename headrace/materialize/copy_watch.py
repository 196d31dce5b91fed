"""A copy round's watch: a copy never holds the source for long, whatever goes wrong in it.

From a thread of its own, once a second while a round runs, it looks at the source for two things:

- **A statement waiting for a copy's lock** (a DDL, most often; the application's writes on that
  table queue behind it): reported at once (log, and ``waiters`` for status, /readyz, the page and
  the metrics), and after ``snapshot.give_way_after_seconds`` the copy gives way: its reads are
  ended, the statement goes through, and the table's copy fails with ``CopyGaveWay``, retried as a
  transient failure, resuming from its last finished chunk group.
- **A table's copy that makes no progress** (no chunk read or chunk group written) for
  ``snapshot.stall_seconds``: logged with the stacks of the copy's threads, its reads on the source
  ended, and failed with ``CopyStalled``. A Python thread cannot be stopped from outside: the stuck
  thread is abandoned (whatever it does next is refused by ``progressed``) and its table is retried
  once the thread has returned (``stuck``), or at the next start of the process.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field

from headrace.config import SnapshotConfig
from headrace.core.errors import TransientError
from headrace.logs import event
from headrace.source.base import LockWaiter, Source

log = logging.getLogger("headrace.snapshot")

# How often the source is looked at while a round runs: a DDL statement waits about this long before
# it is reported, or for give_way_after_seconds plus this at most before the copy gives way.
CHECK_SECONDS = 1.0


class CopyStalled(TransientError):
    """A table's copy made no progress for ``snapshot.stall_seconds``."""


class CopyGaveWay(TransientError):
    """A table's copy ended its reads so a statement waiting for their lock could run."""


class CopyAbandoned(Exception):
    """Raised in a copy's thread that the watch gave up on: it must stop without touching anything."""


@dataclass
class _Copying:
    name: str
    thread: threading.Thread
    last: float = field(default_factory=time.monotonic)
    abandoned: bool = False


class CopyWatch:
    """Watches the tables a round copies (see the module docstring). ``on_stalled(oid, error)`` fails a
    table whose copy stalled; ``stuck`` (shared across rounds) holds the threads given up on, by oid."""

    def __init__(self, source: Source, settings: SnapshotConfig, on_stalled: Callable[[int, Exception], None],
                 stuck: dict[int, threading.Thread], every: float = CHECK_SECONDS) -> None:
        self.source = source
        self.settings = settings
        self.on_stalled = on_stalled
        self.stuck = stuck
        self.every = every
        self._lock = threading.Lock()
        self._copying: dict[int, _Copying] = {}
        self._gave_way: dict[int, LockWaiter] = {}
        self._reported: set[tuple[int, str]] = set()  # (pid, table) of waiters logged, given way to
        self._given: set[tuple[int, str]] = set()
        self._waiters: list[LockWaiter] = []
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    # -- called by the copy's threads ------------------------------------------------------------
    def began(self, oid: int, name: str) -> None:
        """The calling thread starts copying table ``oid``."""
        with self._lock:
            self._copying[oid] = _Copying(name, threading.current_thread())
            self._gave_way.pop(oid, None)

    def progressed(self, oid: int) -> None:
        """The copy of ``oid`` moved on (permits granted, a chunk read, a group written), in any of its
        threads; raises ``CopyAbandoned`` once the watch gave up on it, before it writes anything more."""
        with self._lock:
            copying = self._copying.get(oid)
            if copying is not None:
                copying.last = time.monotonic()
            elif oid in self.stuck:
                raise CopyAbandoned(f"copy of table oid {oid} was given up on")

    def ended(self, oid: int) -> None:
        """The calling thread is done with table ``oid`` (copied, failed or stopped)."""
        with self._lock:
            copying = self._copying.get(oid)
            if copying is not None and copying.thread is threading.current_thread():
                del self._copying[oid]
            if self.stuck.get(oid) is threading.current_thread():
                del self.stuck[oid]  # it returned: the table can be copied again

    def given_up(self, thread: threading.Thread) -> bool:
        """The watch gave up on ``thread`` (a copy of it stalled): nobody waits for it."""
        with self._lock:
            return any(t is thread for t in self.stuck.values())

    def explain(self, oid: int, exc: Exception) -> Exception:
        """A copy's failure as the user should read it: ``CopyGaveWay`` when its reads were ended for a
        waiting statement (the read's own error then says only "canceling statement")."""
        with self._lock:
            waiter = self._gave_way.pop(oid, None)
        if waiter is None:
            return exc
        gave = CopyGaveWay(
            f"the copy of {waiter.table} gave way to a statement that waited {waiter.waiting_seconds:.1f} s for its"
            f" lock (pid {waiter.pid}: {waiter.statement}); it resumes from its last finished chunk group"
            " (snapshot.give_way_after_seconds)")
        gave.__cause__ = exc
        return gave

    # -- what the control plane reads --------------------------------------------------------------
    @property
    def waiters(self) -> list[LockWaiter]:
        """Statements waiting for a copy's lock at the last look."""
        return list(self._waiters)

    # -- the watch's thread ------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="copy-watch", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(10)
        self._waiters = []

    def _run(self) -> None:
        with ExitStack() as opened:
            conn = None
            while not self._done.wait(self.every):
                try:
                    if conn is None:
                        conn = opened.enter_context(self.source.connect())
                    self.check(conn)
                except Exception as exc:  # the source away, most likely: the round itself says so
                    event(log, "snapshot.watch_failed", logging.WARNING,
                          error=str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__)
                    opened.close()
                    conn = None

    def check(self, conn: object) -> None:
        """One look: report and give way to waiting statements, fail stalled copies."""
        waiters = self.source.copy_lock_waiters(conn)
        self._waiters = waiters
        give_way = self.settings.give_way_after_seconds
        for waiter in waiters:
            if (waiter.pid, waiter.table) not in self._reported:
                self._reported.add((waiter.pid, waiter.table))
                event(log, "snapshot.blocks_statement", logging.WARNING, table=waiter.table, waiting_pid=waiter.pid,
                      statement=waiter.statement, blocked_by=",".join(map(str, waiter.blockers)),
                      give_way_after_seconds=give_way)
            if give_way is not None and waiter.waiting_seconds >= give_way:
                ended = self.source.end_copy_reads(conn, waiter.blockers)
                if waiter.oid is not None:
                    with self._lock:
                        self._gave_way[waiter.oid] = waiter
                if (waiter.pid, waiter.table) not in self._given:
                    self._given.add((waiter.pid, waiter.table))
                    event(log, "snapshot.gave_way", logging.WARNING, table=waiter.table, waiting_pid=waiter.pid,
                          waited_seconds=round(waiter.waiting_seconds, 1), reads_ended=ended)
        now = time.monotonic()
        with self._lock:
            stalled = [(oid, c) for oid, c in self._copying.items() if now - c.last > self.settings.stall_seconds]
            for oid, copying in stalled:
                del self._copying[oid]
                self.stuck[oid] = copying.thread
        for oid, copying in stalled:
            self._stalled(conn, oid, copying, now - copying.last)

    def _stalled(self, conn: object, oid: int, copying: _Copying, seconds: float) -> None:
        event(log, "snapshot.stalled", logging.ERROR, table=copying.name, seconds=round(seconds, 1),
              copy_thread=copying.thread.name, stacks=thread_stacks(copying.thread))
        try:
            ended = self.source.end_copy_reads(conn, (), oid)
        except Exception as exc:  # the table fails all the same; its reads end with their connections
            event(log, "snapshot.watch_failed", logging.WARNING, table=copying.name, error=str(exc).strip()[:300])
            ended = 0
        self.on_stalled(oid, CopyStalled(
            f"the copy of {copying.name} made no progress for {seconds:.0f} s (snapshot.stall_seconds:"
            f" {self.settings.stall_seconds:g}); {ended} read(s) on the source were ended; the log event"
            " snapshot.stalled holds the stacks of the copy's threads; it is retried once its thread returns"))


def thread_stacks(involved: threading.Thread) -> str:
    """The stacks of ``involved`` and of the threads a copy may wait on (the other copy threads, Spark's
    start and warm-up), one after another."""
    frames = sys._current_frames()
    parts = []
    for thread in threading.enumerate():
        named = thread.name.startswith(("initial-copy", "spark-", "copy-"))
        if thread.ident in frames and (thread is involved or named):
            stack = "".join(traceback.format_stack(frames[thread.ident]))
            parts.append(f"thread {thread.name}:\n{stack}")
    return "\n".join(parts)
