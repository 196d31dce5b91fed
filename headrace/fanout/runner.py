"""The fan-out loop: poll source snapshots, read changes once per cursor group, apply per destination.

Each cycle: destinations without a cursor are seeded (a scan pinned to the latest snapshot, or a
replay of every change in ``cdc_replay`` mode); the rest are grouped by cursor, and each group
shares one ``ducklake_table_changes`` read filtered to its routing values. The read is resolved and
split with Arrow compute (``planner.route``), then applied destination by destination. A failing
destination is classified and retried as a replicated table is (``failures.py``) while the others
proceed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict

from headrace.core.backoff import Backoff
from headrace.core.errors import ConfigError
from headrace.core.faults import crash_point
from headrace.fanout.config import DestinationConfig, FanoutConfig
from headrace.fanout.cursors import ApplyCounts, CursorStore
from headrace.fanout.destination import CursorMismatch, DestinationLake
from headrace.fanout.failures import Attempts, classify_failure
from headrace.fanout.metrics import FanoutMetrics
from headrace.fanout.planner import DestinationChanges, route, route_index, split_by_index
from headrace.fanout.pool import LakePool
from headrace.logs import event
from headrace.source.ducklake.reader import INTEGER_TYPES, STRING_TYPES, DuckLakeTableSource

log = logging.getLogger("headrace.fanout")


class FanoutRunner:
    """One instance of a fan-out pipeline; ``close()`` when done."""

    def __init__(self, config: FanoutConfig) -> None:
        self.config = config
        self.instance_id = config.instance.id
        self.metrics = FanoutMetrics()
        self.pool = LakePool(config.pool.max_open)
        self._backoff = Backoff(config.retry.initial_seconds, config.retry.max_seconds)
        try:
            lake = config.source.ducklake
            alias = self.pool.attach_source(lake)
            self.source = DuckLakeTableSource(self.pool.con, alias, lake.schema_name, lake.table_name)
            self.columns = self.source.columns()
            self.values = routing_values(config, {c.name: c.type for c in self.columns}, self.source.shown)
            self.cursors = CursorStore(self.pool.con, alias, config.name)
            self.cursors.ensure()
            self.unrouted, self.unrouted_through, self._prior_evictions = self.cursors.load_instance(
                self.instance_id
            )
        except BaseException:
            self.pool.close()
            raise
        self.mine = config.owned_destinations()
        self._values_by_id = {d.id: v for d, v in zip(config.destinations, self.values, strict=True)}
        self._attempts = {d.id: Attempts() for d in self.mine}

    def close(self) -> None:
        """Detach every lake."""
        self.pool.close()

    # -- loop ------------------------------------------------------------------------------------
    def run(self, stop: threading.Event | None = None, until_caught_up: bool = False) -> int:
        """Poll until ``stop`` is set (0), or with ``until_caught_up`` until every destination holds
        the snapshot that was latest at the start (0) or every lagging one failed too often (1)."""
        stop = stop or threading.Event()
        target = self.source.latest_snapshot()
        event(log, "fanout.start", pipeline=self.config.name, instance=self.instance_id,
              destinations=len(self.mine), source_snapshot=target)
        failures = 0
        budget = self.config.retry.give_up_after
        while not stop.is_set():
            try:
                self.cycle()
                failures = 0
            except Exception as exc:
                # The source lake or the cursor store failed: the same rule as a destination's, for all.
                failures += 1
                failure = classify_failure(exc, f"fan-out pipeline {self.config.name}")
                self.metrics.cycle_failed(failure.kind)
                retries = failure.retries(failures, budget)
                event(log, "fanout.cycle_failed", level=logging.WARNING if retries else logging.ERROR,
                      kind=failure.kind, error=failure.message, attempt=failures,
                      fix=None if retries else failure.fix)
                if not retries:
                    if failure.error is exc:
                        raise
                    raise failure.error from exc
                if until_caught_up and failures >= budget:
                    return 1
                stop.wait(self._backoff.delay(failures + 1))
                continue
            if until_caught_up:
                lagging = [d for d in self.mine if (self.metrics.destination(d.id).last_snapshot or -1) < target]
                if not lagging:
                    event(log, "fanout.caught_up", source_snapshot=target)
                    return 0
                if all(self._attempts[d.id].waits_for_operator or self._attempts[d.id].failures >= budget
                       for d in lagging):
                    event(log, "fanout.gave_up", level=logging.ERROR, destinations=[d.id for d in lagging])
                    return 1
                # Work is left: go again at once, or when the first failed destination may retry.
                wait = min(self._attempts[d.id].retry_at for d in lagging) - time.monotonic()
                if wait > 0:
                    stop.wait(wait)
                continue
            stop.wait(self.config.poll.interval_seconds)
        return 0

    def cycle(self) -> bool:
        """One pass over this instance's destinations; True when any destination moved."""
        self.metrics.cycles += 1
        latest = self.source.latest_snapshot()
        self.metrics.source_snapshot = latest
        stored = self.cursors.load()
        cursor: dict[str, int | None] = {}
        for d in self.mine:
            row = stored.get(d.id)
            cursor[d.id] = row.last_snapshot if row is not None and row.last_snapshot >= 0 else None
            m = self.metrics.destination(d.id)
            # Lag before the pass too: a scrape mid-pass must not see an unseeded destination at lag 0.
            m.last_snapshot, m.lag_snapshots = cursor[d.id], latest - (cursor[d.id] or 0)
        now = time.monotonic()
        ready = [d for d in self.mine if self._attempts[d.id].retry_at <= now]
        moved = False
        seeds = [d for d in ready if cursor[d.id] is None]
        if seeds and self.config.routing.seed_mode == "scan":
            moved |= self._seed_by_scan(seeds, latest)
            ready = [d for d in ready if cursor[d.id] is not None]
        groups: dict[int | None, list[DestinationConfig]] = defaultdict(list)
        for d in ready:
            start = cursor[d.id]
            if start is None or start < latest:
                groups[start].append(d)
        for start, members in sorted(groups.items(), key=lambda g: -1 if g[0] is None else g[0]):
            moved |= self._apply_group(start, members, latest)
        self._count_unrouted(latest)
        for d in self.mine:
            m = self.metrics.destination(d.id)
            m.lag_snapshots = latest - (m.last_snapshot if m.last_snapshot is not None else 0)
        return moved

    # -- reads -----------------------------------------------------------------------------------
    def _seed_by_scan(self, seeds: list[DestinationConfig], snapshot: int) -> bool:
        values = [self._value(d) for d in seeds]
        rows = self.source.scan(snapshot, self.config.routing.field, values)
        self.metrics.change_reads += 1
        started = time.perf_counter()
        parts = split_by_index(rows, route_index(rows[self.config.routing.field], values), len(values))
        self.metrics.split_seconds += time.perf_counter() - started
        keys = rows.select(self.config.routing.key_columns).slice(0, 0)
        event(log, "fanout.seed", destinations=len(seeds), snapshot=snapshot, rows=rows.num_rows)
        moved = False
        for d, part in zip(seeds, parts, strict=True):
            moved |= self._apply_one(d, None, snapshot, DestinationChanges(keys, part, part.num_rows), True)
        return moved

    def _apply_group(self, start: int | None, members: list[DestinationConfig], latest: int) -> bool:
        first = 0 if start is None else start + 1
        end = min(latest, first + self.config.poll.max_snapshots_per_read - 1)
        values = [self._value(d) for d in members]
        changes = self.source.changes(first, end, self.config.routing.field, values)
        self.metrics.change_reads += 1
        started = time.perf_counter()
        routed = route(changes, self.config.routing.field, self.config.routing.key_columns, values)
        self.metrics.split_seconds += time.perf_counter() - started
        self.metrics.cancelled_rows += routed.cancelled
        event(log, "fanout.read", start=first, end=end, destinations=len(members), rows=changes.num_rows)
        moved = False
        for d, value in zip(members, values, strict=True):
            batch = routed.by_value[value]
            if start is not None and batch.empty:
                # Nothing for this lake: move the cursor without a commit there (its applied snapshot
                # may stay behind; the ranges in between hold no changes for it).
                self._advance(d, end, ApplyCounts(read=batch.rows_read))
                moved = True
                continue
            moved |= self._apply_one(d, start, end, batch, start is None)
        return moved

    def _count_unrouted(self, latest: int) -> None:
        first = 0 if self.unrouted_through is None else self.unrouted_through + 1
        if first > latest:
            return
        found = self.source.count_unrouted(first, latest, self.config.routing.field, self.values)
        self.unrouted += found
        self.unrouted_through = latest
        self.metrics.unrouted_rows += found
        self.metrics.pool_evictions = self.pool.evictions
        self.cursors.save_instance(
            self.instance_id, self.unrouted, self.unrouted_through, self._prior_evictions + self.pool.evictions
        )

    # -- writes ----------------------------------------------------------------------------------
    def _apply_one(
        self, d: DestinationConfig, start: int | None, end: int, batch: DestinationChanges, replace: bool
    ) -> bool:
        attempts = self._attempts[d.id]
        what = f"destination {d.id}"
        try:
            alias = self.pool.acquire(d.ducklake, what)
            self.metrics.pool_evictions, self.metrics.pool_open = self.pool.evictions, self.pool.open_count
            lake = DestinationLake(self.pool.con, alias, d, self.config.name, self.columns,
                                   self.config.routing.key_columns)
            if not attempts.verified:
                lake.ensure()
                attempts.verified = True
                applied = lake.applied_snapshot()
                if _ahead(applied, start) or (applied is None and start is not None):
                    raise CursorMismatch(d.id, applied, start)
            started = time.perf_counter()
            counts = lake.apply(start, end, batch, replace_all=replace)
            if counts is not None:
                self.metrics.lake_committed(time.perf_counter() - started)
            crash_point("fanout.after_destination_commit")
            self._advance(d, end, counts or ApplyCounts())
        except CursorMismatch as exc:
            # A crash between the lake's commit and the cursor write, or a lake that lost its table:
            # take the lake's word and read again from there next cycle.
            event(log, "fanout.cursor_reconciled", destination=d.id, stored=start, applied=exc.applied)
            self._advance(d, exc.applied if exc.applied is not None else -1, ApplyCounts())
            return True
        except Exception as exc:
            self._failed(d, attempts, exc)
            return False
        attempts.succeeded()
        return True

    def _failed(self, d: DestinationConfig, attempts: Attempts, exc: Exception) -> None:
        """Record the failure; retry later (transient, or unknown within the budget) or wait for the
        operator, with the fix in the error (terminal, or unknown too often)."""
        what = f"destination {d.id}"
        failure = classify_failure(exc, what, d.ducklake.table)
        retries = failure.retries(attempts.failures + 1, self.config.retry.give_up_after)
        delay = self._backoff.delay(attempts.failures + 1) if retries else None
        attempts.failed(delay, time.monotonic())
        self.pool.release(d.ducklake, what)
        self.metrics.pool_open = self.pool.open_count
        message = failure.message if retries else f"{failure.message}; fix: {failure.fix}"
        self.metrics.destination_failed(d.id, failure.kind, message, waiting=not retries)
        event(log, "fanout.destination_failed", level=logging.WARNING if retries else logging.ERROR,
              destination=d.id, kind=failure.kind, attempt=attempts.failures,
              retry_in=round(delay, 2) if delay is not None else None, error=failure.message,
              fix=None if retries else failure.fix)
        if failure.kind == "unknown":  # its traceback is the operator's only lead; the others say enough
            log.warning("traceback", exc_info=exc)
        self.cursors.record_error(d.id, self.instance_id, message)

    def _advance(self, d: DestinationConfig, snapshot: int, counts: ApplyCounts) -> None:
        self.cursors.advance(d.id, self.instance_id, snapshot, counts)
        m = self.metrics.destination(d.id)
        m.last_snapshot = snapshot if snapshot >= 0 else None
        m.last_error = None
        m.waiting = False
        m.rows_read += counts.read
        m.rows_upserted += counts.upserted
        m.rows_deleted += counts.deleted
        m.rows_written += counts.written

    def _value(self, d: DestinationConfig) -> str | int:
        return self._values_by_id[d.id]


def _ahead(applied: int | None, start: int | None) -> bool:
    return applied is not None and (start is None or applied > start)


def routing_values(config: FanoutConfig, types: dict[str, str], table: str) -> list[str | int]:
    """Every destination's routing value in the routing column's type (config order)."""
    field = config.routing.field
    kind = types.get(field)
    if kind is None:
        raise ConfigError(f"routing.field {field!r} is not a column of source table {table} "
                          f"(columns: {', '.join(types)})")
    missing = [k for k in config.routing.key_columns if k not in types]
    if missing:
        raise ConfigError(f"routing.key_columns {missing} are not columns of source table {table}")
    if kind in INTEGER_TYPES:
        out: list[str | int] = []
        for d in config.destinations:
            try:
                out.append(int(d.routing_value))
            except ValueError:
                raise ConfigError(f"destination {d.id}: routing_value {d.routing_value!r} is not an integer, "
                                  f"but {table}.{field} is {kind}") from None
        return out
    if kind in STRING_TYPES:
        return [str(d.routing_value) for d in config.destinations]
    raise ConfigError(f"routing.field {table}.{field} is {kind}; route on a string or integer column")

