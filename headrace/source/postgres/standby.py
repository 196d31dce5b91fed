"""A hot standby as the source (PostgreSQL 16+): logical decoding there, everything written elsewhere.

A standby is read-only, so what headrace would write on the source goes where it can: the state to
``source.state_dsn``, the publication (a catalog row, replicated like any other) to the primary,
through ``source.primary_dsn`` when given (else it must exist there beforehand), and the heartbeat
message to the primary too. A logical slot on a standby needs ``hot_standby_feedback = on`` (or the
primary may vacuum catalog rows the slot still needs, and the slot is invalidated) and
``wal_level = logical`` on both servers. Creating a slot there waits for the primary's next
running-transactions record; ``pg_log_standby_snapshot()`` on the primary writes one at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import psycopg
from psycopg import sql

from headrace.core.errors import SourceError
from headrace.core.names import TableName
from headrace.core.settings import redacted_dsn

Conn = psycopg.Connection[Any]
T = TypeVar("T")

# The first PostgreSQL that decodes on a standby.
STANDBY_DECODING_VERSION = 160000
# The source's WAL position: the insert position on a primary, the replayed one on a standby (the
# walsender of a standby sends up to it). CASE evaluates only the branch taken.
POSITION_SQL = ("CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()"
                " ELSE pg_current_wal_insert_lsn() END")


def in_recovery(conn: Conn) -> bool:
    """True when ``conn``'s server is a standby (``pg_is_in_recovery()``)."""
    row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
    return bool(row and row[0])


def _setting(conn: Conn, name: str) -> str:
    row = conn.execute("SELECT current_setting(%s)", (name,)).fetchone()
    return str(row[0]) if row else ""


def server_problems(conn: Conn) -> list[str]:
    """What a standby server itself lacks for headrace to read from it (empty when ready)."""
    version = int(_setting(conn, "server_version_num"))
    if version < STANDBY_DECODING_VERSION:
        return [f"the source is a hot standby (pg_is_in_recovery() is true) on PostgreSQL"
                f" {_setting(conn, 'server_version')}, which cannot decode changes on a standby (16 and newer"
                " can): point source.dsn at the primary"]
    problems = []
    if _setting(conn, "hot_standby_feedback") != "on":
        problems.append("the source is a hot standby with hot_standby_feedback off: set hot_standby_feedback = on"
                        " in the standby's postgresql.conf and reload (without it the primary removes rows the"
                        " slot still needs, and PostgreSQL invalidates the slot)")
    return problems


def config_problems(conn: Conn, state_dsn: str | None, primary_dsn: str | None, publication: str,
                    tables: Sequence[str | TableName]) -> list[str]:
    """What the pipeline's settings lack for reading from the standby ``conn`` (empty when ready)."""
    problems = []
    if not state_dsn:
        problems.append("the source is a hot standby, which cannot hold headrace's state: set source.state_dsn"
                        " to a writable PostgreSQL database (the primary's, or another server's)")
    if primary_dsn:
        problems += _primary_problems(conn, primary_dsn)
    else:
        missing = publication_gaps(conn, publication, tables)
        if missing:
            problems.append(f"{missing} on the standby, which cannot change it: create it on the primary ("
                            f"{publication_sql(conn, publication, tables)}), or set source.primary_dsn so"
                            " headrace does")
    return problems


def _primary_problems(conn: Conn, primary_dsn: str) -> list[str]:
    try:
        with psycopg.connect(primary_dsn, connect_timeout=10, autocommit=True) as primary:
            if in_recovery(primary):
                return [f"source.primary_dsn {redacted_dsn(primary_dsn)} is a standby too: point it at the primary"]
            ids = [c.execute("SELECT system_identifier::text FROM pg_control_system()").fetchone()
                   for c in (conn, primary)]
            if ids[0] != ids[1]:
                return [f"source.primary_dsn {redacted_dsn(primary_dsn)} is not the primary of source.dsn (system"
                        " identifiers differ): point it at the standby's primary"]
            if _setting(primary, "wal_level") != "logical":
                return [f"wal_level is {_setting(primary, 'wal_level')} on the primary: set wal_level = logical in"
                        " the primary's postgresql.conf and restart it (a standby decodes only what the primary"
                        " logs)"]
    except psycopg.OperationalError as exc:
        return [f"cannot connect to source.primary_dsn {redacted_dsn(primary_dsn)}: {str(exc).strip()}"]
    return []


def publication_gaps(conn: Conn, publication: str, tables: Sequence[str | TableName]) -> str:
    """What publication ``publication`` lacks for ``tables`` as the standby sees it ('' when nothing)."""
    from headrace.source.postgres.catalog import find_relation, published_oids

    row = conn.execute("SELECT puballtables, pubviaroot FROM pg_publication WHERE pubname = %s",
                       (publication,)).fetchone()
    if row is None:
        return f"publication {publication} does not exist"
    published = published_oids(conn, publication)
    left_out = [str(t) for t in tables if (r := find_relation(conn, t)) is not None and r[0] not in published]
    if left_out:
        return f"publication {publication} does not publish {', '.join(left_out)}"
    if not row[1]:
        return f"publication {publication} lacks publish_via_partition_root = true"
    return ""


def publication_sql(conn: Conn, publication: str, tables: Sequence[str | TableName]) -> str:
    """The statement that makes ``publication`` as headrace would, for the user to run on the primary."""
    names = ", ".join(str(t) for t in tables) or "<tables>"
    generated = ", publish_generated_columns = stored" if conn.info.server_version >= 180000 else ""
    return (f"CREATE PUBLICATION {sql.Identifier(publication).as_string(conn)} FOR TABLE {names}"
            f" WITH (publish_via_partition_root = true{generated})")


def replay_until(conn: Conn, lsn: int, timeout: float = 60.0) -> None:
    """Wait until the standby ``conn`` has replayed the primary's WAL up to ``lsn``."""
    deadline = time.monotonic() + timeout
    while True:
        row = conn.execute("SELECT pg_last_wal_replay_lsn() - '0/0'::pg_lsn").fetchone()
        if row and row[0] is not None and int(row[0]) >= lsn:
            return
        if time.monotonic() > deadline:
            raise SourceError(f"the standby has not replayed the primary's WAL up to its publication change in"
                              f" {timeout:.0f} s: check the standby's replication (pg_stat_wal_receiver)")
        time.sleep(0.05)


def on_primary(primary_dsn: str, standby: Conn, change: Callable[[Conn], None]) -> None:
    """Run ``change`` on the primary, then wait until the standby ``standby`` has replayed it."""
    with psycopg.connect(primary_dsn, autocommit=True, connect_timeout=10) as primary:
        change(primary)
        row = primary.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    replay_until(standby, int(row[0]))


def nudged(primary_dsn: str | None, make: Callable[[], T]) -> T:
    """``make()`` (a slot created on a standby), with the primary writing a running-transactions record
    every 0.5 s meanwhile: the slot's creation waits for one, which an idle primary writes only
    every 15 s or never."""
    if not primary_dsn:
        return make()
    done = threading.Event()

    def nudge() -> None:
        try:
            with psycopg.connect(primary_dsn, autocommit=True, connect_timeout=10) as primary:
                while not done.is_set():
                    primary.execute("SELECT pg_log_standby_snapshot()")
                    done.wait(0.5)
        except psycopg.Error:
            pass  # the creation then waits for the primary's own record

    thread = threading.Thread(target=nudge, name="standby-snapshot-nudge", daemon=True)
    thread.start()
    try:
        return make()
    finally:
        done.set()
        thread.join(5)
