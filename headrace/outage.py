"""Outages: the servers a run depends on going away and coming back, and a staging directory that fills up.

A run talks to up to three PostgreSQL servers: the source, the state store (``source.state_dsn``,
by default the source itself) and a DuckLake catalog on PostgreSQL. Any of them may restart, crash,
fail over or be cut off for minutes. None of that is an error a table did: the run waits, probing
each server with backoff (``reconnect``), and carries on where it was once all of them answer again.
Nothing is lost meanwhile: the slot keeps the WAL, and staged changes are already durable.

``OutageWatch`` is what the run loop, ``/readyz`` and the ``headrace_source_up`` metric consult. It
logs one line when a server stops answering and one when it answers again, never one per attempt.
"""

from __future__ import annotations

import errno
import logging
import threading
from typing import TYPE_CHECKING

import psycopg
import psycopg2

from headrace.config import redacted_dsn
from headrace.core.backoff import Backoff
from headrace.core.errors import SourceError, TransientError, exception_chain
from headrace.logs import event

if TYPE_CHECKING:
    from typing import Any

    from headrace.config import PipelineConfig
    from headrace.state.store import StateStore

log = logging.getLogger("headrace.outage")

# Errors meaning "the connection or the server is gone", whichever driver raised them.
_CONNECTION_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError, psycopg2.OperationalError,
                      psycopg2.InterfaceError, ConnectionError)
# A staging (or warehouse) directory that cannot take more files: full, over quota, read-only, denied.
_STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO}



def lost_connection(exc: BaseException) -> bool:
    """``exc`` (or what it was raised from) says a database connection broke or could not be made."""
    return any(isinstance(e, _CONNECTION_ERRORS) or (isinstance(e, TransientError) and "connect" in str(e))
               for e in exception_chain(exc))


def storage_unavailable(exc: BaseException) -> bool:
    """``exc`` says a directory cannot take a file now: no space, over quota, read-only or denied."""
    return any(isinstance(e, OSError) and e.errno in _STORAGE_ERRNOS for e in exception_chain(exc))


def servers_of(config: PipelineConfig, dsn: str, state_dsn: str) -> dict[str, str]:
    """Role -> libpq connection string of every PostgreSQL server the run depends on."""
    servers = {"source": dsn}
    if state_dsn != dsn:
        servers["state"] = state_dsn
    servers.update(config.target.plugin.servers(config.target.settings))  # e.g. a DuckLake catalog on PostgreSQL
    return servers


class OutageWatch:
    """Which of the run's servers answer, why the others do not, and waiting until they all do."""

    def __init__(self, servers: dict[str, str], backoff: Backoff, connect_timeout: int = 5) -> None:
        self.servers = dict(servers)
        self.backoff = backoff
        self.connect_timeout = connect_timeout
        self._down: dict[str, str] = {}  # role -> why it does not answer
        self._lock = threading.Lock()
        self.outages = 0  # episodes the run loop waited through (tests and the soak bench read it)

    @classmethod
    def for_config(cls, config: PipelineConfig, dsn: str, state_dsn: str) -> OutageWatch:
        """The watch over every server ``config`` names, with its ``reconnect`` policy."""
        policy = config.reconnect
        return cls(servers_of(config, dsn, state_dsn), Backoff(policy.first_seconds, policy.max_seconds),
                   policy.connect_timeout_seconds)

    # -- reading (any thread) -------------------------------------------------------------------
    def reasons(self) -> list[str]:
        """One sentence per server that does not answer, for ``/readyz``."""
        with self._lock:
            return [f"the {role} server {redacted_dsn(self.servers[role])} does not answer: {why};"
                    " waiting for it (nothing is lost: the slot keeps the WAL)" for role, why in self._down.items()]

    def up(self, role: str = "source") -> bool:
        """The server last answered (or was never found down)."""
        with self._lock:
            return role not in self._down

    # -- probing --------------------------------------------------------------------------------
    def probe(self) -> dict[str, str]:
        """Connect to every server once; role -> reason for those that do not answer. Updates the state."""
        down = {}
        for role, dsn in self.servers.items():
            try:
                with psycopg.connect(dsn, autocommit=True, connect_timeout=self.connect_timeout) as conn:
                    conn.execute("SELECT 1")
            except psycopg.Error as exc:
                down[role] = redacted_dsn(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
        for role in self.servers:
            self._mark(role, down.get(role))
        return down

    def _mark(self, role: str, reason: str | None) -> None:
        with self._lock:
            was = self._down.get(role)
            if reason is None:
                self._down.pop(role, None)
            else:
                self._down[role] = reason
        if was is None and reason is not None:
            event(log, "server.down", logging.WARNING, server=role, dsn=redacted_dsn(self.servers[role]),
                  error=reason)
        elif was is not None and reason is None:
            event(log, "server.up", server=role, dsn=redacted_dsn(self.servers[role]))

    def explains(self, exc: BaseException) -> bool:
        """``exc`` comes from an outage (a broken connection, or a server that does not answer now),
        not from the table being worked on: the run should wait, not fail the table."""
        return lost_connection(exc) or bool(self.probe())

    def wait_until_up(self, stop: threading.Event) -> bool:
        """Probe with backoff until every server answers; False if ``stop`` was set first."""
        failures = 0
        while not stop.is_set():
            if not self.probe():
                return True
            failures += 1
            stop.wait(self.backoff.delay(failures))
        return False


def check_same_source(conn: psycopg.Connection[Any], state: StateStore, slot: str) -> None:
    """After a reconnection: the server is still the cluster the pipeline was set up on, and its slot
    is where the pipeline left it; ``SourceError`` (the start-up check's, with its remedy) if not.

    A failover to a promoted physical standby keeps the system identifier but, before PostgreSQL 17
    failover slots, not the slot; a DSN now pointing at another cluster changes the identifier.
    Streaming on regardless would silently skip the changes the lost slot held.
    """
    from headrace.state.invariants import check_slot

    meta = state.meta()
    if meta is None:
        return
    row = conn.execute("SELECT system_identifier::text FROM pg_control_system()").fetchone()
    sysid = str(row[0]) if row else ""
    if sysid != meta["system_identifier"]:
        raise SourceError(
            f"the source is now another PostgreSQL cluster (system identifier {sysid}, pipeline"
            f" {state.pipeline} was set up on {meta['system_identifier']}): its positions mean nothing"
            " there. Point source.dsn back at the original cluster, or start over with a new pipeline name"
        )
    check_slot(conn, state, slot)


def recorded_source_problems(config: PipelineConfig, conn: psycopg.Connection[Any]) -> list[str]:
    """``check_same_source`` for ``headrace check``: the problem as a sentence, none before the first run."""
    from headrace.state.store import StateStore

    dsn = config.source.resolved_dsn()
    try:
        state = StateStore(config.source.state_dsn or dsn, config.name)
    except psycopg.OperationalError as exc:
        return [f"cannot connect to the state database {redacted_dsn(config.source.state_dsn or dsn)}:"
                f" {str(exc).strip()}"]
    try:
        if state.installed():
            check_same_source(conn, state, config.slot_name)
    except SourceError as exc:
        return [str(exc)]
    finally:
        state.close()
    return []
