"""Capture's flusher: staged files written and registered on a thread of their own, in order.

Why a thread: a flush (the Arrow table, Parquet with zstd, fsync of file and folder, the
registering commit in state) took about 37% of capture's time, between two reads of the stream;
pyarrow, fsync and the state server's round trips release the GIL, so decoding the next changes
goes on meanwhile.

What stays as it was:
- Order. One thread takes the flushes in the order capture hands them over; a flush's files are
  registered, with the captured position, in one state transaction (its own state connection), so
  log offsets follow the stream as before.
- Confirm after durable. The flusher only publishes the registered position
  (``registered_lsn``); capture's own thread confirms the slot up to it (the replication
  connection is used from that thread only).
- After a failed flush, the later ones are dropped, never registered (a gap in the log would lose
  changes): capture stops this attempt, resumes from the position registered last, and the files
  left behind are orphans, removed before it writes again.

Memory: at most ``depth`` flushes wait for the thread beside the one it is writing and the one
capture is buffering; a full queue makes capture wait (confirming its position now and then, so the
server does not time the connection out).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from headrace.capture.buffer import TableBuffer
from headrace.capture.spill import Committed
from headrace.log.index import StagedFile

KEEP_ALIVE_S = 1.0  # while capture waits for the flusher, confirm this often (wal_sender_timeout)
MIN_LINGER_S = 0.05  # the shortest wait before a flush (``Flusher.linger``): transactions arriving together share it


@dataclass
class FlushJob:
    """Buffers to write; ``end_lsn`` None: a spill inside a large transaction, registered with the next job.
    ``streamed``: a transaction streamed while in progress, committed after the buffers' changes."""

    buffers: list[tuple[int, TableBuffer]]
    end_lsn: int | None
    token: str | None = None  # the source's resume token at end_lsn (``Commit.token``), registered with it
    streamed: Committed | None = None
    rows: int = field(init=False)

    def __post_init__(self) -> None:
        self.rows = sum(len(tb.buffer) for _, tb in self.buffers)


class Flusher:
    """The flush thread of one stream attempt: ``submit`` from capture's thread, ``close`` at its end.

    ``write`` writes one job's buffers as staged files (waiting while staging cannot take them,
    until ``halt`` is set); ``register`` registers files and a position in one state transaction
    and reports it (counts, events, the run loop's wake-up).
    """

    def __init__(self, write: Callable[[list[tuple[int, TableBuffer]]], list[StagedFile]],
                 register: Callable[[list[StagedFile], int, str | None], None], depth: int = 1,
                 finish: Callable[[Committed], list[StagedFile]] = lambda committed: []) -> None:
        self._write = write
        self._register = register
        self._finish = finish  # a streamed transaction's staged files (``Committed.finish``)
        self._depth = depth
        self._jobs: deque[FlushJob | None] = deque()
        self._busy = False  # a job is being written or registered
        self._cond = threading.Condition()
        self._spilled: list[StagedFile] = []  # written by spill jobs, registered with the next flush
        self.halt = threading.Event()  # ends a wait for staging space: the attempt is over
        self.error: BaseException | None = None  # what failed; later jobs are dropped
        self.last_seconds = 0.0  # how long the last flush took to write and register (``linger``)
        self._thread = threading.Thread(target=self._run, name="capture-flush", daemon=True)
        self._thread.start()

    @property
    def idle(self) -> bool:
        """Nothing waits or is being written: a flush handed over now starts at once."""
        with self._cond:
            return not self._jobs and not self._busy

    def linger(self, longest: float) -> float:
        """How old buffered changes get before a flush while this thread is free: twice what the
        last flush took (at least ``MIN_LINGER_S``), at most ``longest`` (``staging.flush_seconds``).

        A quiet stream's flushes are cheap, so its changes leave at once; under load each flush
        writes more and costs more, so the next one waits longer and is larger: the flusher spends
        at most about a third of its time flushing, and the files grow with the load by themselves.
        """
        return min(longest, max(MIN_LINGER_S, 2 * self.last_seconds))

    def check(self) -> None:
        """Raise what made a flush fail (capture's thread: the attempt ends there)."""
        if self.error is not None:
            raise self.error

    def submit(self, job: FlushJob, keep_alive: Callable[[], None]) -> None:
        """Hand ``job`` over; waits (calling ``keep_alive`` every ``KEEP_ALIVE_S``) while ``depth``
        jobs wait already."""
        with self._cond:
            while len(self._jobs) >= self._depth and self.error is None:
                if not self._cond.wait(KEEP_ALIVE_S):
                    keep_alive()
            self.check()
            self._jobs.append(job)
            self._cond.notify_all()

    def drain(self, keep_alive: Callable[[], None]) -> None:
        """Wait until every job handed over is registered (or one failed: raised here)."""
        with self._cond:
            while (self._jobs or self._busy) and self.error is None:
                if not self._cond.wait(KEEP_ALIVE_S):
                    keep_alive()
        self.check()

    def close(self) -> None:
        """Stop the thread after the job it is on (the others are dropped) and wait for it."""
        self.halt.set()
        with self._cond:
            self._jobs.clear()
            self._jobs.append(None)
            self._cond.notify_all()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs:
                    self._cond.wait()
                job = self._jobs.popleft()
                if job is None:
                    return
                self._busy = True
            try:
                if self.error is None:
                    self._flush(job)
            except BaseException as exc:  # handed to capture's thread, which ends the attempt
                self.error = exc
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _flush(self, job: FlushJob) -> None:
        started = time.monotonic()
        files = self._write(job.buffers) if job.buffers else []
        if job.streamed is not None:
            files += self._finish(job.streamed)
        if job.end_lsn is None:
            self._spilled += files
            return
        files, self._spilled = self._spilled + files, []
        self._register(files, job.end_lsn, job.token)
        if job.streamed is not None:
            job.streamed.discard()  # registered: its spill files are no longer needed
        elif job.buffers:  # an empty job only moves the position (an idle stream's acknowledgement)
            self.last_seconds = time.monotonic() - started
