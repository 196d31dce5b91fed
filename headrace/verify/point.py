"""The consistent point of a comparison: a source snapshot at a known position (``SourcePoint``,
one per source kind), and the target pinned once it has applied everything before that position.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from headrace.core.errors import HeadraceError
from headrace.core.schema import TableSchema
from headrace.state.lifecycle import TableState
from headrace.state.store import StateStore, TableRow

if TYPE_CHECKING:
    from headrace.verify.sides import SourceSide


class VerifyError(HeadraceError):
    """verify could not run (exit 2): the sentence says why and what to do."""


class SourcePoint(ABC):
    """What verify asks of a source: a snapshot at a known position, a read of it as it is now, and
    what it knows of its tables. ``errors``: the exceptions a query on it raises."""

    errors: tuple[type[Exception], ...]

    @abstractmethod
    def snapshot(self) -> AbstractContextManager[tuple[SourceSide, int]]:
        """The source in one snapshot, and the staged log's position of that snapshot (it holds
        exactly the transactions before it)."""

    @abstractmethod
    def current(self) -> AbstractContextManager[SourceSide]:
        """The source as it is now, read outside any snapshot (``SourceSide.versions``)."""

    @abstractmethod
    def estimates(self, side: SourceSide, rows: list[TableRow]) -> dict[int, int]:
        """The source's estimate of each table's rows, by oid."""

    @abstractmethod
    def shape(self, side: SourceSide, row: TableRow) -> TableSchema:
        """The table's columns in ``side``'s snapshot (raises ``HeadraceError`` when it cannot tell)."""

    @abstractmethod
    def heartbeat(self) -> None:
        """Make the change stream move past the newest position even when the tables are idle."""

    @abstractmethod
    def format_position(self, position: int) -> str:
        """A position as logs and reports show it."""


def _waiting_for(point: SourcePoint, state: StateStore, rows: list[TableRow], position: int) -> tuple[dict[int, str], set[int]]:
    """Tables (oids) whose target does not yet hold everything committed before ``position``, and
    why; and those of them that will not get there without the operator (paused, or failed with no
    retry planned)."""
    captured = state.captured_lsn()
    if captured < position:
        return {r.oid: f"capture is at {point.format_position(captured)}" for r in rows}, set()
    pending = state.conn.execute(
        "SELECT l.table_oid, count(*) AS n FROM _headrace.log_index l"
        " LEFT JOIN _headrace.mat_cursor c ON c.pipeline = l.pipeline AND c.table_oid = l.table_oid"
        " WHERE l.pipeline = %s AND l.log_offset > coalesce(c.log_offset, 0) AND l.min_lsn < %s"
        " GROUP BY l.table_oid", (state.pipeline, position)).fetchall()
    behind = {int(r["table_oid"]): int(r["n"]) for r in pending}
    current = {r.oid: r for r in state.tables()}
    out, stuck = {}, set()
    for row in rows:
        now = current.get(row.oid)
        if now is None:
            out[row.oid] = "no longer replicated"
            stuck.add(row.oid)
        elif now.state not in (TableState.STREAMING, TableState.CATCHUP):
            out[row.oid] = f"the table is {now.state.value}" + (f" ({now.error})" if now.error else "")
            if now.state is TableState.PAUSED or now.waits_for_operator:
                stuck.add(row.oid)
        elif behind.get(row.oid):
            out[row.oid] = f"{behind[row.oid]} staged files before it are not applied yet"
    return out, stuck


def wait_for_target(point: SourcePoint, state: StateStore, rows: list[TableRow], position: int,
                    seconds: float) -> dict[int, str]:
    """Wait until each table's target holds every change committed before ``position``; return the
    tables (oids) that did not within ``seconds``, each with a sentence saying why and what to do.
    A table that cannot get there without the operator (paused, failed for good) is not waited for.

    A heartbeat moves capture past ``position`` even when the tables are idle.
    """
    deadline = time.monotonic() + seconds
    beat = 0.0
    while True:
        if time.monotonic() >= beat:
            point.heartbeat()
            beat = time.monotonic() + 2.0
        behind, stuck = _waiting_for(point, state, rows, position)
        if set(behind) <= stuck or time.monotonic() >= deadline:
            return {oid: (f"the target did not reach the source's position {point.format_position(position)}"
                          f"{'' if oid in stuck else f' within {seconds:g} s'} ({why}): verify compares a running"
                          " pipeline; start `headrace run`, resume the table, or wait longer with --wait")
                    for oid, why in behind.items()}
        time.sleep(0.2)
