"""WAL the slot makes the source keep: measured, compared with ``source.max_retained_wal``, and a slot
PostgreSQL invalidated (``max_slot_wal_keep_size`` exceeded) recognised.

A slot keeps every WAL segment from its ``restart_lsn`` on. A stopped, paused or lagging headrace
therefore makes the source's disk fill, unless ``max_slot_wal_keep_size`` bounds it: then PostgreSQL
invalidates the slot instead (``wal_status = 'lost'``; on PostgreSQL 15 ``restart_lsn`` becomes
NULL, there is no ``invalidation_reason`` column before 17). A lost slot's changes are gone: the only
way back to an exact target is to copy every table again under a new slot (``headrace reset``).

The figures and the sentences; what a run does about them is ``headrace.run.wal_guard``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from headrace.core.size import format_size


@dataclass(frozen=True)
class SlotWal:
    """The slot's WAL as the source reports it now."""

    slot: str
    wal_status: str | None  # reserved, extended, unreserved (lost at the next checkpoint), lost
    retained_bytes: int | None  # current WAL position minus restart_lsn; None once lost
    safe_bytes: int | None  # WAL that may still be written before the slot is lost; None = no bound
    limit_bytes: int  # source.max_retained_wal

    @property
    def lost(self) -> bool:
        return self.wal_status == "lost"

    @property
    def over_limit(self) -> bool:
        return self.retained_bytes is not None and self.retained_bytes > self.limit_bytes

    def as_dict(self) -> dict[str, Any]:
        """The fields ``status`` adds to its ``slot`` object."""
        return {"wal_status": self.wal_status, "max_retained_wal_bytes": self.limit_bytes,
                "safe_wal_bytes": self.safe_bytes, "wal_warning": warning(self)}


def read_slot_wal(conn: psycopg.Connection[Any], slot: str, limit_bytes: int) -> SlotWal | None:
    """The slot's WAL figures; None when the slot does not exist."""
    row = conn.execute(
        "SELECT wal_status, ((CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn()"
        " END) - restart_lsn)::bigint, safe_wal_size"
        " FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
    if row is None:
        return None
    return SlotWal(slot, row[0], int(row[1]) if row[1] is not None else None,
                   int(row[2]) if row[2] is not None else None, limit_bytes)


def lost_message(pipeline: str, slot: str, config_path: str = "<pipeline file>") -> str:
    """What happened to a lost slot, and the one command that recovers."""
    return (
        f"replication slot {slot} of pipeline {pipeline} was invalidated by PostgreSQL "
        "(pg_replication_slots.wal_status = 'lost'): it kept more WAL than the source's max_slot_wal_keep_size "
        "allows, because headrace was stopped or fell behind for too long, so the changes it had not read are "
        "gone and the target can no longer be kept exact. Copy every table again under a new slot: stop "
        f"headrace, run `headrace reset -c {config_path} --yes`, then start `headrace run` again (each copy "
        "replaces its target table's rows; raise max_slot_wal_keep_size to outlast longer stops)"
    )


def warning(wal: SlotWal) -> str | None:
    """A sentence when the slot is lost or keeps more WAL than the limit; None when all is well."""
    if wal.lost:
        return f"slot {wal.slot} is lost (invalidated by max_slot_wal_keep_size): run `headrace reset`"
    if not wal.over_limit:
        return None
    assert wal.retained_bytes is not None
    text = (f"slot {wal.slot} makes the source keep {format_size(wal.retained_bytes)} of WAL, more than "
            f"source.max_retained_wal ({format_size(wal.limit_bytes)}): headrace is stopped, paused or behind; "
            "resume it (or see its errors) before the source's disk fills")
    if wal.safe_bytes is not None:
        text += f"; PostgreSQL invalidates the slot after {format_size(max(wal.safe_bytes, 0))} more WAL"
    return text


def keep_size_advice(conn: psycopg.Connection[Any], limit_bytes: int) -> dict[str, Any]:
    """``max_slot_wal_keep_size`` of the source and a value to set, for ``headrace check``."""
    row = conn.execute("SELECT setting::bigint FROM pg_settings WHERE name = 'max_slot_wal_keep_size'").fetchone()
    setting_mb = int(row[0]) if row else -1
    advised_mb = max(2 * limit_bytes >> 20, 1024)  # the warning comes well before the slot is lost
    set_sql = f"ALTER SYSTEM SET max_slot_wal_keep_size = '{advised_mb // 1024}GB'; SELECT pg_reload_conf();"
    if setting_mb < 0:
        advice = ("unlimited: a stopped or stuck headrace makes the source keep WAL until its disk is full. "
                  f"Bound it (the slot is then invalidated instead, and `headrace reset` copies again): {set_sql}")
    elif setting_mb << 20 <= limit_bytes:
        advice = (f"{format_size(setting_mb << 20)} is not above source.max_retained_wal "
                  f"({format_size(limit_bytes)}): the slot would be lost before headrace warns. Raise it: {set_sql}")
    else:
        advice = (f"{format_size(setting_mb << 20)}: the slot is invalidated if headrace stops for longer than "
                  f"that much WAL takes; headrace warns at {format_size(limit_bytes)}")
    return {"max_slot_wal_keep_size_mb": setting_mb, "advised_mb": advised_mb, "advice": advice}
