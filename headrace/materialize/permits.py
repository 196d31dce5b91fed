"""Source connections for the initial copy, shared by the tables a round copies at once.

Each table's copy takes permits before it opens connections (one to plan its chunks, one per chunk
of the group a Spark job reads at once) and gives them back when they are closed, so the round
never holds more than ``snapshot.max_connections`` connections, however many tables copy together.

A chunk read on the driver goes through a session (``session``) that stays open after the read,
parked with its permit, for the next small table's read: a round of 200 small tables then opens a
handful of connections instead of 200 (each ~50 ms and ~30 ms of the driver's CPU, ``binary_copy``).
A parked session still counts as a connection: sessions stay one below the total, and a copy that
needs more permits than the sessions leave (a big table's group) closes parked ones to get theirs.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

from headrace.source.base import ChunkSession


class Permits:
    """A counting semaphore that grants several permits at once, first come first served.

    First come first served, so a big table waiting for a group's worth of permits is not starved by
    small tables taking one at a time.
    """

    def __init__(self, total: int) -> None:
        if total <= 0:
            raise ValueError(f"permits must be positive, got {total}")
        self.total = total
        self._free = total
        self._queue: deque[object] = deque()
        self._cond = threading.Condition()
        self._parked: list[ChunkSession] = []  # idle sessions, each holding one permit
        self._sessions = 0  # sessions open (parked or reading), each holding one permit
        # Below the total (unless it is 1), so one permit is left for planning and the like.
        self._session_cap = max(1, total - 1)

    @contextmanager
    def take(self, count: int) -> Iterator[None]:
        """Hold ``count`` permits (at most ``total``) for the block."""
        if not 0 < count <= self.total:
            raise ValueError(f"cannot take {count} of {self.total} permits")
        self._acquire(count, reuse=False)
        try:
            yield
        finally:
            self._release(count)

    @contextmanager
    def session(self, open_session: Callable[[], ChunkSession]) -> Iterator[ChunkSession]:
        """Hold one permit and a session for the block: a parked one, or one ``open_session`` opens.
        Afterwards the session is parked with its permit, or closed if a read in it failed."""
        session = self._acquire(1, reuse=True)
        if session is None:
            try:
                session = open_session()
            except BaseException:
                self._drop(1)
                raise
        parked = False
        try:
            yield session
            parked = not session.broken
        finally:
            if parked:
                with self._cond:
                    self._parked.append(session)
                    self._cond.notify_all()
            else:
                _close(session)
                self._drop(1)

    def close_parked(self) -> None:
        """Close the parked sessions (the round ends), giving their permits back."""
        with self._cond:
            sessions, self._parked = self._parked, []
        for session in sessions:
            _close(session)
        self._drop(len(sessions))

    def _acquire(self, count: int, reuse: bool) -> ChunkSession | None:
        """Wait for ``count`` permits in turn. With ``reuse``, for a session: a parked one (its permit
        with it), else a permit to open one while fewer than ``_session_cap`` are open.

        Sessions stay below the total, so a copy's planning (one permit, a moment) waits for another's
        rather than closing a parked session; one that needs more permits than sessions leave (a big
        table's group) closes parked sessions for theirs.
        """
        ticket = object()
        with self._cond:
            self._queue.append(ticket)
        while True:
            closing: list[ChunkSession] = []
            with self._cond:
                if self._queue[0] is ticket:
                    if reuse and self._parked:
                        self._queue.popleft()
                        self._cond.notify_all()
                        return self._parked.pop()
                    if self._free >= count and (not reuse or self._sessions < self._session_cap):
                        self._queue.popleft()
                        self._free -= count
                        self._sessions += count if reuse else 0
                        self._cond.notify_all()  # the next in line may fit in what is left
                        return None
                    short = count - (self.total - self._sessions)  # only closing sessions gives these
                    if not reuse and short > 0:
                        closing, self._parked = self._parked[:short], self._parked[short:]
                if not closing:
                    self._cond.wait()
                    continue
            for session in closing:
                _close(session)
            self._drop(len(closing))

    def _release(self, count: int) -> None:
        if count:
            with self._cond:
                self._free += count
                self._cond.notify_all()

    def _drop(self, sessions: int) -> None:
        """``sessions`` sessions are closed: their permits are free."""
        if sessions:
            with self._cond:
                self._sessions -= sessions
                self._free += sessions
                self._cond.notify_all()


def _close(session: ChunkSession) -> None:
    with suppress(Exception):  # nothing was written through it; a dead server is the next read's error
        session.close()
