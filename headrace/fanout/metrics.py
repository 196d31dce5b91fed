"""Fan-out counters: plain dataclasses a metrics endpoint (or ``status --json``) can read.

Counters are totals since the process started; the cursor rows in the source catalog keep the
per-destination totals across restarts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(slots=True)
class DestinationMetrics:
    """Counters of one destination."""

    rows_read: int = 0
    rows_written: int = 0
    rows_upserted: int = 0
    rows_deleted: int = 0
    errors: int = 0
    lag_snapshots: int = 0
    last_snapshot: int | None = None
    last_error: str | None = None


@dataclass(slots=True)
class FanoutMetrics:
    """Counters of one fan-out instance."""

    destinations: dict[str, DestinationMetrics] = field(default_factory=dict)
    unrouted_rows: int = 0
    cancelled_rows: int = 0
    pool_evictions: int = 0
    change_reads: int = 0
    cycles: int = 0
    errors: int = 0
    source_snapshot: int | None = None
    split_seconds: float = 0.0  # Arrow time spent resolving and splitting change reads

    def destination(self, destination_id: str) -> DestinationMetrics:
        """The counters of a destination, created on first use."""
        found = self.destinations.get(destination_id)
        if found is None:
            found = self.destinations[destination_id] = DestinationMetrics()
        return found

    def as_dict(self) -> dict[str, Any]:
        """JSON-able snapshot of every counter."""
        return asdict(self)
