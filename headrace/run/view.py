"""What the control plane sees of a run: the narrow view it reads status and health from and submits
operator commands through. ``run.Run`` implements it; control imports only this module (the
``Request`` it submits, and ``find_table`` to name a tracked table as the run does), never the run
loop's internals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from headrace.config import PipelineConfig
from headrace.run.commands import Request
from headrace.run.tracking import find_table
from headrace.source.base import LockWaiter, RetainedLog

__all__ = ["CaptureStatus", "Request", "RunView", "find_table"]


@dataclass(frozen=True)
class CaptureStatus:
    """Capture as it is now (``None`` from ``RunView.capture_status`` before the run starts it)."""

    connected: bool
    last_error: str | None
    storage_error: str | None  # the staging store cannot take files (full, read-only)
    changes_captured: dict[tuple[int, str], int] = field(default_factory=dict)  # (oid, op) -> count


class RunView(Protocol):
    """A running pipeline, as the control plane (API, metrics, health, status page) needs it."""

    config: PipelineConfig
    dsn: str  # the source
    state_dsn: str  # the state tables (the source unless source.state_dsn is set)

    @property
    def paused(self) -> bool:
        """The operator paused the whole pipeline (capture goes on; copy and apply wait)."""

    @property
    def batches_in_flight(self) -> int:
        """Apply batches running on worker threads now (``apply.concurrency`` at most)."""

    def capture_status(self) -> CaptureStatus | None:
        """Capture's connection and last error; None before the run has started it."""

    def outage_reasons(self) -> list[str]:
        """One sentence per server the run depends on that does not answer now."""

    def server_up(self, role: str = "source") -> bool:
        """The server (``source``, ``state``, ``ducklake catalog``) last answered the run's probes."""

    def copy_lock_waiters(self) -> list[LockWaiter]:
        """Source sessions waiting now for a lock the initial copy's reads hold (a DDL, most often)."""

    def slot_wal(self) -> RetainedLog | None:
        """The slot's WAL figures read now; None when the slot or the source cannot be seen."""

    def submit(self, request: Request, timeout: float = 20.0) -> tuple[bool, dict[str, Any]]:
        """Run ``request`` in the run loop: (True, result), or (False, {}) when still queued at ``timeout``.

        Raises the run's domain errors (``core.errors.RequestError`` and its kinds)."""
