"""The initial-copy round: the tables that need a copy (or a retried one), copied in a thread of their own.

Copies run beside the apply loop, so the other tables keep streaming meanwhile. On a cluster a round
starts Spark in the background (``SparkOnDemand.start_in_background``) instead of waiting for it; in
local mode the driver's threads copy (``copy_lanes.CopyLanes``) and Spark starts only when used.
Stopping lets the running copy finish its current chunk group; what is left resumes at the next
round (progress is kept per chunk).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, cast

from headrace.config import PipelineConfig
from headrace.core.interfaces import Target
from headrace.engines.spark.on_demand import SparkOnDemand
from headrace.engines.spark.session import local_cores
from headrace.materialize.initial_copy import FailHandler, InitialCopy
from headrace.run.observer import RunObserver
from headrace.source.base import LockWaiter, Source
from headrace.state.lifecycle import TableState
from headrace.state.store import StateStore, TableRow

if TYPE_CHECKING:  # pyspark loads only when a Spark job runs
    from pyspark.sql import SparkSession


class Copier:
    """Starts copy rounds and stops them (at a run's end, or to ride out an outage)."""

    def __init__(self, config: PipelineConfig, dsn: str, state_dsn: str, spark: SparkOnDemand,
                 target: Callable[[], Target], fail: FailHandler, observer: RunObserver,
                 source: Source | None = None, on_copied: Callable[[int], None] = lambda oid: None) -> None:
        self.config = config
        self._on_copied = on_copied  # ``InitialCopy``'s: a table the target wants maintained at once
        self.source = source
        self.dsn = dsn
        self.state_dsn = state_dsn
        self._spark = spark
        self._target = target
        self._fail = fail
        self._observer = observer
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._copy: InitialCopy | None = None
        # Copy threads given up on (``CopyWatch``), by table: the table is not copied again while one runs.
        self._stuck: dict[int, threading.Thread] = {}

    @property
    def running(self) -> bool:
        """A copy round is under way (in its thread)."""
        return self._thread is not None and self._thread.is_alive()

    def start(self, state: StateStore) -> bool:
        """Start a round for the tables that need a copy; False when one runs already or none needs it."""
        if self.running:
            return False
        now = datetime.now(timezone.utc)
        # Only the states a copy can start from are read: streaming, none is (a pass reads no row).
        todo = [r.oid for r in state.tables(COPY_FROM)
                if (r.state.needs_copy or retry_copy(r, now)) and r.oid not in self._stuck]
        if not todo:
            return False
        # On a cluster Spark starts while the round takes its snapshot and plans (its jobs copy the big
        # tables). In local mode the driver's threads copy and Spark starts when something needs it (an
        # Iceberg target, at once; a DuckLake copy, only for values that need Spark's casts): a DuckLake
        # copy then does not share the two cores with a JVM it never uses. The round opens the target
        # itself (a fresh Iceberg copy waits for the session only at its first commit, its first groups
        # written meanwhile): nothing here waits for the JVM.
        if local_cores(self.config.spark.master, self.config.spark.conf) is None:
            self._spark.start_in_background()
        copy = InitialCopy(self.config, self.dsn, self.state_dsn, cast("SparkSession", self._spark), self._target,
                           self._fail, self._stop, self._observer.values_changed, self.source, warmth=self._spark,
                           stuck=self._stuck, on_copied=self._on_copied)
        self._copy = copy
        self._thread = threading.Thread(target=copy.run, args=(todo,), name="initial-copy", daemon=True)
        self._thread.start()
        return True

    def lock_waiters(self) -> list[LockWaiter]:
        """Statements waiting for a lock the running round's reads hold, at its watch's last look."""
        copy = self._copy
        return copy.watch.waiters if copy is not None and self.running else []

    def stop(self) -> None:
        """Let a running copy finish its current chunk group; what is left resumes next round."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._stop = threading.Event()


# The states ``start`` finds its tables in: needing a copy, or ERRORED (``retry_copy``).
COPY_FROM = frozenset({*(s for s in TableState if s.needs_copy), TableState.ERRORED})


def retry_copy(row: TableRow, now: datetime) -> bool:
    """An ERRORED table whose copy is due for another try."""
    return (row.state is TableState.ERRORED and row.resume_state is not None and row.resume_state.needs_copy
            and row.retry_at is not None and row.retry_at <= now)
