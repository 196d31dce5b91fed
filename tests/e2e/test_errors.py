"""Errors decide retries: a terminal error waits for the operator, a transient one heals by itself.

Terminal: the replication role loses SELECT on a table before its copy (a resync). The copy's
Spark task fails with psycopg2's InsufficientPrivilege inside the Python worker; the table goes to
ERRORED with that sentence and the GRANT that fixes it, is not retried however many loop passes go
by, and says so in status, /readyz and the status page. After the GRANT, ``resume`` copies it.

Transient: the copy's connection is terminated by the server while it waits on a lock; the table
is retried with backoff and reaches STREAMING by itself.

In both, the other table keeps streaming meanwhile.
"""

from __future__ import annotations

import contextlib
import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from headrace.control.status import format_status, pipeline_status
from headrace.pipeline import Pipeline
from headrace.state.lifecycle import BACKOFF_BASE_SECONDS, TableState
from headrace.state.store import StateStore, TableRow
from tests.e2e.helpers import assert_same, make_config, running, wait_until

API = {"listen": "127.0.0.1:0", "token_env": None}


def _row(state: StateStore, table: str) -> TableRow:
    return next(r for r in state.tables() if r.qualified_name == table)


def _errors_total(pipeline: Pipeline, table: str, kind: str) -> float:
    return pipeline.metrics.errors.labels(table, kind)._value.get()


def _get(pipeline: Pipeline, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{pipeline.api_address}{path}", timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _passes_after(pipeline: Pipeline, passes: int) -> None:
    """Let ``passes`` run-loop passes go by (each idle pass sleeps apply.idle_sleep_seconds)."""
    start = pipeline.loop_passes
    wait_until(lambda: pipeline.loop_passes >= start + passes, 120, f"{passes} loop passes")


@pytest.fixture
def replication_role(source_dsn: str) -> Iterator[str]:
    """A DSN for a non-superuser role with REPLICATION that owns the test's tables (SELECT can be revoked)."""
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        role = f"hr_repl_{os.getpid()}_{conn.info.dbname}"
        conn.execute(f"CREATE ROLE {role} LOGIN REPLICATION")
        conn.execute(f"GRANT CREATE ON DATABASE {conn.info.dbname} TO {role}; GRANT CREATE ON SCHEMA public TO {role}")
    try:
        yield make_conninfo(source_dsn, user=role)
    finally:
        with psycopg.connect(source_dsn, autocommit=True) as conn:
            conn.execute(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'")
            with contextlib.suppress(psycopg.Error):
                conn.execute(f"DROP OWNED BY {role}")
        with psycopg.connect(make_conninfo(source_dsn, dbname="postgres"), autocommit=True) as conn, \
                contextlib.suppress(psycopg.Error):
            conn.execute(f"DROP ROLE {role}")


def _create_tables(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE a (id int PRIMARY KEY, v text); CREATE TABLE b (id int PRIMARY KEY, v text);"
                     "INSERT INTO a SELECT g, 'seed' FROM generate_series(1, 50) g;"
                     "INSERT INTO b SELECT g, 'seed' FROM generate_series(1, 50) g")


def test_a_missing_privilege_waits_for_the_operator_and_resume_brings_it_back(
        replication_role: str, tmp_path: Path, spark: Any) -> None:
    dsn = replication_role
    _create_tables(dsn)
    config = make_config(dsn, tmp_path, ["public.a", "public.b"], target="ducklake", api=API)
    pipeline = Pipeline(config, spark=spark)
    state = Pipeline(config).setup()  # as the role: it needs no superuser
    try:
        with running(pipeline), psycopg.connect(dsn, autocommit=True) as conn:
            wait_until(lambda: {r.state for r in state.tables()} == {TableState.STREAMING}, 180,
                       "the tables never reached STREAMING")
            conn.execute("REVOKE SELECT ON b FROM CURRENT_USER")
            done, _ = pipeline.operations.call(pipeline.operations.resync_table("public.b"))
            assert done
            wait_until(lambda: _row(state, "public.b").state is TableState.ERRORED, 120, "public.b goes to ERRORED")
            errored = _row(state, "public.b")
            assert errored.error_kind == "terminal" and errored.retry_at is None, errored
            assert errored.error == "PrivilegeError: PostgreSQL InsufficientPrivilege: permission denied for table b"
            assert errored.error_fix == f"GRANT SELECT ON public.b TO {conn.info.user}; then `headrace resume public.b`"
            counted = _errors_total(pipeline, "public.b", "terminal")
            assert counted == 1

            # Not retried: more loop passes than a transient error's first backoff lasts.
            conn.execute("INSERT INTO a VALUES (100, 'while b waits'); UPDATE a SET v = 'moved' WHERE id <= 10")
            _passes_after(pipeline, int(3 * BACKOFF_BASE_SECONDS / config.apply.idle_sleep_seconds))
            still = _row(state, "public.b")
            assert (still.state, still.error_count, still.retry_at) == (TableState.ERRORED, 1, None), still
            assert _errors_total(pipeline, "public.b", "terminal") == counted
            wait_until(lambda: assert_same(pipeline, dsn, "public.a") == 51, 60, "public.a keeps streaming")

            # Every place an operator looks says which kind, why, and the command.
            status = {t["table"]: t for t in pipeline_status(config)["tables"]}["public.b"]
            assert (status["error_kind"], status["waits_for_operator"], status["retry_at"]) == ("terminal", True, None)
            assert status["error_fix"] == errored.error_fix
            text = format_status(pipeline_status(config))
            assert "terminal error, waiting for the operator; fix: GRANT SELECT ON public.b" in text, text
            code, body = _get(pipeline, "/readyz")
            assert code == 503, body
            (reason,) = [r for r in json.loads(body)["reasons"] if "public.b" in r]
            assert "waits for the operator (terminal error)" in reason and "permission denied" in reason, reason
            assert "headrace resume public.b" in reason, reason
            code, body = _get(pipeline, "/api/status")
            assert code == 200 and {t["table"]: t for t in json.loads(body)["tables"]}["public.b"]["error_kind"] \
                == "terminal"
            code, page = _get(pipeline, "/")
            assert code == 200 and "permission denied for table b" in page and "GRANT SELECT ON public.b" in page

            conn.execute("GRANT SELECT ON b TO CURRENT_USER")
            conn.execute("UPDATE b SET v = 'after the grant' WHERE id = 1")
            done, result = pipeline.operations.call(pipeline.operations.resume_table("public.b"))
            assert done and result["state"] == TableState.SNAPSHOT.value, result
            wait_until(lambda: _row(state, "public.b").state is TableState.STREAMING, 120,
                       "public.b streams again after resume")
            wait_until(lambda: assert_same(pipeline, dsn, "public.b") == 50, 60, "public.b converges")
            assert _row(state, "public.b").error is None
            wait_until(lambda: _get(pipeline, "/readyz")[0] == 200, 60, "ready again")
    finally:
        state.close()


def _blocked_by(dsn: str, pid: int) -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", (pid,)).fetchall()
    return [r[0] for r in rows]


def test_a_terminated_copy_connection_is_retried_until_the_table_streams(
        source_dsn: str, tmp_path: Path, spark: Any) -> None:
    _create_tables(source_dsn)
    config = make_config(source_dsn, tmp_path, ["public.a", "public.b"], target="iceberg")
    pipeline = Pipeline(config, spark=spark)
    state = Pipeline(config).setup()
    try:
        with running(pipeline), psycopg.connect(source_dsn, autocommit=True) as conn:
            wait_until(lambda: {r.state for r in state.tables()} == {TableState.STREAMING}, 180,
                       "the tables never reached STREAMING")
            with psycopg.connect(source_dsn) as locker:
                # The resync's copy waits behind this transaction (its snapshot export waits for the
                # running transactions, its COPY for the lock); the server then ends the waiting
                # connection, as a restart or an administrator would.
                locker.execute("LOCK TABLE b IN ACCESS EXCLUSIVE MODE")
                pipeline.operations.call(pipeline.operations.resync_table("public.b"))
                conn.execute("INSERT INTO a VALUES (100, 'while b is locked')")
                wait_until(lambda: assert_same(pipeline, source_dsn, "public.a") == 51, 60,
                           "public.a streams while b's copy waits")
                locker_pid = locker.info.backend_pid
                wait_until(lambda: _blocked_by(source_dsn, locker_pid), 60, "the copy waits on the lock")
                for pid in _blocked_by(source_dsn, locker_pid):
                    conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
                wait_until(lambda: _errors_total(pipeline, "public.b", "transient") >= 1, 60,
                           "the terminated copy counts as a transient error")
                locker.rollback()
            conn.execute("UPDATE b SET v = 'after the lock' WHERE id = 1")
            wait_until(lambda: _row(state, "public.b").state is TableState.STREAMING, 120,
                       "public.b is retried and streams by itself")
            wait_until(lambda: assert_same(pipeline, source_dsn, "public.b") == 50, 60, "public.b converges")
            assert _errors_total(pipeline, "public.b", "terminal") == 0
            assert _errors_total(pipeline, "public.b", "unknown") == 0
    finally:
        state.close()
