"""When to maintain which table, inside ``run`` and for ``headrace maintain``.

The run loop calls ``MaintenanceSchedule.step`` between apply passes; it starts a pass over at most
one due table (``every_minutes`` since its last pass and ``after_batches`` apply batches since, or
``max_batches`` batches since whenever the last pass was, or a copy the target wants maintained at
once: ``copied``) in
its own thread, so the loop goes on applying the other tables meanwhile (an Iceberg pass takes tens
of seconds). Between full passes, a table that had ``max_snapshots / 2`` batches since its snapshots
were last capped gets a cheap expiry step instead (``Target.expire_snapshots``, the same thread; only
on a target that ``caps_snapshots``). The table under
maintenance is not applied until its pass (or step) ends (``busy``): its apply would race the
compaction's commit. DuckLake passes also take the target's lock (a few seconds);
the targets retry a conflict with another process.
A failed pass is logged and recorded (``status`` shows it) and never fails the table: the rows
are untouched, and the next schedule tries again.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from headrace.config import PipelineConfig
from headrace.core.errors import ConfigError
from headrace.core.interfaces import Target
from headrace.core.maintenance import MaintenancePolicy, TableFiles
from headrace.core.names import TableName
from headrace.core.schema import TableSchema
from headrace.history.config import Mode, history_table
from headrace.logs import event
from headrace.materialize.error_boundary import translate
from headrace.state.cuts import CutStore
from headrace.state.maintenance import MaintenanceStore
from headrace.state.store import StateStore, TableRow

log = logging.getLogger("headrace.maintenance")


def history_tables(target: Target, table: TableSchema, modes: tuple[Mode, ...]) -> list[TableSchema]:
    """``table``'s history tables that exist, as tables of their own name (``target_as``) for ``maintain``."""
    writer = target.history() if modes else None
    if writer is None:
        return []
    return [dataclasses.replace(table, target_as=(table.target_schema, history_table(table.target_table, mode)))
            for mode in modes if writer.applied_offset(table, mode) is not None]


def cut_policy(target: Target, cuts: CutStore | None, row: TableRow, policy: MaintenancePolicy) -> MaintenancePolicy:
    """``policy`` for the table itself. Where consistent cuts name its snapshots (``cuts``), expiry keeps
    the one the newest cut names and every later one: a table quiet since its last batch is named at
    that batch's snapshot in every cut, however old it grows. Any later cut names that snapshot or a
    later one (a quiet table's stays, a batch's is newer), so reading it once, as the pass starts, holds."""
    if cuts is None:
        return policy
    name, _current = target.snapshot_at(row.schema)
    return dataclasses.replace(policy, keep_from_snapshot=cuts.named(name))


def cut_store(config: PipelineConfig, target: Target, dsn: str) -> CutStore | None:
    """The pipeline's consistent cuts, where they name each table's snapshots (``consistency: transaction``
    on Iceberg); else None."""
    if config.apply.consistency != "transaction" or not target.names_snapshots:
        return None
    return CutStore(dsn, config.name)


def maintain_table(target: Target, store: MaintenanceStore, row: TableRow, policy: MaintenancePolicy,
                   history: tuple[Mode, ...] = (), cuts: CutStore | None = None) -> TableFiles | None:
    """One pass over one table and its ``history`` tables (docs/history.md); records the outcome and
    the mirror's file counts after it; ``cuts``: see ``cut_policy``. Raises nothing but what stops the
    process (the error is logged and recorded)."""
    started = time.monotonic()
    before = _measure(target, row)
    try:
        target.maintain(row.schema, cut_policy(target, cuts, row, policy))
        for table in history_tables(target, row.schema, history):
            target.maintain(table, policy)
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
        self.config = config
        self.settings = config.maintenance
        self.history = config.history
        self.state_dsn = state_dsn
        self.pipeline = config.name
        self.batches: dict[int, int] = {}  # apply batches since the table's last pass
        self.uncapped: dict[int, int] = {}  # apply batches since its snapshots were last capped
        self.last_pass: dict[int, float] = {}  # monotonic time of the last pass
        self._started = time.monotonic()  # a run does not start with a pass of every table
        self._store: MaintenanceStore | None = None
        self._cuts: CutStore | None = None  # ``cut_policy``: opened at the first pass that needs it
        self._thread: threading.Thread | None = None  # the pass under way, if any
        self._table: int | None = None  # the oid it maintains
        self.on_done: Callable[[], None] = lambda: None  # wakes the loop: the table can apply again
        self.applying: Callable[[int], bool] = lambda oid: False  # a batch of the table is in flight
        # ``copied`` makes a pass due. Not in a run that ends once caught up: it would wait for the pass
        # before exiting (a 20M-row DuckLake copy's merge: 11.4 s after its 19.2 s copy); the next
        # long run's schedule or ``headrace maintain`` merges the files then.
        self.after_copies = True
        self._copied: deque[int] = deque()  # ``copied``'s tables, from the copy's thread to the loop's

    def batch_applied(self, oid: int) -> None:
        """Count an apply batch towards the table's next pass."""
        self.batches[oid] = self.batches.get(oid, 0) + 1
        self.uncapped[oid] = self.uncapped.get(oid, 0) + 1

    def copied(self, oid: int) -> None:
        """The table's copy left it wanting a pass (``Target.copy_finished``): due at the next step,
        unless the run ends once caught up (``after_copies``). Called on the copy's thread: the table is
        handed over, and the loop's thread, the only one that touches ``batches``, marks it due
        (``_take_copied``)."""
        if self.after_copies:
            self._copied.append(oid)

    def _take_copied(self) -> None:
        """Make the tables ``copied`` handed over due (the loop's thread)."""
        while self._copied:
            oid = self._copied.popleft()
            self.batches[oid] = max(self.batches.get(oid, 0), self.settings.max_batches)

    def _due(self, oid: int, now: float) -> bool:
        last = self.last_pass.get(oid, self._started)
        batches = self.batches.get(oid, 0)
        return batches >= self.settings.max_batches or (
            batches >= self.settings.after_batches and now - last >= self.settings.every_minutes * 60)

    @property
    def running(self) -> bool:
        """A pass is under way (in its thread)."""
        return self._thread is not None and self._thread.is_alive()

    def busy(self, oid: int) -> bool:
        """A pass is under way on this table: the apply pass leaves it until the pass ends."""
        return self._table == oid and self.running

    def step(self, state: StateStore, target: Target) -> bool:
        """Start a pass over at most one due table, in its own thread; False: the loop's own step did
        no work (the pass goes on beside it)."""
        self._take_copied()
        if not self.settings.enabled or self.running:
            return False
        cap = max(1, self.settings.max_snapshots // 2)
        now = time.monotonic()
        # Tables past after_batches but inside every_minutes are not due: no query for them either
        # (under load every loop pass asked, for minutes, until one was).
        due_oids = {oid for oid in self.batches if self._due(oid, now)}
        caps = target.caps_snapshots
        if not due_oids and not (caps and any(n >= cap for n in self.uncapped.values())):
            return False  # no table can be due: no query (a quiet pipeline costs nothing)
        rows = [r for r in state.tables() if r.state.applies_changes and not self.applying(r.oid)]
        due = next((r for r in rows if r.oid in due_oids), None)
        if due is not None:
            self._start(target, due)
        elif caps and (capped := next((r for r in rows if self.uncapped.get(r.oid, 0) >= cap), None)):
            self._start_cap(target, capped)
        return False

    def _start_cap(self, target: Target, row: TableRow) -> None:
        """Cap the snapshots of ``row``'s table and its history tables (``Target.expire_snapshots``)."""
        policy, cuts, modes = self.settings.policy(), self._cut_store(target), self.history.extra_modes(row.schema.table_name)
        self.uncapped[row.oid] = 0

        def cap() -> None:
            started = time.monotonic()
            try:
                expired = target.expire_snapshots(row.schema, cut_policy(target, cuts, row, policy))
                for table in history_tables(target, row.schema, modes):
                    expired += target.expire_snapshots(table, policy)
                event(log, "maintenance.snapshots_capped", table=row.qualified_name, expired=expired,
                      seconds=round(time.monotonic() - started, 3))
            except Exception as exc:  # never fails the table: the next cap or pass tries again
                text = str(translate(exc, row.qualified_name))[:1000]
                event(log, "maintenance.cap_failed", logging.WARNING, table=row.qualified_name, error=text)

        self._launch(row.oid, cap)

    def _start(self, target: Target, row: TableRow) -> None:
        if self._store is None:
            self._store = MaintenanceStore(self.state_dsn, self.pipeline)
        store, policy, cuts = self._store, self.settings.policy(), self._cut_store(target)
        self.batches[row.oid] = self.uncapped[row.oid] = 0  # the pass caps the snapshots too

        def maintain() -> None:
            try:
                maintain_table(target, store, row, policy,  # logs and records its own failure
                               self.history.extra_modes(row.schema.table_name), cuts)
            finally:
                self.last_pass[row.oid] = time.monotonic()

        self._launch(row.oid, maintain)

    def _cut_store(self, target: Target) -> CutStore | None:
        """``cut_policy``'s cuts, opened at the first pass or step that needs them."""
        if self._cuts is None:
            self._cuts = cut_store(self.config, target, self.state_dsn)
        return self._cuts

    def _launch(self, oid: int, work: Callable[[], None]) -> None:
        """Run ``work`` on table ``oid`` in the maintenance thread; the table is ``busy`` until it ends."""
        self._table = oid

        def run() -> None:
            try:
                work()
            finally:
                self.on_done()

        self._thread = threading.Thread(target=run, name="maintenance", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Wait for a pass under way (before the target closes), then close the store."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            self._table = None
        if self._store is not None:
            self._store.close()
            self._store = None
        if self._cuts is not None:
            self._cuts.close()
            self._cuts = None


def maintain_tables(config: PipelineConfig, target: Target, only: str | None = None) -> dict[str, TableFiles | None]:
    """``headrace maintain``: one pass over every tracked table (or the one named ``schema.table``),
    whatever the schedule; returns the file counts after each pass."""
    dsn = config.source.state_dsn or config.source.resolved_dsn()
    state = StateStore(dsn, config.name)
    store = MaintenanceStore(dsn, config.name)
    cuts = cut_store(config, target, dsn)
    try:
        rows = [r for r in (state.tables() if state.installed() else []) if r.state.applies_changes]
        if only is not None:
            wanted = TableName.parse(only)
            rows = [r for r in rows if TableName(r.schema.schema, r.schema.name) == wanted]
            if not rows:
                raise ConfigError(f"table {only} is not replicated by pipeline {config.name} (or not copied yet):"
                                  f" see `headrace status -c ...` for its tables")
        return {r.qualified_name: maintain_table(target, store, r, config.maintenance.policy(),
                                                 config.history.extra_modes(r.schema.table_name), cuts) for r in rows}
    finally:
        store.close()
        if cuts is not None:
            cuts.close()
        state.close()
