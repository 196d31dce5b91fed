"""Initial copies written on the driver, several tables to one DuckLake commit (a group commit).

Each DuckLake commit costs more the more tables the lake holds (the next statement reloads the
catalog): measured on our 2-core machine under load, 200 tables of 1,000 rows took 40 s committed
one by one, 13 s four to a commit, 5 s eight to a commit. So a copy thread that brings its rows
while another thread's commit runs leaves them here, and the next thread to take the target's lock
commits every copy waiting, each table's steps as alone (``DuckLakeTarget.write_snapshot_arrow``).
A table still commits all or nothing; when a group's transaction fails, its tables are written again
one by one, so one table's failure is its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa

from headrace.core.schema import TableSchema


@dataclass(eq=False)
class CopyWrite:
    """One table's rows waiting for a commit, and then what the commit gave: the rows the table
    holds, or the error that stopped it."""

    table: TableSchema
    rows: pa.Table
    replace: bool
    done: bool = False
    count: int = 0
    error: BaseException | None = None

    def result(self) -> int:
        """The rows the table holds after the commit; raises the table's error."""
        if self.error is not None:
            raise self.error
        return self.count


@dataclass
class CopyQueue:
    """Copies waiting for the next commit (``write``), shared by the copy threads."""

    _waiting: list[CopyWrite] = field(default_factory=list)
    _mutex: threading.Lock = field(default_factory=threading.Lock)

    def add(self, write: CopyWrite) -> None:
        """Queue ``write`` for the next group commit."""
        with self._mutex:
            self._waiting.append(write)

    def take(self, own: CopyWrite) -> list[CopyWrite]:
        """Every waiting copy, ``own`` included (a failed group may have taken it and left it undone)."""
        with self._mutex:
            group, self._waiting = self._waiting, []
        return group if own in group else [*group, own]


def commit_group(group: list[CopyWrite], commit: Callable[[list[CopyWrite]], list[int]]) -> None:
    """Commit ``group`` in one transaction (``commit`` returns each table's row count), or, when that
    fails, each table in its own; every write ends done, with its count or its error."""
    try:
        counts = commit(group)
    except Exception as exc:
        if len(group) > 1:
            for write in group:
                commit_group([write], commit)
            return
        group[0].error = exc
    else:
        for write, count in zip(group, counts, strict=True):
            write.count = count
    for write in group:
        write.done = True
