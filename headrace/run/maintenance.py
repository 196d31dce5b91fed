"""When to maintain which table, inside ``run`` and for ``headrace maintain``.

The run loop calls ``MaintenanceSchedule.step`` between apply passes: at most one table per call,
one that is due (``every_minutes`` since its last pass and ``after_batches`` apply batches since).
Running in the loop, never beside an apply of the same process, it cannot conflict with one
(DuckLake also takes the target's lock); the targets retry a conflict with another process.
A failed pass is logged and recorded (``status`` shows it) and never fails the table: the rows
are untouched, and the next schedule tries again.
"""

from __future__ import annotations

import logging
import time

from headrace.config import PipelineConfig
from headrace.core.errors import ConfigError
from headrace.core.interfaces import Target
from headrace.core.maintenance import MaintenancePolicy, TableFiles
from headrace.core.names import TableName
from headrace.logs import event
from headrace.materialize.failure import translate
from headrace.state.maintenance import MaintenanceStore
from headrace.state.store import StateStore, TableRow

log = logging.getLogger("headrace.maintenance")


def maintain_table(target: Target, store: MaintenanceStore, row: TableRow, policy: MaintenancePolicy) -> TableFiles | None:
    """One pass over one table; records the outcome and the file counts after it. Raises nothing
    but what stops the process (the error is logged and recorded)."""
    started = time.monotonic()
    before = _measure(target, row)
    try:
        target.maintain(row.schema, policy)
    except Exception as exc:
        text = str(translate(exc, row.qualified_name))[:1000]  # unwraps Py4J and DuckDB errors
        event(log, "maintenance.failed", logging.WARNING, table=row.qualified_name, error=text)
        store.record(row.oid, _measure(target, row), ran=True, error=text)
        return None
    after = _measure(target, row)
    store.record(row.oid, after, ran=True)
    event(log, "maintenance.done", table=row.qualified_name, seconds=round(time.monotonic() - started, 2),
          before=before.as_dict() if before else None, after=after.as_dict() if after else None)
    return after


def _measure(target: Target, row: TableRow) -> TableFiles | None:
    try:
        return target.table_files(row.schema)
    except Exception as exc:  # a table not created yet, or a catalog hiccup: counts are optional
        log.debug("cannot count files of %s: %s", row.qualified_name, exc)
        return None


class MaintenanceSchedule:
    """Tracks apply batches and last passes per table; runs due passes from the run loop."""

    def __init__(self, config: PipelineConfig, state_dsn: str) -> None:
        self.settings = config.maintenance
        self.state_dsn = state_dsn
        self.pipeline = config.name
        self.batches: dict[int, int] = {}  # apply batches since the table's last pass
        self.last_pass: dict[int, float] = {}  # monotonic time of the last pass
        self._started = time.monotonic()  # a run does not start with a pass of every table
        self._store: MaintenanceStore | None = None

    def batch_applied(self, oid: int) -> None:
        """Count an apply batch towards the table's next pass."""
        self.batches[oid] = self.batches.get(oid, 0) + 1

    def _due(self, row: TableRow, now: float) -> bool:
        last = self.last_pass.get(row.oid, self._started)
        return (self.batches.get(row.oid, 0) >= self.settings.after_batches
                and now - last >= self.settings.every_minutes * 60)

    def step(self, state: StateStore, target: Target) -> bool:
        """Maintain at most one due table; True when one was maintained."""
        if not self.settings.enabled:
            return False
        if not any(n >= self.settings.after_batches for n in self.batches.values()):
            return False  # no table can be due: no query (a quiet pipeline costs nothing)
        now = time.monotonic()
        for row in state.tables():
            if row.state.applies_changes and self._due(row, now):
                if self._store is None:
                    self._store = MaintenanceStore(self.state_dsn, self.pipeline)
                maintain_table(target, self._store, row, self.settings.policy())
                self.batches[row.oid] = 0
                self.last_pass[row.oid] = time.monotonic()
                return True
        return False

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


def maintain_tables(config: PipelineConfig, target: Target, only: str | None = None) -> dict[str, TableFiles | None]:
    """``headrace maintain``: one pass over every tracked table (or the one named ``schema.table``),
    whatever the schedule; returns the file counts after each pass."""
    dsn = config.source.state_dsn or config.source.resolved_dsn()
    state = StateStore(dsn, config.name)
    store = MaintenanceStore(dsn, config.name)
    try:
        rows = [r for r in (state.tables() if state.installed() else []) if r.state.applies_changes]
        if only is not None:
            wanted = TableName.parse(only)
            rows = [r for r in rows if TableName(r.schema.schema, r.schema.name) == wanted]
            if not rows:
                raise ConfigError(f"table {only} is not replicated by pipeline {config.name} (or not copied yet):"
                                  f" see `headrace status -c ...` for its tables")
        return {r.qualified_name: maintain_table(target, store, r, config.maintenance.policy()) for r in rows}
    finally:
        store.close()
        state.close()
