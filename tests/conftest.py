"""Session-wide fixtures: one real PostgreSQL server and one local Spark session for all tests.

Each test that needs a source gets its own fresh database on the shared server (``source_dsn``),
so tests cannot see each other's tables, slots or publications.

Every test is also put in a tier here (``pytest_collection_modifyitems``), from its directory, its
name and the fixtures it uses, so nobody has to remember a marker: ``unit`` (no Spark: ``make
test-fast``), ``spark`` (components on the shared Spark session), ``e2e`` (whole pipelines),
``crash`` and ``cluster``. ``make test`` runs them all but the ``slow`` ones (``_SLOW`` here, or
``@pytest.mark.slow`` on the test), which ``make test-all`` adds.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from headrace.source.mysql.throwaway import ThrowawayMariaDB
from headrace.source.postgres.throwaway import ThrowawayPostgres

_db_counter = itertools.count()
_TESTS = Path(__file__).parent
# Directories whose tests run a whole pipeline (capture, staged log, Spark, a target).
_E2E_DIRS = {"e2e", "control"}
# Slow tests (over ~20 s each) that ``make test`` leaves to ``make test-all``: each is the second
# target of a test whose other target still runs (the MySQL source's path is the same up to the target).
_SLOW = {
    "test_mysql.py::test_mysql_kill_9_under_load_then_converge[iceberg]",
    "test_mysql_copy_resume.py::test_mysql_kill_mid_copy_resumes_with_the_chunks_left[iceberg]",
    "test_mysql.py::test_mysql_copy_under_writes_then_changes_and_a_restart[iceberg]",
    "test_mysql_ddl.py::test_mysql_ddl_streams_renames_widening_and_a_drop[iceberg]",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its tier (see the module docstring); ``-m unit`` is the fast tier."""
    for item in items:
        parts = Path(str(item.path)).relative_to(_TESTS).parts
        fixtures = set(getattr(item, "fixturenames", ()))
        tiers = []
        if "spark_cluster" in fixtures:
            tiers.append("cluster")
        if "crash" in parts[-1] or "kill" in item.name:  # kills a process: test_crash*.py, test_kill_*
            tiers.append("crash")
        if parts[0] in _E2E_DIRS:
            tiers.append("e2e")
        elif "spark" in fixtures:
            tiers.append("spark")
        for tier in tiers or ["unit"]:
            item.add_marker(tier)
        if f"{parts[-1]}::{item.name}" in _SLOW:
            item.add_marker("slow")


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
            # Waits (up to 10 s) for the walsender to exit: a stream closed just before may still
            # hold its slot, and a slot still active makes the drop, then DROP DATABASE, fail.
            conn.execute(
                "SELECT pg_terminate_backend(active_pid, 10000) FROM pg_replication_slots "
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


@pytest.fixture(scope="session")
def mariadb_server() -> Iterator[ThrowawayMariaDB]:
    """A real MariaDB server (mariadb-install-db in a temp dir, binlog on, loopback port); each test
    makes its own database with ``mariadb_server.create_database(name)``."""
    server = ThrowawayMariaDB().start()
    try:
        yield server
    finally:
        server.stop()
