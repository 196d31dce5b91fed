"""Liveness and readiness, each with a body that says why."""

from __future__ import annotations

import time
from typing import Any

from headrace.control.status import copy_blocks_sentence
from headrace.run.view import RunView
from headrace.state.lifecycle import RETRY_BUDGET, TableState
from headrace.state.store import StateStore

STARTED = time.time()


def liveness(pipeline: RunView) -> tuple[bool, dict[str, Any]]:
    """The process is up and serving; says whether capture is alive too."""
    capture = pipeline.capture_status()
    return True, {
        "status": "alive",
        "pipeline": pipeline.config.name,
        "uptime_seconds": round(time.time() - STARTED, 1),
        "capture_connected": bool(capture and capture.connected),
    }


def readiness(pipeline: RunView) -> tuple[bool, dict[str, Any]]:
    """Ready when every server answers, capture is connected and no table waits for the operator."""
    reasons = pipeline.outage_reasons()  # a server that went away: the run waits for it
    capture = pipeline.capture_status()
    if capture is None or not capture.connected:
        why = f": {capture.last_error}" if capture and capture.last_error else ""
        reasons.append(f"capture is not connected to slot {pipeline.config.slot_name}{why}")
    if capture is not None and capture.storage_error:
        reasons.append(capture.storage_error)
    failed: list[dict[str, Any]] = []
    try:
        state = StateStore(pipeline.state_dsn, pipeline.config.name)
        try:
            rows = state.tables()
        finally:
            state.close()
    except Exception as exc:
        reasons.append(f"cannot read the state tables: {str(exc).strip()}")
        rows = []
    for row in rows:
        # A table waiting for the operator (terminal error, or an unknown one past its retries) fails
        # readiness at once; a transient one only once it has failed RETRY_BUDGET times in a row.
        if row.waits_for_operator or (row.state is TableState.ERRORED and row.error_count >= RETRY_BUDGET):
            failed.append({"table": row.qualified_name, "error_count": row.error_count, "error": row.error,
                           "kind": row.error_kind, "fix": row.error_fix, "retrying": not row.waits_for_operator})
            if row.waits_for_operator:
                reasons.append(f"table {row.qualified_name} waits for the operator ({row.error_kind or 'terminal'}"
                               f" error): {row.error}; fix: {row.error_fix or 'see the error'}")
            else:
                reasons.append(f"table {row.qualified_name} failed {row.error_count} times ({row.error_kind}"
                               f" error, retrying): {row.error}")
    for waiter in pipeline.copy_lock_waiters():
        reasons.append(copy_blocks_sentence(waiter.as_dict(), pipeline.config.snapshot.give_way_after_seconds))
    wal = pipeline.slot_wal()
    if wal is not None and (wal.lost or wal.over_limit):
        reasons.append(wal.as_dict().get("wal_warning") or "")  # the source's own warning text
    ready = not reasons
    return ready, {
        "ready": ready,
        "reasons": reasons,
        "capture_connected": bool(capture and capture.connected),
        "tables_over_retry_budget": failed,
        "retry_budget": RETRY_BUDGET,
        "wal": wal.as_dict() | {"retained_wal_bytes": wal.retained_bytes} if wal is not None else None,
    }
