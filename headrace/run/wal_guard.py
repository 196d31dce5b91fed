"""The run's watch on its slot's WAL: warn when it keeps more than ``source.max_retained_wal``, and stop
the run, naming the recovery, once PostgreSQL invalidated it (the source's ``log_watch`` capability;
a source without one is not watched).
"""

from __future__ import annotations

import logging
import time

from headrace.config import PipelineConfig
from headrace.core.errors import SourceError
from headrace.logs import event
from headrace.source import open_source
from headrace.source.base import RetainedLog, Source

log = logging.getLogger("headrace.wal")

CHECK_SECONDS = 10.0  # how often a run looks at its slot's WAL


class WalGuard:
    """Looks at the slot every ``CHECK_SECONDS`` during a run: logs when it starts (and stops) keeping
    more WAL than the limit, and stops the run with the recovery when PostgreSQL invalidated it."""

    def __init__(self, config: PipelineConfig, dsn: str, source: Source | None = None) -> None:
        self.config = config
        self.dsn = dsn
        self.watch = (source or open_source(config, dsn)).log_watch()
        self._next = 0.0
        self._warned = False

    @property
    def next_due(self) -> float:
        """When (``time.monotonic``) the next check is due."""
        return self._next if self.watch is not None else float("inf")

    def current(self) -> RetainedLog | None:
        """The slot's WAL read now (for /readyz); None when the slot or the source cannot be seen."""
        return self.watch.read() if self.watch is not None else None

    def step(self) -> None:
        """Check when due; raise ``SourceError`` naming the recovery when the slot is lost."""
        if self.watch is None or time.monotonic() < self._next:
            return
        self._next = time.monotonic() + CHECK_SECONDS
        wal = self.current()
        if wal is None:
            return  # capture creates the slot; a slot dropped under a run is capture's error
        if wal.lost:
            event(log, "slot.lost", logging.ERROR, slot=wal.slot)
            raise SourceError(self.watch.lost_message())
        if wal.over_limit != self._warned:
            self._warned = wal.over_limit
            event(log, "slot.wal_retained", logging.WARNING if wal.over_limit else logging.INFO, slot=wal.slot,
                  retained_bytes=wal.retained_bytes, max_retained_wal=wal.limit_bytes, over=wal.over_limit)
