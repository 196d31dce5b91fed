"""Fan-out counters: plain dataclasses the runner feeds, exported to Prometheus as ``headrace_fanout_*``.

Counters are totals since the process started; the cursor rows in the source catalog keep the
per-destination totals across restarts (``status --json``). ``FanoutCollector`` reads the counters
at scrape time, in its own registry per instance (as ``control.metrics`` does for a CDC pipeline),
so the run loop never waits on a scrape.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

KINDS = ("transient", "terminal", "unknown")  # materialize.error_boundary's kinds, always exported


@dataclass(slots=True)
class DestinationMetrics:
    """Counters of one destination."""

    rows_read: int = 0
    rows_written: int = 0
    rows_upserted: int = 0
    rows_deleted: int = 0
    errors: int = 0
    errors_by_kind: dict[str, int] = field(default_factory=dict)
    lag_snapshots: int = 0
    last_snapshot: int | None = None
    last_error: str | None = None
    waiting: bool = False  # stopped retrying: waits for the operator (terminal, or unknown too often)


@dataclass(slots=True)
class FanoutMetrics:
    """Counters of one fan-out instance."""

    destinations: dict[str, DestinationMetrics] = field(default_factory=dict)
    unrouted_rows: int = 0
    cancelled_rows: int = 0
    pool_evictions: int = 0
    pool_open: int = 0
    change_reads: int = 0
    cycles: int = 0
    errors: int = 0
    cycle_errors_by_kind: dict[str, int] = field(default_factory=dict)
    source_snapshot: int | None = None
    split_seconds: float = 0.0  # Arrow time spent resolving and splitting change reads
    lake_commits: int = 0
    lake_commit_seconds: float = 0.0  # time in destination transactions that committed

    def destination(self, destination_id: str) -> DestinationMetrics:
        """The counters of a destination, created on first use."""
        found = self.destinations.get(destination_id)
        if found is None:
            found = self.destinations[destination_id] = DestinationMetrics()
        return found

    def destination_failed(self, destination_id: str, kind: str, message: str, waiting: bool) -> None:
        """Count one failed attempt of a destination, by kind (transient, terminal, unknown)."""
        m = self.destination(destination_id)
        m.errors += 1
        m.errors_by_kind[kind] = m.errors_by_kind.get(kind, 0) + 1
        m.last_error = message
        m.waiting = waiting
        self.errors += 1

    def cycle_failed(self, kind: str) -> None:
        """Count a cycle that failed as a whole (source lake or cursor store)."""
        self.cycle_errors_by_kind[kind] = self.cycle_errors_by_kind.get(kind, 0) + 1

    def lake_committed(self, seconds: float) -> None:
        """Count one destination transaction that committed, and its duration."""
        self.lake_commits += 1
        self.lake_commit_seconds += seconds

    def as_dict(self) -> dict[str, Any]:
        """JSON-able snapshot of every counter."""
        return asdict(self)


def fanout_registry(metrics: FanoutMetrics, pipeline: str, instance_id: str) -> CollectorRegistry:
    """A registry holding only this instance's ``headrace_fanout_*`` metrics."""
    registry = CollectorRegistry()
    registry.register(FanoutCollector(metrics, pipeline, instance_id))
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    """The registry in Prometheus text format."""
    return generate_latest(registry)


# name -> (help, attribute of DestinationMetrics)
_DESTINATION_COUNTERS = {
    "headrace_fanout_rows_read": ("Change rows read for the destination", "rows_read"),
    "headrace_fanout_rows_upserted": ("Rows inserted into the destination (new or replacing a key)",
                                      "rows_upserted"),
    "headrace_fanout_rows_deleted": ("Rows deleted from the destination", "rows_deleted"),
}
# name -> (help, attribute of FanoutMetrics)
_INSTANCE_COUNTERS = {
    "headrace_fanout_unrouted_rows": ("Change rows whose routing value is NULL or has no destination",
                                      "unrouted_rows"),
    "headrace_fanout_cancelled_rows": ("Rows inserted and deleted inside one read (written nowhere)",
                                       "cancelled_rows"),
    "headrace_fanout_pool_evictions": ("Destination lakes detached to make room (pool.max_open)", "pool_evictions"),
    "headrace_fanout_change_reads": ("Change reads of the source table (one per cursor group)", "change_reads"),
    "headrace_fanout_cycles": ("Passes over this instance's destinations", "cycles"),
    "headrace_fanout_split_seconds": ("Time spent resolving and splitting change reads", "split_seconds"),
    "headrace_fanout_lake_commits": ("Destination transactions committed", "lake_commits"),
    "headrace_fanout_lake_commit_seconds": ("Time in destination transactions that committed",
                                            "lake_commit_seconds"),
}


class FanoutCollector(Collector):
    """The counters of one ``FanoutMetrics``, read when Prometheus scrapes."""

    def __init__(self, metrics: FanoutMetrics, pipeline: str, instance_id: str) -> None:
        self.metrics = metrics
        self.labels = [pipeline, instance_id]

    def describe(self) -> list[Metric]:
        return []  # collected live; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        # A copy: the run loop adds destinations while a scrape reads them.
        destinations = sorted(dict(m.destinations).items())
        info = GaugeMetricFamily("headrace_fanout_info", "The pipeline and instance these metrics come from",
                                 labels=["pipeline", "instance_id"])
        info.add_metric(self.labels, 1.0)
        yield info
        source = GaugeMetricFamily("headrace_fanout_source_snapshot", "The source lake's latest snapshot id")
        if m.source_snapshot is not None:
            source.add_metric([], float(m.source_snapshot))
        yield source
        pool = GaugeMetricFamily("headrace_fanout_pool_open_lakes", "Destination lakes attached now")
        pool.add_metric([], float(m.pool_open))
        yield pool
        for name, (text, attr) in _INSTANCE_COUNTERS.items():
            yield CounterMetricFamily(name, text, value=float(getattr(m, attr)))
        cycle_errors = CounterMetricFamily("headrace_fanout_cycle_errors",
                                           "Cycles that failed as a whole (source lake, cursor store), by kind",
                                           labels=["kind"])
        for kind in KINDS:
            cycle_errors.add_metric([kind], float(m.cycle_errors_by_kind.get(kind, 0)))
        yield cycle_errors
        yield from _per_destination(destinations)


def _per_destination(destinations: list[tuple[str, DestinationMetrics]]) -> Iterator[Metric]:
    counters = {name: CounterMetricFamily(name, text, labels=["destination"])
                for name, (text, _) in _DESTINATION_COUNTERS.items()}
    errors = CounterMetricFamily("headrace_fanout_errors", "Failed attempts of a destination, by kind"
                                 " (transient, terminal, unknown)", labels=["destination", "kind"])
    lag = GaugeMetricFamily("headrace_fanout_lag_snapshots", "Source snapshots the destination is behind",
                            labels=["destination"])
    at = GaugeMetricFamily("headrace_fanout_destination_snapshot", "Source snapshot the destination holds",
                           labels=["destination"])
    waiting = GaugeMetricFamily("headrace_fanout_destination_waiting",
                                "1 while the destination waits for the operator (see its last error's fix)",
                                labels=["destination"])
    for dest, d in destinations:
        for name, (_, attr) in _DESTINATION_COUNTERS.items():
            counters[name].add_metric([dest], float(getattr(d, attr)))
        for kind in KINDS:
            errors.add_metric([dest, kind], float(d.errors_by_kind.get(kind, 0)))
        lag.add_metric([dest], float(d.lag_snapshots))
        if d.last_snapshot is not None:
            at.add_metric([dest], float(d.last_snapshot))
        waiting.add_metric([dest], 1.0 if d.waiting else 0.0)
    yield from counters.values()
    yield from (errors, lag, at, waiting)
