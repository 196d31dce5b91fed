"""Outages: the servers a run depends on going away and coming back.

A run talks to up to three PostgreSQL servers: the source, the state store (``source.state_dsn``,
by default the source itself) and a DuckLake catalog on PostgreSQL. Any of them may restart, crash,
fail over or be cut off for minutes. None of that is an error a table did: the run waits, probing
each server with backoff (``reconnect``), and carries on where it was once all of them answer again.
Nothing is lost meanwhile: the slot keeps the WAL, and staged changes are already durable.

``OutageWatch`` is what the run loop, ``/readyz`` and the ``headrace_source_up`` metric consult. It
logs one line when a server stops answering and one when it answers again, never one per attempt.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import psycopg

from headrace.config import PipelineConfig, redacted_dsn
from headrace.core.backoff import Backoff
from headrace.logs import event
from headrace.outage_signs import lost_connection
from headrace.source.base import Source

log = logging.getLogger("headrace.outage")
run_log = logging.getLogger("headrace.pipeline")  # the run's own events


def servers_of(config: PipelineConfig, dsn: str, state_dsn: str) -> dict[str, str]:
    """Role -> libpq connection string of every PostgreSQL server the run depends on."""
    servers = {"source": dsn}
    if state_dsn != dsn:
        servers["state"] = state_dsn
    servers.update(config.target.plugin.servers(config.target.settings))  # e.g. a DuckLake catalog on PostgreSQL
    return servers


class OutageWatch:
    """Which of the run's servers answer, why the others do not, and waiting until they all do."""

    def __init__(self, servers: dict[str, str], backoff: Backoff, connect_timeout: int = 5,
                 probes: dict[str, Callable[[], None]] | None = None) -> None:
        self.servers = dict(servers)
        self.probes = dict(probes or {})  # role -> its own probe (a server that is not PostgreSQL)
        self.backoff = backoff
        self.connect_timeout = connect_timeout
        self._down: dict[str, str] = {}  # role -> why it does not answer
        self._lock = threading.Lock()
        self.outages = 0  # episodes the run loop waited through (tests and the soak bench read it)

    @classmethod
    def for_config(cls, config: PipelineConfig, dsn: str, state_dsn: str, source: Source | None = None
                   ) -> OutageWatch:
        """The watch over every server ``config`` names, with its ``reconnect`` policy; the source is
        probed by ``source.probe`` when it is not PostgreSQL."""
        policy = config.reconnect
        probes = {"source": source.probe} if source is not None and source.kind != "postgresql" else {}
        return cls(servers_of(config, dsn, state_dsn), Backoff(policy.first_seconds, policy.max_seconds),
                   policy.connect_timeout_seconds, probes)

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
            errors: tuple[type[BaseException], ...] = (psycopg.Error, *self._probe_errors(role))
            try:
                if role in self.probes:
                    self.probes[role]()
                else:
                    with psycopg.connect(dsn, autocommit=True, connect_timeout=self.connect_timeout) as conn:
                        conn.execute("SELECT 1")
            except errors as exc:
                down[role] = redacted_dsn(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
        for role in self.servers:
            self._mark(role, down.get(role))
        return down

    def _probe_errors(self, role: str) -> tuple[type[BaseException], ...]:
        # Another driver's probe: whatever it raises means the server does not answer.
        return (Exception,) if role in self.probes else ()

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


def ride_out(watch: OutageWatch, exc: Exception, attempt: int, stop: threading.Event,
             release: Callable[[], None]) -> None:
    """Wait until every server answers again, after ``release`` dropped what the outage broke.

    Logged once per outage (``run.interrupted`` here, ``run.resumed`` by the loop), not per attempt.
    """
    if attempt == 1:
        watch.outages += 1
        event(run_log, "run.interrupted", logging.WARNING, error=first_line(exc))
    else:
        run_log.debug("still interrupted (attempt %d): %s", attempt, first_line(exc))
    release()
    if watch.wait_until_up(stop):
        # Every server answers, yet the step failed: wait before the next one rather than spin.
        stop.wait(watch.backoff.delay(attempt - 1))


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message``, for one-line log fields."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
