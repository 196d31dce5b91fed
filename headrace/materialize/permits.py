"""Source connections for the initial copy, shared by the tables a round copies at once.

Each table's copy takes permits before it opens connections (one to plan its chunks, one per chunk
of the group a Spark job reads at once) and gives them back when they are closed, so the round
never holds more than ``snapshot.max_connections`` connections, however many tables copy together.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager


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

    @contextmanager
    def take(self, count: int) -> Iterator[None]:
        """Hold ``count`` permits (at most ``total``) for the block."""
        if not 0 < count <= self.total:
            raise ValueError(f"cannot take {count} of {self.total} permits")
        ticket = object()
        with self._cond:
            self._queue.append(ticket)
            while self._queue[0] is not ticket or self._free < count:
                self._cond.wait()
            self._queue.popleft()
            self._free -= count
            self._cond.notify_all()  # the next in line may fit in what is left
        try:
            yield
        finally:
            with self._cond:
                self._free += count
                self._cond.notify_all()
