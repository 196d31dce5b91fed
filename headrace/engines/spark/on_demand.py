"""The run's Spark session, started by the first thing that uses it, or ahead of a copy that will.

A DuckLake pipeline whose tables are copied already and whose batches are all built on the driver
(``apply.driver_batch_rows``) runs no Spark job: starting the JVM anyway took 5-9 s of the two cores at
every start (measured in ``bench/backlog.py``: a backlog's first batch waited for it while capture
shared the cores with it) and ~0.5 GiB. The target and the apply workers are handed this stand-in;
the session starts when one of them first reaches for it (a copy, a batch too big or too odd for the
driver, an Iceberg target, which needs it at once).

On a cluster a copy round starts it in the background instead (``start_in_background``): the JVM comes
up while the round takes its snapshot and plans its chunks, and a copy about to write a big table's
files has the executors' Python workers warmed (``warm_in_background``, ``warm_up``: started and their
imports done), for the first Spark job of a fresh session took 2-8 s longer than the next one. In
local mode the driver's threads copy (``materialize.copy_lanes.CopyLanes``): nothing is warmed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from headrace.logs import event

if TYPE_CHECKING:  # pyspark loads only when a Spark job runs
    from pyspark.sql import SparkSession

log = logging.getLogger("headrace.spark")


class SparkOnDemand:
    """Stands in for a ``SparkSession``: any attribute read starts the session (once, whichever
    thread asks first) and is then the session's own.

    ``warm_up`` (None: nothing to warm, e.g. a session handed in) runs once, when a copy asks
    (``warm_in_background``).
    """

    def __init__(self, start: Callable[[], SparkSession],
                 warm_up: Callable[[SparkSession], None] | None = None) -> None:
        self._start = start
        self.warm_up = warm_up
        self._session: SparkSession | None = None
        self._lock = threading.Lock()
        self._background: dict[str, threading.Thread] = {}  # by name: the start, the warm-up
        self._background_lock = threading.Lock()
        self._warmed = threading.Event()

    @property
    def started(self) -> bool:
        """The session runs (something used it)."""
        return self._session is not None

    def session(self) -> SparkSession:
        """The session, started now if it was not."""
        if self._session is None:
            with self._lock:  # apply workers may reach for it at the same moment
                if self._session is None:
                    self._session = self._start()
        return self._session

    def start_in_background(self) -> None:
        """Start the session on a thread of its own, now: for a caller that will need it soon and has
        other work meanwhile. Does nothing when it runs already or a background start is under way."""
        self._in_background("spark-start", self.session)

    def warm_in_background(self) -> None:
        """Start the session if need be, then warm it (``warm_up``), on a thread of its own; once."""
        if self.warm_up is not None:
            self._in_background("spark-warm", self._start_and_warm)

    def wait_warm(self, timeout: float | None = None) -> bool:
        """Wait for ``warm_in_background`` to end; whether it did (True when nothing is to warm)."""
        return self.warm_up is None or self._warmed.wait(timeout)

    def _in_background(self, name: str, work: Callable[[], object]) -> None:
        with self._background_lock:
            if name in self._background:
                return
            if name == "spark-start" and self._session is not None:
                return
            self._background[name] = threading.Thread(target=self._quietly, args=(work,), name=name, daemon=True)
            self._background[name].start()

    def _start_and_warm(self) -> None:
        try:
            session = self.session()
            assert self.warm_up is not None
            began = time.monotonic()
            self.warm_up(session)
            event(log, "spark.warm", seconds=round(time.monotonic() - began, 2))
        finally:
            self._warmed.set()

    @staticmethod
    def _quietly(work: Callable[[], object]) -> None:
        try:
            work()
        except Exception as exc:
            # Not this thread's to report: the next use of the session starts it again and fails
            # where a table or the run can say so (a warm-up failing leaves a working session).
            event(log, "spark.background_failed", logging.WARNING, error=str(exc).strip().splitlines()[0][:300]
                  if str(exc).strip() else type(exc).__name__)

    def __getattr__(self, name: str) -> Any:
        # Only names this class does not define come here: everything of the session's own.
        return getattr(self.session(), name)
