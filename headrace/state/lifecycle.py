"""Table lifecycle: PENDING → SNAPSHOT → CATCHUP → STREAMING, ERRORED from anywhere, PAUSED by hand."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from enum import Enum

from headrace.core.backoff import Backoff


class TableState(str, Enum):
    PENDING = "PENDING"  # tracked, not copied yet
    SNAPSHOT = "SNAPSHOT"  # initial copy under way
    CATCHUP = "CATCHUP"  # copied; applying changes staged since the copy's position
    STREAMING = "STREAMING"  # caught up; applying changes as they arrive
    ERRORED = "ERRORED"  # failed; transient errors retried with backoff, terminal ones wait; others go on
    PAUSED = "PAUSED"  # set and cleared by the operator

    @property
    def applies_changes(self) -> bool:
        return self in (TableState.CATCHUP, TableState.STREAMING)

    @property
    def needs_copy(self) -> bool:
        return self in (TableState.PENDING, TableState.SNAPSHOT)


BACKOFF_BASE_SECONDS = 2.0
RETRY_BUDGET = 5  # consecutive failures after which a table counts as failed (readyz, --until-caught-up)
BACKOFF_MAX_SECONDS = 300.0
TABLE_RETRY = Backoff(BACKOFF_BASE_SECONDS, BACKOFF_MAX_SECONDS)  # the one backoff rule (core.backoff)


def next_retry(error_count: int, now: datetime | None = None) -> datetime:
    """When to retry after the ``error_count``-th consecutive failure (exponential, capped)."""
    now = now or datetime.now(timezone.utc)
    return now + timedelta(seconds=TABLE_RETRY.delay(max(1, error_count)))
