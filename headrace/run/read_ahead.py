"""A table's next batch read while its current one commits.

A backlog drains as a row of batches of one table: each is read, deduplicated and cast by DuckDB on
the driver (``engines.driver.batch``), then committed by the target, and without this the next one's
build waits for that commit. When the batch that follows the one in flight is already full (more is
staged beyond it, so planned later it would hold the same files) and in the table's current shape
(``materialize.apply.plan_following``), it is planned at once and built on a thread of its own; the
table's next dispatch takes it built. On two cores, a 1M-change MySQL backlog into DuckLake
(``bench/mysql.py``'s set-up), whose batches of 200K changes took ~0.5 s to build and ~0.9 s to commit
one after the other: drained in 9.6-11.7 s with it, 10.4-12.8 s without.

What a build reads is the staged files above the cursor it was planned at, which nothing removes, and
what it makes depends on them, the table's shape and its copy position only: a build is taken when the
table's cursor, shape and copy position are still those it was planned with, and dropped otherwise
(a failed batch, a resync, an outage). At most one per table waits, of at most ``apply.driver_batch_rows``
staged rows.
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import Future, ThreadPoolExecutor

from headrace.core.batch import ChangeBatch
from headrace.materialize.apply import PlannedBatch, driver_build
from headrace.state.store import TableRow


class ReadAhead:
    """Each table's next batch, planned and being built (loop thread only, but for the builds)."""

    def __init__(self) -> None:
        self._ahead: dict[int, tuple[PlannedBatch, Future[ChangeBatch]]] = {}
        self._tried: dict[int, int] = {}  # oid -> the table's last staged offset when last planned ahead
        self._pool: ThreadPoolExecutor | None = None

    def worth_planning(self, oid: int, tail: int) -> bool:
        """No batch read ahead for the table, and more staged since the last try (a pass comes at every
        flush and finished batch: the log index is read once for each new tail, not at every pass)."""
        if oid in self._ahead or self._tried.get(oid) == tail:
            return False
        self._tried[oid] = tail
        return True

    def start(self, planned: PlannedBatch) -> None:
        """Build ``planned`` (``plan_following``'s) on the read-ahead thread."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, "headrace-read-ahead")
        self._ahead[planned.row.oid] = (planned, self._pool.submit(driver_build, planned))

    def take(self, row: TableRow, cursor: int | None) -> tuple[PlannedBatch, Future[ChangeBatch]] | None:
        """The table's batch read ahead, if it still follows its cursor in its shape and copy, timed from
        now (it is dispatched); None, and the build dropped, otherwise."""
        self._tried.pop(row.oid, None)
        ahead = self._ahead.pop(row.oid, None)
        if ahead is None:
            return None
        planned, built = ahead
        if cursor != planned.cursor or row.schema != planned.row.schema or row.snapshot_lsn != planned.row.snapshot_lsn:
            return None
        return dataclasses.replace(planned, started=time.monotonic(), read_ahead=True), built

    def drop(self, oid: int | None = None) -> None:
        """Forget the table's batch read ahead (``oid`` None: every table's)."""
        if oid is None:
            self._ahead.clear()
            self._tried.clear()
        else:
            self._ahead.pop(oid, None)
            self._tried.pop(oid, None)

    def close(self) -> None:
        """The run ends: nothing read ahead, the thread stopped."""
        self.drop()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
