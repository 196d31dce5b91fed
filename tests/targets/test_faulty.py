"""The per-table error boundary, driven by the fault-injecting target (``headrace.targets.faulty``).

A DuckLake does the work; the faulty target in front of it fails the chosen call on the chosen
table the chosen way. Each test runs a real pipeline (real PostgreSQL, Spark, DuckLake) and waits
on the state table, never on a fixed delay.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from headrace.config import PipelineConfig
from headrace.core.backoff import Backoff
from headrace.pipeline import Pipeline
from headrace.state import lifecycle
from headrace.state.lifecycle import BACKOFF_BASE_SECONDS, RETRY_BUDGET, TableState
from headrace.state.store import StateStore, TableRow
from headrace.targets.faulty.config import Fault
from headrace.targets.faulty.target import FaultyTarget
from tests.e2e.helpers import (
    assert_same,
    make_config,
    raw_config,
    run_command,
    running,
    slot_position,
    wait_until,
    wal_insert_lsn,
)
from tests.e2e.test_pipeline import run_caught_up


def lake(tmp: Path) -> dict[str, Any]:
    """A ``target:`` section: a DuckLake under ``tmp``."""
    return {"ducklake": {"catalog": str(tmp / "lake" / "meta.ducklake"), "data_path": str(tmp / "lake" / "data")}}


def faulty(tmp: Path, *faults: dict[str, Any]) -> dict[str, Any]:
    """A ``target:`` section: the DuckLake of ``lake(tmp)`` behind the faulty target."""
    return {"faulty": {"inner": lake(tmp), "faults": list(faults)}}


def tables(dsn: str, *names: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name in names:
            conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v text);"
                         f"INSERT INTO {name} SELECT g, 'seed' FROM generate_series(1, 20) g")


def change(dsn: str, *names: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name in names:
            conn.execute(f"UPDATE {name} SET v = 'changed' WHERE id <= 10; INSERT INTO {name} VALUES (100, 'new')")


def row(state: StateStore, name: str) -> TableRow:
    return next(r for r in state.tables() if r.qualified_name == name)


def streaming(state: StateStore) -> bool:
    return all(r.state is TableState.STREAMING for r in state.tables())


@contextmanager
def running_faulty(config: PipelineConfig, spark: Any) -> Iterator[tuple[Pipeline, StateStore, FaultyTarget]]:
    """``config``'s pipeline running (its target the faulty one) once every table is STREAMING: the
    pipeline, a state store of its own for the test to read, and the faulty target to arm or release."""
    pipeline = Pipeline(config, spark=spark)
    state = Pipeline(config).setup()
    try:
        with running(pipeline):
            wait_until(lambda: streaming(state), 180, "the tables never reached STREAMING")
            target = pipeline.target
            assert isinstance(target, FaultyTarget)
            yield pipeline, state, target
    finally:
        state.close()


def test_a_terminal_failure_stops_its_table_while_the_other_streams(source_dsn: str, tmp_path: Path,
                                                                    spark: Any) -> None:
    tables(source_dsn, "good", "bad")
    config = make_config(source_dsn, tmp_path, ["public.good", "public.bad"],
                         faulty(tmp_path, {"fail_on": "apply_batch", "table": "public.bad", "error": "terminal"}))
    pipeline = Pipeline(config, spark=spark)
    state = Pipeline(config).setup()
    try:
        with running(pipeline):
            wait_until(lambda: streaming(state), 180, "the tables never reached STREAMING")
            change(source_dsn, "good", "bad")
            wait_until(lambda: row(state, "public.bad").waits_for_operator, 120, "public.bad did not stop")
            bad = row(state, "public.bad")
            assert (bad.error_kind, bad.error_count, bad.resume_state) == ("terminal", 1, TableState.STREAMING)
            assert bad.error is not None and "TerminalError" in bad.error and "public.bad" in bad.error, bad.error
            assert bad.error_fix, "a terminal error says what fixes it"
            wait_until(lambda: assert_same(pipeline, source_dsn, "public.good") == 21, 120,
                       "public.good stopped streaming while public.bad had failed")
            assert row(state, "public.good").state is TableState.STREAMING
            assert row(state, "public.bad").waits_for_operator  # no retry: it waits for the operator
            target = pipeline.target
            assert isinstance(target, FaultyTarget) and target.injected == [("apply_batch", "public.bad")]
    finally:
        state.close()


def test_a_transient_failure_is_retried_until_the_table_converges(source_dsn: str, tmp_path: Path,
                                                                  spark: Any) -> None:
    tables(source_dsn, "t")
    config = make_config(source_dsn, tmp_path, ["public.t"], faulty(tmp_path))
    with running_faulty(config, spark) as (pipeline, state, target):
        # Armed while the pipeline runs: the next two batches of public.t fail, the third goes through.
        target.inject(Fault(fail_on="apply_batch", table="public.t", error="transient", times=2))
        change(source_dsn, "t")
        errors: set[str] = set()

        def healed() -> bool:
            current = row(state, "public.t")
            if current.error:
                errors.add(current.error)
            return current.state is TableState.STREAMING and len(target.injected) == 2

        wait_until(healed, 120, "public.t did not recover from two transient failures", every=0.05)
        assert assert_same(pipeline, source_dsn, "public.t") == 21
        assert row(state, "public.t").error is None and row(state, "public.t").error_count == 0
        assert target.injected == [("apply_batch", "public.t")] * 2
        assert errors and all("TransientError" in e for e in errors), errors


def test_a_table_failing_transiently_backs_off_while_the_others_stream_then_converges(
        source_dsn: str, tmp_path: Path, spark: Any) -> None:
    tables(source_dsn, "good", "bad")
    config = make_config(source_dsn, tmp_path, ["public.good", "public.bad"], faulty(tmp_path))
    with running_faulty(config, spark) as (pipeline, state, target):
        # public.bad's target fails every batch until the fault is cleared (an outage of its storage).
        target.inject(Fault(fail_on="apply_batch", table="public.bad", error="transient", times=None))
        change(source_dsn, "good", "bad")
        bad_changes_end = wal_insert_lsn(source_dsn)
        seen: dict[int, tuple[datetime, datetime]] = {}  # attempt -> (first seen, its retry_at)

        def failed_twice() -> bool:
            bad = row(state, "public.bad")
            if bad.state is TableState.ERRORED and bad.retry_at is not None and bad.error_count not in seen:
                seen[bad.error_count] = (datetime.now(bad.retry_at.tzinfo), bad.retry_at)
            return 2 in seen

        wait_until(failed_twice, 120, "public.bad did not fail twice", every=0.05)
        bad = row(state, "public.bad")
        assert (bad.error_kind, bad.resume_state) == ("transient", TableState.STREAMING)
        assert bad.error is not None and "TransientError" in bad.error and "public.bad" in bad.error, bad.error
        # Retried only once due, each wait twice the last (see tests/e2e/test_isolation.py).
        for attempt, (at, retry_at) in seen.items():
            assert (retry_at - at).total_seconds() <= BACKOFF_BASE_SECONDS * 2 ** (attempt - 1) + 0.1
        assert seen[2][0] >= seen[1][1]
        assert (seen[2][1] - seen[1][1]).total_seconds() >= 2 * BACKOFF_BASE_SECONDS - 0.1
        # Meanwhile the other table streams, and the slot moves past the failing table's changes.
        wait_until(lambda: assert_same(pipeline, source_dsn, "public.good") == 21, 120,
                   "public.good stopped streaming while public.bad was failing")
        wait_until(lambda: slot_position(source_dsn, config.slot_name)[1] >= bad_changes_end, 120,
                   "the slot did not advance past the failing table's changes")
        assert row(state, "public.bad").state is TableState.ERRORED
        # The cause goes away: the next retry applies everything staged meanwhile.
        target.clear()
        wait_until(lambda: row(state, "public.bad").state is TableState.STREAMING, 120,
                   "public.bad did not recover")
        assert row(state, "public.bad").error is None
        assert assert_same(pipeline, source_dsn, "public.bad") == 21


def test_an_unknown_error_waits_for_the_operator_after_the_retry_budget(
        source_dsn: str, tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # The retry schedule shortened so the budget runs out in well under a second; the policy is the same.
    monkeypatch.setattr(lifecycle, "TABLE_RETRY", Backoff(0.05, 0.1))
    tables(source_dsn, "t")
    config = make_config(source_dsn, tmp_path, ["public.t"],
                         faulty(tmp_path, {"fail_on": "apply_batch", "error": "unknown", "times": None}))
    pipeline = Pipeline(config, spark=spark)
    state = Pipeline(config).setup()
    try:
        with running(pipeline):
            wait_until(lambda: streaming(state), 180, "public.t never reached STREAMING")
            change(source_dsn, "t")
            wait_until(lambda: row(state, "public.t").waits_for_operator, 120,
                       "public.t was still retried after its retry budget")
            failed = row(state, "public.t")
            assert (failed.error_kind, failed.error_count) == ("unknown", RETRY_BUDGET)
            assert failed.error is not None and "InjectedError" in failed.error, failed.error
            assert failed.error_fix is not None and "headrace resume" in failed.error_fix
            target = pipeline.target
            assert isinstance(target, FaultyTarget) and len(target.injected) == RETRY_BUDGET
    finally:
        state.close()


def test_a_crash_in_a_target_call_then_a_run_without_the_fault_converges(source_dsn: str, tmp_path: Path,
                                                                         spark: Any) -> None:
    tables(source_dsn, "t")
    crash = faulty(tmp_path, {"fail_on": "write_snapshot", "table": "public.t", "error": "crash"})
    died = subprocess.run(run_command(raw_config(source_dsn, tmp_path, ["public.t"], crash), tmp_path),
                          capture_output=True, text=True, timeout=300)
    assert died.returncode == 137, died.stderr[-2000:]
    assert "injected crash failure in write_snapshot of public.t (faulty target), exiting" in died.stderr
    # The same pipeline on the same lake, the fault gone: the copy starts over and streams.
    pipeline = Pipeline(make_config(source_dsn, tmp_path, ["public.t"], lake(tmp_path)), spark=spark)
    change(source_dsn, "t")
    run_caught_up(pipeline)
    assert assert_same(pipeline, source_dsn, "public.t") == 21
