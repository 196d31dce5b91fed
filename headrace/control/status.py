"""Pipeline status, read from the state tables and the slot: what `headrace status` prints."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

from headrace.config import PipelineConfig
from headrace.core.names import TableName
from headrace.core.position import format_lsn
from headrace.core.schema import TableSchema
from headrace.source import open_source, source_kind
from headrace.state.progress import ProgressStore
from headrace.state.store import StateStore


def target_name(config: PipelineConfig, schema: TableSchema) -> str:
    """The table's name in the target, as the target's SQL spells it (the target's plugin says how)."""
    return config.target.table_name(config.name, TableName(schema.target_schema, schema.target_table))


def target_name_mapped(config: PipelineConfig, schema: TableSchema) -> bool:
    """Whether the target holds the table under a mapped name (see ``target_name``)."""
    target = config.target
    return target.plugin.name_mapped(target.settings, TableName(schema.target_schema, schema.target_table))


# The source's WAL position: written on a primary, replayed on a hot standby.
_WAL = "(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END)"


def pipeline_status(config: PipelineConfig) -> dict[str, Any]:
    """One JSON-able object: the pipeline, its slot, and every table with state and lag."""
    dsn = config.source.resolved_dsn()
    postgres = source_kind(dsn) == "postgresql"
    fmt: Callable[[int], str] = format_lsn
    if postgres:
        with psycopg.connect(dsn, autocommit=True) as conn:
            current = conn.execute(f"SELECT {_WAL} - '0/0'::pg_lsn").fetchone()[0]  # type: ignore[index]
            waiters = open_source(config, dsn).copy_lock_waiters(conn)
            slot = conn.execute(
                f"SELECT confirmed_flush_lsn::text, ({_WAL} - restart_lsn)::bigint, active,"
                f" ({_WAL} - confirmed_flush_lsn)::bigint FROM pg_replication_slots WHERE slot_name = %s",
                (config.slot_name,),
            ).fetchone()
    else:  # no slot: the source's log position now, in its own text form
        source = open_source(config, dsn)
        fmt = source.format_position
        with source.connect() as conn:
            current, slot = source.current_position(conn), None
            waiters = source.copy_lock_waiters(conn)
    state = StateStore(config.source.resolved_state_dsn(), config.name)
    try:
        if not state.installed() or state.meta() is None:
            return {"pipeline": config.name, "slot": None, "tables": [], "note": "not started yet: run `headrace run`"}
        captured = state.captured_lsn()
        pending = state.log_index.pending_changes()
        progress = _copy_progress(config.source.state_dsn or dsn, config.name)
        maintained = _maintenance(config.source.state_dsn or dsn, config.name)
        verified = _verify_results(config.source.state_dsn or dsn, config.name)
        tables = []
        for row in state.tables():
            caught_up = pending.get(row.oid, 0) == 0 and row.state.applies_changes
            applied_through = captured if caught_up else (row.applied_lsn or row.snapshot_lsn or 0)
            tables.append({
                "table": row.qualified_name,
                "target_table": target_name(config, row.schema),
                "target_name_mapped": target_name_mapped(config, row.schema),
                "oid": row.oid,
                "state": row.state.value,
                "snapshot_lsn": fmt(row.snapshot_lsn) if row.snapshot_lsn is not None else None,
                "applied_lsn": fmt(row.applied_lsn) if row.applied_lsn is not None else None,
                "lag_bytes": max(0, int(current) - applied_through) if row.state.applies_changes else None,
                "pending_changes": pending.get(row.oid, 0),
                "rows_copied": row.rows_copied,
                "rows_applied": row.rows_applied,
                "error": row.error,
                "error_kind": row.error_kind if row.error else None,  # transient, terminal or unknown
                "error_fix": row.error_fix if row.error else None,  # what the operator runs or changes
                "waits_for_operator": row.waits_for_operator,  # ERRORED with no retry planned
                "error_count": row.error_count,
                "retry_at": row.retry_at.isoformat() if row.retry_at else None,
                "snapshot": progress.get(row.oid),
                "maintenance": maintained.get(row.oid),  # files, snapshots, bytes; last pass
                # The last batch's lanes (build, apply) and why, as last recorded when they changed.
                "lanes": row.lanes,
                "verify": verified.get(row.oid),  # the last `headrace verify` of the table
            })
        return {
            "pipeline": config.name,
            "slot": {
                "name": config.slot_name,
                "confirmed_flush_lsn": slot[0] if slot else None,
                "retained_wal_bytes": int(slot[1]) if slot and slot[1] is not None else None,
                "active": bool(slot[2]) if slot else False,
                "capture_lag_bytes": max(0, int(slot[3])) if slot and slot[3] is not None else None,
            },
            "captured_lsn": fmt(captured),
            "wal": _slot_wal(config, dsn) if postgres else None,
            "current_wal_lsn": fmt(int(current)),
            "tables": tables,
            # Source sessions waiting for a lock the initial copy holds (a DDL, and the writes behind it).
            "copy_lock_waiters": [w.as_dict() for w in waiters],
            "copy_gives_way_after_seconds": config.snapshot.give_way_after_seconds,
            "refused_tables": [{"table": r["table"], "oid": int(r["oid"]), "reason": r["reason"],
                                "seen_at": r["seen_at"].isoformat()} for r in state.refused_tables()],
            "ddl": {
                "counts": state.ddl_counts(),
                "recent": [{"table": e["table_name"], "kind": e["kind"], "detail": e["detail"],
                            "lsn": fmt(e["lsn"]) if e["lsn"] is not None else None,
                            "applied_at": e["applied_at"].isoformat()} for e in state.recent_ddl(10)],
            },
        }
    finally:
        state.close()


def _slot_wal(config: PipelineConfig, dsn: str) -> dict[str, Any] | None:
    """WAL the slot keeps against ``source.max_retained_wal`` (None when there is no slot)."""
    from headrace.source.postgres.wal_guard import read_slot_wal

    with psycopg.connect(dsn, autocommit=True) as conn:
        wal = read_slot_wal(conn, config.slot_name, config.source.max_retained_wal)
    return wal.as_dict() if wal else None


def _copy_progress(dsn: str, pipeline: str) -> dict[int, dict[str, int]]:
    """Chunks and rows copied per table, from the initial copies' progress rows."""
    store = ProgressStore(dsn, pipeline)
    try:
        return {oid: {"chunks_total": p.chunks_total, "chunks_done": p.chunks_done, "rows": p.rows}
                for oid, p in store.progress().items()}
    finally:
        store.close()


def _maintenance(dsn: str, pipeline: str) -> dict[int, dict[str, Any]]:
    """Last maintenance pass and file counts per table (``headrace.maintenance``)."""
    from headrace.state.maintenance import MaintenanceStore

    with MaintenanceStore(dsn, pipeline) as store:
        return store.all()


def _verify_results(dsn: str, pipeline: str) -> dict[int, dict[str, Any]]:
    """The last ``headrace verify`` result per table (``headrace.verify``)."""
    from headrace.state.verify import VerifyStore

    with VerifyStore(dsn, pipeline) as store:
        return store.all()


def _verify_line(v: dict[str, Any]) -> str:
    what = {"equal": "equal", "different": f"{v['differences']} differences",
            "unsettled": f"{v['unsettled']} rows kept changing", "error": f"could not compare: {v['error']}"}
    return f"  verified {v['checked_at']}: {what.get(v['status'], v['status'])}"


def _maintenance_line(m: dict[str, Any]) -> str:
    error = f"  last pass failed: {m['last_error']}" if m.get("last_error") else ""
    return (f"  files: data={m['data_files']} delete={m['delete_files']} snapshots={m['snapshots']} "
            f"bytes={m['bytes']}  maintained={m['last_run_at'] or 'never'}{error}")


def copy_blocks_sentence(waiter: dict[str, Any], give_way_after: float | None) -> str:
    """One sentence on a source session waiting for a lock the initial copy holds."""
    then = ("the copy gives way after snapshot.give_way_after_seconds" if give_way_after is not None
            else "the copy keeps its lock until the read ends (snapshot.give_way_after_seconds is null)")
    return (f"the initial copy of {waiter['table']} holds a lock that session {waiter['pid']} has waited"
            f" {waiter['waiting_seconds']} s for ({waiter['statement']}); writes to the table queue behind it;"
            f" {then}")


def format_status(status: dict[str, Any]) -> str:
    """The status object as a table for people."""
    lines = [f"pipeline {status['pipeline']}"]
    slot = status.get("slot")
    if slot:
        lines.append(f"slot {slot['name']}  confirmed_flush_lsn={slot['confirmed_flush_lsn']}  "
                     f"retained_wal={slot['retained_wal_bytes']} bytes  active={slot['active']}")
    if (status.get("wal") or {}).get("wal_warning"):
        lines.append(f"WARNING: {status['wal']['wal_warning']}")
    for waiter in status.get("copy_lock_waiters") or []:
        lines.append(f"WARNING: {copy_blocks_sentence(waiter, status.get('copy_gives_way_after_seconds'))}")
    if status.get("note"):
        lines.append(status["note"])
    if status["tables"]:
        header = f"{'table':32} {'state':10} {'copied':>10} {'applied':>10} {'pending':>8} {'lag_bytes':>10}  error"
        lines.append(header)
        for t in status["tables"]:
            lines.append(f"{t['table']:32} {t['state']:10} {t['rows_copied']:>10} {t['rows_applied']:>10} "
                         f"{t['pending_changes']:>8} {str(t['lag_bytes'] if t['lag_bytes'] is not None else '-'):>10}"
                         f"  {t['error'] or ''}")
            if t["state"] == "ERRORED":
                lines.append(f"  {error_summary(t)}")
            if t.get("maintenance"):
                lines.append(_maintenance_line(t["maintenance"]))
            if t.get("verify"):
                lines.append(_verify_line(t["verify"]))
            if t.get("target_name_mapped"):
                lines.append(f"  {t['table']} is {t['target_table']} in the target (a name a file path cannot hold)")
    for r in status.get("refused_tables") or []:
        lines.append(f"refused {r['table']}: {r['reason']}")
    ddl = status.get("ddl") or {}
    if ddl.get("counts"):
        lines.append("schema changes: " + ", ".join(f"{k}={n}" for k, n in sorted(ddl["counts"].items())))
        for e in ddl.get("recent") or []:
            lines.append(f"  {e['applied_at']}  {e['kind']:16} {e['table']}  {e['detail']}")
    return "\n".join(lines)


def error_summary(table: dict[str, Any]) -> str:
    """One line on an ERRORED table: its kind, and whether it retries by itself or what fixes it."""
    kind = table.get("error_kind") or "unknown"
    if table.get("waits_for_operator"):
        return f"{kind} error, waiting for the operator; fix: {table.get('error_fix') or 'see the error'}"
    return f"{kind} error, attempt {table.get('error_count')}, retrying by itself at {table.get('retry_at')}"
