"""The run's Spark session, started by the first thing that uses it.

A DuckLake pipeline whose tables are copied already and whose batches are all built on the driver
(``apply.driver_batch_rows``) runs no Spark job: starting the JVM anyway took 5-9 s of the two cores at
every start (measured in ``bench/backlog.py``: a backlog's first batch waited for it while capture
shared the cores with it) and ~0.5 GiB. The target and the apply workers are handed this stand-in;
the session starts when one of them first reaches for it (a copy, a batch too big or too odd for the
driver, an Iceberg target, which needs it at once).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pyspark loads only when a Spark job runs
    from pyspark.sql import SparkSession


class SparkOnDemand:
    """Stands in for a ``SparkSession``: any attribute read starts the session (once, whichever
    thread asks first) and is then the session's own."""

    def __init__(self, start: Callable[[], SparkSession]) -> None:
        self._start = start
        self._session: SparkSession | None = None
        self._lock = threading.Lock()

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

    def __getattr__(self, name: str) -> Any:
        # Only names this class does not define come here: everything of the session's own.
        return getattr(self.session(), name)
