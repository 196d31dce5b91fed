"""The pipeline's metrics read at scrape time (``LiveCollector``): positions, backlogs, states, the
WAL guard's figures, and what maintenance and ``verify`` last recorded per table; never stale, and
never counted per scrape where counting would read a table's metadata."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from headrace.state.lifecycle import TableState

log = logging.getLogger("headrace.control")

OPS = {"I": "insert", "U": "update", "D": "delete", "T": "truncate"}


def wal_gauges(wal: dict[str, Any] | None, limit: int) -> Iterator[Metric]:
    """The WAL guard's figures: the warning threshold, the slot's WAL state, its remaining safe WAL."""
    threshold = GaugeMetricFamily("headrace_slot_max_retained_wal_bytes",
                                  "source.max_retained_wal: retained WAL above this is warned about")
    threshold.add_metric([], float(limit))
    lost = GaugeMetricFamily("headrace_slot_wal_lost", "1 when PostgreSQL invalidated the slot (wal_status lost)")
    safe = GaugeMetricFamily("headrace_slot_safe_wal_bytes",
                             "WAL the source may still write before it invalidates the slot (max_slot_wal_keep_size)")
    if wal is not None:
        lost.add_metric([], 1.0 if wal["wal_status"] == "lost" else 0.0)
        if wal["safe_wal_bytes"] is not None:
            safe.add_metric([], float(wal["safe_wal_bytes"]))
    yield from (threshold, lost, safe)


MAINTENANCE_GAUGES = {
    "data_files": ("headrace_target_data_files", "Data files of the target table (at the last count)"),
    "delete_files": ("headrace_target_delete_files", "Delete files of the target table (at the last count)"),
    "snapshots": ("headrace_target_snapshots", "Snapshots of the target table (DuckLake: of the lake)"),
    "bytes": ("headrace_target_bytes", "Bytes of the target table's data and delete files"),
}


def maintenance_gauges(tables: list[dict[str, Any]]) -> Iterator[Metric]:
    """File counts and the last maintenance pass per table, from ``_headrace.maintenance``: counted
    when maintenance runs, never per scrape (counting reads the table's metadata)."""
    fams = {k: GaugeMetricFamily(n, text, labels=["table"]) for k, (n, text) in MAINTENANCE_GAUGES.items()}
    last = GaugeMetricFamily("headrace_maintenance_last_run_timestamp_seconds",
                             "Unix time the table's last maintenance pass finished", labels=["table"])
    for t in tables:
        m = t.get("maintenance") or {}
        for key, fam in fams.items():
            if m.get(key) is not None:
                fam.add_metric([t["table"]], float(m[key]))
        if m.get("last_run_at"):
            last.add_metric([t["table"]], datetime.fromisoformat(m["last_run_at"]).timestamp())
    yield from fams.values()
    yield last


def verify_gauges(tables: list[dict[str, Any]]) -> Iterator[Metric]:
    """The last ``headrace verify`` of each table, from ``_headrace.verify_results``."""
    differences = GaugeMetricFamily("headrace_verify_differences",
                                    "Differing keys the table's last verify found", labels=["table"])
    equal = GaugeMetricFamily("headrace_verify_equal", "1 when the table's last verify found source and target"
                              " equal, 0 when not (or it could not compare)", labels=["table"])
    last = GaugeMetricFamily("headrace_verify_last_run_timestamp_seconds",
                             "Unix time of the table's last verify", labels=["table"])
    for t in tables:
        v = t.get("verify")
        if not v:
            continue
        differences.add_metric([t["table"]], float(v["differences"]))
        equal.add_metric([t["table"]], 1.0 if v["status"] == "equal" else 0.0)
        if v.get("checked_at"):
            last.add_metric([t["table"]], datetime.fromisoformat(v["checked_at"]).timestamp())
    yield differences
    yield equal
    yield last


class LiveSource(Protocol):
    """What the collector reads: the run (``pipeline``) and its status (``control.metrics.PipelineMetrics``)."""

    pipeline: Any

    def live_status(self) -> dict[str, Any]:
        """The pipeline's status as the status page shows it."""


class LiveCollector(Collector):
    """Positions, backlogs and states, read from the source and the state tables at scrape time."""

    def __init__(self, metrics: LiveSource) -> None:
        self.metrics = metrics

    def describe(self) -> list[Metric]:
        return []  # collected live; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        p = self.metrics.pipeline
        capture = p.capture_status()
        up = GaugeMetricFamily("headrace_source_up", "1 when the source and state tables answered the scrape")
        connected = GaugeMetricFamily("headrace_capture_connected", "1 while capture streams from the slot")
        connected.add_metric([], 1.0 if capture and capture.connected else 0.0)
        paused = GaugeMetricFamily("headrace_pipeline_paused", "1 while the operator has paused the pipeline")
        paused.add_metric([], 1.0 if p.paused else 0.0)
        in_flight = GaugeMetricFamily("headrace_apply_batches_in_flight",
                                      "Apply batches running now (at most apply.concurrency)")
        in_flight.add_metric([], float(p.batches_in_flight))
        waiting = GaugeMetricFamily("headrace_copy_lock_wait_seconds", "Seconds a source session (pid) has waited"
                                    " for a lock the initial copy of the table holds (a DDL, most often)",
                                    labels=["table", "pid"])
        for waiter in p.copy_lock_waiters():
            waiting.add_metric([waiter.table, str(waiter.pid)], waiter.waiting_seconds)
        yield connected
        yield paused
        yield in_flight
        yield waiting
        try:
            status = self.metrics.live_status()
        except Exception as exc:
            # Once per scrape would be once per retry: the outage itself is logged by the run.
            level = logging.DEBUG if p.outage_reasons() else logging.WARNING
            log.log(level, "metrics: cannot read the source or state: %s", exc)
            up.add_metric([], 0.0)
            yield up
            return
        # The run's own probes know of an outage the scrape's fresh connections may not meet (a
        # state or DuckLake catalog server down while the source answers).
        up.add_metric([], 1.0 if p.server_up("source") else 0.0)
        yield up
        names = {t["oid"]: t["table"] for t in status["tables"]}
        captured = CounterMetricFamily("headrace_changes_captured", "Changes staged by capture",
                                       labels=["table", "op"])
        for (oid, op), n in sorted(dict(capture.changes_captured).items() if capture else []):
            captured.add_metric([names.get(oid, str(oid)), OPS.get(op, op)], float(n))
        yield captured
        slot = status.get("slot") or {}
        for name, text, value in [
            ("headrace_capture_lag_bytes", "Source current WAL LSN minus the slot's confirmed flush LSN",
             slot.get("capture_lag_bytes")),
            ("headrace_slot_retained_wal_bytes", "WAL the slot holds on the source (current minus restart LSN)",
             slot.get("retained_wal_bytes")),
        ]:
            g = GaugeMetricFamily(name, text)
            if value is not None:
                g.add_metric([], float(value))
            yield g
        yield from wal_gauges(status.get("wal"), p.config.source.max_retained_wal)
        per_table = {
            "headrace_table_state": ("Table lifecycle state (1 for the current one)", ["table", "state"]),
            "headrace_staged_changes_pending": ("Staged changes not yet applied", ["table"]),
            "headrace_rows_copied": ("Rows written by the table's last initial copy", ["table"]),
            "headrace_apply_lag_bytes": ("Source current WAL LSN minus the table's applied position", ["table"]),
            "headrace_apply_lag_seconds": ("Now minus the source commit time of the last applied change"
                                           " (0 when nothing waits)", ["table"]),
        }
        fams = {n: GaugeMetricFamily(n, text, labels=labels) for n, (text, labels) in per_table.items()}
        for t in status["tables"]:
            name = t["table"]
            for s in TableState:
                fams["headrace_table_state"].add_metric([name, s.value], 1.0 if t["state"] == s.value else 0.0)
            fams["headrace_staged_changes_pending"].add_metric([name], float(t["pending_changes"]))
            fams["headrace_rows_copied"].add_metric([name], float(t["rows_copied"]))
            if t["lag_bytes"] is not None:
                fams["headrace_apply_lag_bytes"].add_metric([name], float(t["lag_bytes"]))
            if t["lag_seconds"] is not None:
                fams["headrace_apply_lag_seconds"].add_metric([name], float(t["lag_seconds"]))
        yield from fams.values()
        yield from maintenance_gauges(status["tables"])
        yield from verify_gauges(status["tables"])
