"""Several tables' writes in one DuckLake commit (a group commit), shared by copies and change batches.

Each DuckLake commit costs more the more tables the lake holds (the next statement reloads the
catalog), and one DuckDB connection commits one write at a time anyway. So a thread whose write is
ready while another thread's commit runs leaves it here, and the next thread to take the target's
lock commits every write waiting, each table's steps as alone. A table still commits all or
nothing; when a group's transaction fails, its writes are committed again one by one, so one
table's failure is its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

W = TypeVar("W")  # what one write holds (a copy's rows, a change batch)
R = TypeVar("R")  # what its commit gives back


@dataclass(eq=False)
class Pending(Generic[W, R]):
    """One write waiting for a commit, and then what the commit gave: its value or its error."""

    write: W
    done: bool = False
    value: R | None = None
    error: BaseException | None = None

    def result(self) -> R:
        """What the commit gave; raises the write's error."""
        if self.error is not None:
            raise self.error
        assert self.done, "result() before the group commit ran"
        return self.value  # type: ignore[return-value]  # None is a legitimate R (change batches)


@dataclass
class GroupQueue(Generic[W, R]):
    """Writes waiting for the next group commit, shared by the threads that bring them."""

    _waiting: list[Pending[W, R]] = field(default_factory=list)
    _mutex: threading.Lock = field(default_factory=threading.Lock)

    def add(self, write: W) -> Pending[W, R]:
        """Queue ``write`` for the next group commit."""
        pending: Pending[W, R] = Pending(write)
        with self._mutex:
            self._waiting.append(pending)
        return pending

    def take(self, own: Pending[W, R]) -> list[Pending[W, R]]:
        """Every waiting write, ``own`` included (a failed group may have taken it and left it undone)."""
        with self._mutex:
            group, self._waiting = self._waiting, []
        return group if own in group else [*group, own]


def commit_group(group: list[Pending[W, R]], commit: Callable[[list[W]], list[R]]) -> None:
    """Commit ``group`` in one transaction (``commit`` returns each write's value), or, when that
    fails, each write in its own; every write ends done, with its value or its error."""
    try:
        values = commit([p.write for p in group])
    except Exception as exc:
        if len(group) > 1:
            for pending in group:
                commit_group([pending], commit)
            return
        group[0].error = exc
    else:
        for pending, value in zip(group, values, strict=True):
            pending.value = value
    for pending in group:
        pending.done = True


def write_through(queue: GroupQueue[W, R], lock: threading.Lock, write: W,
                  commit: Callable[[list[W]], list[R]]) -> R:
    """Queue ``write`` and wait for its commit: under ``lock``, unless a thread that took the lock
    first committed it with its own group, commit every write waiting (``commit_group``)."""
    pending = queue.add(write)
    with lock:
        if not pending.done:
            commit_group(queue.take(pending), commit)
    return pending.result()
