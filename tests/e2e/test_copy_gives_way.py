"""A copy never blocks the application for long: it gives way to a DDL that waits for its lock, and a
copy that makes no progress is failed, its source sessions released (issue 35), on both targets.

A long read is made with the ``snapshot.read`` hold point (``HEADRACE_HOLD_AT``): the copy's first
read waits in a server statement inside its transaction, holding its ACCESS SHARE lock on the table,
as a read of a big chunk would.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from headrace.control.health import readiness
from headrace.control.metrics import PipelineMetrics
from headrace.control.status import pipeline_status
from headrace.core import faults
from headrace.pipeline import Pipeline
from headrace.source.postgres.copy import APPLICATION_NAME
from headrace.state.store import StateStore
from tests.e2e.helpers import assert_same, make_config, running, wait_until

ALTER = "ALTER TABLE customers ADD COLUMN extra_2 int NOT NULL DEFAULT 2"


def _create_customers(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE customers (id int PRIMARY KEY, name text, balance numeric(12,2))")
        conn.execute("INSERT INTO customers SELECT g, 'customer ' || g, g * 1.5 FROM generate_series(1, 2000) g")


def hold_first_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """The next copy read in this process holds its lock (120 s, unless ended); the reads after it do not."""
    monkeypatch.setenv("HEADRACE_HOLD_AT", "snapshot.read:120:1")
    faults.reset()


def _copy_holds_lock(dsn: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) WHERE a.application_name = %s"
            " AND l.granted AND l.relation = 'customers'::regclass", (APPLICATION_NAME,)).fetchone() != (0,)


def _copied(pipeline: Pipeline, dsn: str) -> bool:
    """The target's customers equal the source's (False while the retried copy has not made the table)."""
    try:
        assert_same(pipeline, dsn, "public.customers")
    except AssertionError:
        return False
    except Exception as exc:  # the table not there yet: the copy is retried after its backoff
        if "customers" not in str(exc):
            raise
        return False
    return True


class _Statement(threading.Thread):
    """``ALTER`` run on a connection of its own, then one write of the application; times the ALTER."""

    def __init__(self, dsn: str) -> None:
        super().__init__(name="alter-under-test")
        self.dsn = dsn
        self.pid: int | None = None
        self.seconds: float | None = None
        self.error: Exception | None = None
        self.began = threading.Event()

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                self.pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
                conn.execute("SET lock_timeout = '60s'")
                self.began.set()
                started = time.monotonic()
                conn.execute(ALTER)
                self.seconds = time.monotonic() - started
                conn.execute("INSERT INTO customers VALUES (2001, 'after the alter', 1, 3)")
        except Exception as exc:
            self.error = exc
        finally:
            self.began.set()


@pytest.mark.parametrize("target", ["ducklake", "iceberg"])
def test_an_alter_waiting_for_a_copy_is_reported_goes_through_and_the_copy_converges(
        source_dsn: str, tmp_path: Path, spark: Any, target: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    _create_customers(source_dsn)
    hold_first_read(monkeypatch)  # the first read would hold its lock 120 s
    give_way = 4.0  # long enough to look at every report while the ALTER waits
    config = make_config(source_dsn, tmp_path, ["public.customers"], target,
                         snapshot={"give_way_after_seconds": give_way})
    pipeline = Pipeline(config, spark=spark)
    with caplog.at_level(logging.INFO, logger="headrace"), running(pipeline):
        wait_until(lambda: _copy_holds_lock(source_dsn), 90, "the copy's read holding its lock on customers")
        statement = _Statement(source_dsn)
        statement.start()
        statement.began.wait(10)
        wait_until(pipeline.copy_lock_waiters, 3, "the waiting ALTER reported by the copy's watch")
        (waiter,) = pipeline.copy_lock_waiters()
        assert (waiter.pid, waiter.table) == (statement.pid, "public.customers")
        assert "ALTER TABLE customers" in waiter.statement
        status = pipeline_status(config)
        assert [w["pid"] for w in status["copy_lock_waiters"]] == [statement.pid]
        ready, body = readiness(pipeline)
        assert not ready and any("customers" in r and str(statement.pid) in r for r in body["reasons"])
        exposition = PipelineMetrics(pipeline).registry
        scraped = {s.labels["pid"]: s.value for m in exposition.collect() if m.name == "headrace_copy_lock_wait_seconds"
                   for s in m.samples}
        assert str(statement.pid) in scraped
        statement.join(30)
        assert statement.error is None, statement.error
        assert statement.seconds is not None and statement.seconds < give_way + 4, statement.seconds
        with psycopg.connect(source_dsn, autocommit=True) as conn:  # the application writes on
            conn.execute("UPDATE customers SET balance = balance + 1 WHERE id % 100 = 0")
            conn.execute("DELETE FROM customers WHERE id BETWEEN 10 AND 19")
        wait_until(lambda: _copied(pipeline, source_dsn), 120,
                   "the copied table equal to the source after the copy gave way")
        assert not pipeline.copy_lock_waiters()
    gave_way = [r for r in caplog.records if r.getMessage() == "snapshot.gave_way"]
    assert gave_way and getattr(gave_way[0], "waiting_pid", None) == statement.pid


@pytest.mark.parametrize("target", ["ducklake", "iceberg"])
def test_a_copy_without_progress_is_failed_releases_the_source_and_is_retried(
        source_dsn: str, tmp_path: Path, spark: Any, target: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    _create_customers(source_dsn)
    hold_first_read(monkeypatch)
    config = make_config(source_dsn, tmp_path, ["public.customers"], target,
                         snapshot={"stall_seconds": 3, "give_way_after_seconds": None})
    pipeline = Pipeline(config, spark=spark)
    with caplog.at_level(logging.INFO, logger="headrace"), running(pipeline):
        wait_until(lambda: _copy_holds_lock(source_dsn), 90, "the copy's read holding its lock on customers")
        wait_until(lambda: not _copy_holds_lock(source_dsn), 15, "the stalled copy's read ended by the watch")
        wait_until(lambda: _copied(pipeline, source_dsn), 120,
                   "the table copied by the retry")
    stalled = [r for r in caplog.records if r.getMessage() == "snapshot.stalled"]
    assert stalled, "no snapshot.stalled event"
    assert "binary_copy.py" in getattr(stalled[0], "stacks", ""), "the stalled thread's stack is not in the log"
    state = StateStore(source_dsn, config.name)
    try:
        (row,) = state.tables()
        assert row.rows_copied == 2000 and row.error_count == 0
    finally:
        state.close()
