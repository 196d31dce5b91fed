"""What the run reports as it goes, to whoever listens (the control plane's metrics, tests).

The run calls its ``Observers`` at each event; an observer that fails is logged and skipped, so
reporting never stops replication. ``control.metrics.PipelineMetrics`` implements ``RunObserver``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from headrace.materialize.apply import Applied
from headrace.state.store import StateStore, TableRow

log = logging.getLogger("headrace.run")

ValueCounts = dict[tuple[str, str], int]  # (column, reason) -> values changed under the values policy


class RunObserver(Protocol):
    """The events a run reports."""

    def batch_applied(self, state: StateStore, row: TableRow, applied: Applied) -> None:
        """One apply batch reached the target."""

    def table_failed(self, table: str, kind: str) -> None:
        """A table went to ERRORED with an error of ``kind`` (transient, terminal, unknown)."""

    def ddl_applied(self, kind: str) -> None:
        """A schema change or table event (create, drop, recreate, resync of partitions) was applied."""

    def values_changed(self, table: str, counts: ValueCounts) -> None:
        """The casts changed values under the values policy (``values.infinity: clamp``)."""

    def cut_committed(self, whole: bool) -> None:
        """A consistent cut (``apply.consistency: transaction``) was named: ``whole``, its batches became
        visible in one commit (DuckLake, an Iceberg REST catalog); else table by table (read through
        ``_headrace.cuts``)."""


class Observers:
    """Every observer attached to a run; itself a ``RunObserver`` that tells each of them."""

    def __init__(self) -> None:
        self._observers: list[RunObserver] = []

    def add(self, observer: RunObserver) -> None:
        self._observers.append(observer)

    def batch_applied(self, state: StateStore, row: TableRow, applied: Applied) -> None:
        for o in self._observers:
            _guarded(o.batch_applied, state, row, applied)

    def table_failed(self, table: str, kind: str) -> None:
        for o in self._observers:
            _guarded(o.table_failed, table, kind)

    def ddl_applied(self, kind: str) -> None:
        for o in self._observers:
            _guarded(o.ddl_applied, kind)

    def values_changed(self, table: str, counts: ValueCounts) -> None:
        for o in self._observers:
            _guarded(o.values_changed, table, counts)

    def cut_committed(self, whole: bool) -> None:
        for o in self._observers:
            _guarded(o.cut_committed, whole)


def _guarded(hook: Callable[..., None], *args: object) -> None:
    try:
        hook(*args)
    except Exception as exc:  # an observer must never stop replication
        log.debug("observer %r failed", hook, exc_info=exc)
