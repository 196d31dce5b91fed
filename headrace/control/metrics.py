"""Prometheus metrics of a running pipeline, in its own registry (one per ``Pipeline``).

Event counts (changes applied, errors, DDL, batch durations) are counted as they happen, by hooks
the run loop calls. Positions and backlogs (capture lag, slot retention, per-table lag, state,
staged-but-unapplied changes) are read from the source and the state tables at scrape time, so
they are never stale. A small ring of samples of the applied counters gives the status page its
throughput over the last minutes, and a ring of each table's lag over the last hour.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from headrace.control.live_metrics import OPS, LiveCollector
from headrace.control.status import pipeline_status
from headrace.log.index import LogEntry
from headrace.materialize.apply import Applied
from headrace.run.view import RunView
from headrace.state.lifecycle import TableState
from headrace.state.store import StateStore, TableRow

if TYPE_CHECKING:
    import pyarrow.fs as pafs

log = logging.getLogger("headrace.control")

# Schema changes and table events, as counted in metrics and recorded in _headrace.ddl_events.
DDL_KINDS = ("add_column", "drop_column", "rename_column", "alter_column_type", "rename_table", "truncate",
             "create_table", "drop_table", "recreate_table")
SAMPLE_SECONDS = 5.0
SAMPLES_KEPT = 120  # ten minutes at one sample per 5 s
# Each table's lag, for the status page's last-hour chart: read with the status (source and state
# queries), so less often than the counters.
LAG_SAMPLE_SECONDS = 30.0
LAG_WINDOW_SECONDS = 3600.0


class PipelineMetrics:
    """Counters the run loop feeds, plus the live view read at scrape time.

    A ``run.observer.RunObserver``: attach it to the run's ``observers``.
    """

    def __init__(self, pipeline: RunView) -> None:
        self.pipeline = pipeline
        self.registry = CollectorRegistry()
        r = self.registry
        self.applied = Counter("headrace_changes_applied", "Staged changes applied to the target",
                               ["table", "op"], registry=r)
        self.batch_seconds = Histogram(
            "headrace_apply_batch_duration_seconds", "Time to apply one batch to the target", ["table"],
            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300), registry=r)
        self.batches = Counter("headrace_apply_batches", "Apply batches by the lane that built them (read,"
                               " deduplicated, cast) and the lane that committed them, each with its reason"
                               " (materialize/lanes.py): spark (Spark jobs) or driver (DuckDB, pyarrow)",
                               ["table", "build_lane", "build_reason", "apply_lane", "apply_reason"], registry=r)
        self.last_lanes: dict[str, dict[str, str]] = {}  # table -> its last batch's lanes, for status
        self.errors = Counter("headrace_errors", "Table failures, by kind (transient, terminal, unknown)",
                              ["table", "kind"], registry=r)
        self.ddl = Counter("headrace_ddl_events", "Schema changes applied to target tables, by kind",
                           ["kind"], registry=r)
        for kind in DDL_KINDS:
            self.ddl.labels(kind)
        self.changed_values = Counter(
            "headrace_values_changed", "Source values stored changed under the values policy (values.infinity:"
            " clamp), by column and reason", ["table", "column", "reason"], registry=r)
        self.cuts = Counter(
            "headrace_cuts", "Consistent cuts applied (apply.consistency: transaction), by how they became visible:"
            " one commit (DuckLake; an Iceberg REST catalog's multi-table commit) or table by table (Iceberg: read"
            " through _headrace.cuts)", ["commit"], registry=r)
        # table -> "column reason" -> count since start, for status (Prometheus counters are write-only)
        self.changed_by_table: dict[str, dict[str, int]] = {}
        self.last_commit: dict[str, datetime] = {}  # table -> source commit time of last applied change
        self.samples: deque[tuple[float, dict[str, float]]] = deque(maxlen=SAMPLES_KEPT)
        # (time, table -> lag seconds, None while the table does not apply changes), oldest first
        self.lag_samples: deque[tuple[float, dict[str, float | None]]] = deque(
            maxlen=int(LAG_WINDOW_SECONDS / LAG_SAMPLE_SECONDS) + 1)
        self._lock = threading.Lock()
        r.register(LiveCollector(self))

    # -- RunObserver (called from the run loop) ---------------------------------------------------------
    def batch_applied(self, state: StateStore, row: TableRow, applied: Applied) -> None:
        """Count one applied batch by operation, note its last commit time and any schema change."""
        try:
            entries = state.log_index.entries_through(row.oid, applied.log_offset, applied.entries)
            ops, last_ts = _count_ops(entries, row.snapshot_lsn)
            if not ops and applied.rows_in:
                ops = {"unknown": applied.rows_in}  # staged files not readable from the driver
            for op, n in ops.items():
                self.applied.labels(row.qualified_name, op).inc(n)
            self.batch_seconds.labels(row.qualified_name).observe(applied.seconds)
            build, apply = applied.build, applied.apply
            self.batches.labels(row.qualified_name, build.lane.value, build.reason, apply.lane.value,
                                apply.reason).inc()
            self.last_lanes[row.qualified_name] = applied.lanes
            if last_ts is not None:
                prev = self.last_commit.get(row.qualified_name)
                self.last_commit[row.qualified_name] = max(prev, last_ts) if prev else last_ts
            for kind in applied.ddl:
                self.ddl.labels(kind).inc()
            self.values_changed(row.qualified_name, applied.values_changed)
        except Exception as exc:  # metrics must never stop replication
            log.debug("metrics: batch hook failed", exc_info=exc)

    def values_changed(self, table: str, counts: dict[tuple[str, str], int]) -> None:
        """Count values the casts changed under the values policy (the copy's and the stream's)."""
        for (column, reason), n in counts.items():
            self.changed_values.labels(table, column, reason).inc(n)
            per_table = self.changed_by_table.setdefault(table, {})
            per_table[f"{column} {reason}"] = per_table.get(f"{column} {reason}", 0) + n

    def ddl_applied(self, kind: str) -> None:
        """Count one schema change or table event (a ``DDL_KINDS`` member) applied to the target."""
        self.ddl.labels(kind).inc()

    def table_failed(self, table: str, kind: str) -> None:
        self.errors.labels(table, kind).inc()

    def cut_committed(self, whole: bool) -> None:
        """Count one consistent cut by how it became visible."""
        self.cuts.labels("one commit" if whole else "table by table").inc()

    # -- reading -------------------------------------------------------------------------------
    def exposition(self) -> bytes:
        """The registry in Prometheus text format."""
        return generate_latest(self.registry)

    def applied_totals(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for metric in self.applied.collect():
            for s in metric.samples:
                if s.name.endswith("_total"):
                    totals[s.labels["table"]] = totals.get(s.labels["table"], 0.0) + s.value
        return totals

    def sample(self) -> None:
        """Record the applied counters now (the status page's throughput comes from these)."""
        with self._lock:
            self.samples.append((time.time(), self.applied_totals()))

    def throughput(self, table: str, window: float = 60.0) -> float | None:
        """Changes applied per second to ``table`` over the last ``window`` seconds."""
        with self._lock:
            samples = list(self.samples)
        if not samples:
            return None
        now, latest = time.time(), self.applied_totals()
        older = [s for s in samples if now - s[0] >= window * 0.9] or samples[:1]
        then, totals = older[-1]
        return (latest.get(table, 0.0) - totals.get(table, 0.0)) / max(now - then, 1.0)

    def history(self, table: str) -> list[float]:
        """Changes/s to ``table`` between consecutive samples, oldest first."""
        with self._lock:
            samples = list(self.samples)
        out = []
        for (t0, a), (t1, b) in zip(samples, samples[1:], strict=False):
            out.append(max(0.0, b.get(table, 0.0) - a.get(table, 0.0)) / max(t1 - t0, 1e-3))
        return out

    def sample_lag(self) -> None:
        """Record every table's lag now (the status page's last-hour chart); never raises: while a
        server is down there is no sample, and the chart shows the gap."""
        try:
            tables = self.live_status()["tables"]
        except Exception as exc:  # an outage: the run reports it; the chart just has no point here
            log.debug("metrics: lag sample failed", exc_info=exc)
            return
        lags = {t["table"]: t["lag_seconds"] for t in tables}
        with self._lock:
            self.lag_samples.append((time.time(), lags))

    def lag_history(self, window: float = LAG_WINDOW_SECONDS) -> list[tuple[float, dict[str, float | None]]]:
        """The lag samples of the last ``window`` seconds, oldest first."""
        since = time.time() - window
        with self._lock:
            return [s for s in self.lag_samples if s[0] >= since]

    def lag_seconds(self, table: str, pending: int, applies: bool) -> float | None:
        """Now minus the commit time of the last applied change; 0 when nothing waits for the table."""
        if not applies:
            return None
        if pending == 0:
            return 0.0
        last = self.last_commit.get(table)
        return max(0.0, (datetime.now(timezone.utc) - last).total_seconds()) if last else None

    def live_status(self) -> dict[str, Any]:
        """``pipeline_status`` plus what only the running process knows (lag seconds, throughput)."""
        p = self.pipeline
        status = pipeline_status(p.config)
        capture = p.capture_status()
        status["paused"] = p.paused
        status["capture"] = {
            "connected": bool(capture and capture.connected),
            "last_error": capture.last_error if capture else None,
        }
        for t in status["tables"]:
            applies = TableState(t["state"]).applies_changes
            t["lag_seconds"] = self.lag_seconds(t["table"], t["pending_changes"], applies)
            rate = self.throughput(t["table"])
            t["changes_per_s"] = round(rate, 3) if rate is not None else None
            t["values_changed"] = dict(self.changed_by_table.get(t["table"], {}))
            t["lanes"] = self.last_lanes.get(t["table"]) or t.get("lanes")  # this process's last, else state's
        return status


def _count_ops(entries: list[LogEntry], snapshot_lsn: int | None) -> tuple[dict[str, int], datetime | None]:
    """Changes per operation in staged files (those after the copy position) and the latest commit time.

    A file registered with its facts, wholly after the copy position, is counted from the facts and
    its latest commit time from the facts too (files registered before they held it: the Parquet
    footer's statistics, a request per file on an object store): re-reading every applied file's columns
    was about 5% of the driver's busy samples while draining a backlog (py-spy). Others are read as
    before.
    """
    ops: dict[str, int] = {}
    last: datetime | None = None
    for entry in entries:
        facts = entry.facts
        latest: tuple[datetime | None] | None = None  # the file's latest commit time, when known without its rows
        if facts is not None and (snapshot_lsn is None or entry.min_lsn > snapshot_lsn):
            latest = (_footer_last_ts(entry.path) if facts.last_commit_us is None
                      else (datetime.fromtimestamp(facts.last_commit_us / 1e6, timezone.utc),))
        if facts is not None and latest is not None:
            for op, n in (("I", facts.inserts), ("U", facts.updates), ("D", facts.deletes), ("T", facts.truncates)):
                if n:
                    ops[OPS[op]] = ops.get(OPS[op], 0) + n
            ts: datetime | None = latest[0]
        else:
            read = _read_ops(entry.path, snapshot_lsn)
            if read is None:
                return {}, None
            for op, n in read[0].items():
                ops[op] = ops.get(op, 0) + n
            ts = read[1]
        if ts is not None:
            ts = ts if ts.tzinfo else ts.replace(tzinfo=timezone.utc)
            last = max(last, ts) if last else ts
    return ops, last


def _on_filesystem(path: str) -> tuple[str, pafs.FileSystem | None]:
    """A staged file's path and filesystem: an ``s3://`` one on the configured store (left to pyarrow,
    the URI would get a client of AWS's defaults, waiting out timeouts against the wrong endpoint)."""
    if "://" not in path:
        return path, None
    from headrace import storage

    filesystem, where = storage.filesystem(path)
    return where, filesystem


def _footer_last_ts(path: str) -> tuple[datetime | None] | None:
    """The latest ``_ts`` of a staged file from its footer's statistics; None when they are missing."""
    import pyarrow.parquet as pq

    try:
        where, filesystem = _on_filesystem(path)
        meta = pq.read_metadata(where, filesystem=filesystem)
        column = meta.schema.names.index("_ts")
        last: datetime | None = None
        for i in range(meta.num_row_groups):
            stats = meta.row_group(i).column(column).statistics
            if stats is None or not stats.has_min_max:
                return None
            value = stats.max
            if not isinstance(value, datetime):
                return None
            last = max(last, value) if last else value
        return (last,)
    except Exception:
        return None


def _read_ops(path: str, snapshot_lsn: int | None) -> tuple[dict[str, int], datetime | None] | None:
    """Changes per operation in one staged file and its latest commit time, read from its columns."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        where, filesystem = _on_filesystem(path)
        t = pq.read_table(where, columns=["_op", "_lsn", "_seq", "_ts"], filesystem=filesystem)
    except Exception:
        return None
    if snapshot_lsn is not None:
        lsn = t.column("_lsn")
        after = pc.or_(pc.greater(lsn, snapshot_lsn),
                       pc.and_(pc.equal(lsn, snapshot_lsn), pc.greater(t.column("_seq"), 0)))
        t = t.filter(after)
    if not t.num_rows:
        return {}, None
    ops: dict[str, int] = {}
    for item in pc.value_counts(t.column("_op")).to_pylist():
        op = OPS.get(item["values"], str(item["values"]))
        ops[op] = ops.get(op, 0) + int(item["counts"])
    return ops, pc.max(t.column("_ts")).as_py()


class MeteredRun(RunView, Protocol):
    """A run with these metrics attached: what the API and the status page serve."""

    metrics: PipelineMetrics
