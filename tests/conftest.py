"""Session-wide fixtures: one real PostgreSQL server and one local Spark session for all tests.

Each test that needs a source gets its own fresh database on the shared server (``source_dsn``),
so tests cannot see each other's tables, slots or publications.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator

import psycopg
import pytest

from headrace.source.postgres.throwaway import ThrowawayPostgres

_db_counter = itertools.count()


@pytest.fixture(scope="session", autouse=True)
def headrace_logs() -> None:
    """headrace's structured events on stderr, so a failing test shows what the pipeline did."""
    from headrace.logs import setup_logging

    setup_logging("INFO")


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThrowawayPostgres]:
    """A real PostgreSQL server (initdb in a temp dir, wal_level=logical, loopback port)."""
    server = ThrowawayPostgres().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def source_dsn(pg_server: ThrowawayPostgres) -> Iterator[str]:
    """A fresh, empty database on the shared server; slots on it are dropped afterwards."""
    name = f"t{os.getpid()}_{next(_db_counter)}"
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield pg_server.dsn_for(name)
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        for (slot,) in conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE database = %s", (name,)
        ).fetchall():
            conn.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                "WHERE slot_name = %s AND active_pid IS NOT NULL",
                (slot,),
            )
            with contextlib.suppress(psycopg.Error):
                conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    """One local Spark session (2 cores) with the Iceberg runtime and the PostgreSQL JDBC driver
    (Iceberg JDBC catalogs), shared by every test."""
    from headrace.spark import build_session
    from headrace.targets.iceberg.session import iceberg_session_conf

    session = build_session(master="local[2]", conf={"spark.sql.shuffle.partitions": "2"},
                            target_conf=iceberg_session_conf(jdbc_driver=True))
    yield session
    session.stop()
