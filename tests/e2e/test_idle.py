"""An idle pipeline costs nothing: cursors kept in memory, quiet tables skipped, the loop woken by capture.

The cached cursor must stay what the target says: after a batch, after a failed batch (read back
from the target), and across a restart (read at start-up).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg

from headrace.pipeline import Pipeline
from headrace.state.lifecycle import TableState
from headrace.state.store import StateStore
from headrace.targets.faulty.config import Fault
from headrace.targets.faulty.target import FaultyTarget
from tests.e2e.helpers import assert_same, make_config, running, wait_until
from tests.e2e.test_pipeline import run_caught_up
from tests.targets.test_faulty import change, faulty, row, streaming, tables


def _cache_matches_target(pipeline: Pipeline, state: StateStore) -> bool:
    """Every streaming table's cached cursor is the one the lake stores with its data (a table with
    nothing staged may have none: the apply pass does not read a cursor it does not need)."""
    target = pipeline.target
    assert isinstance(target, FaultyTarget)
    tails = state.log_index.tails()
    for r in state.tables():
        cached = pipeline.apply_pass.cursors.get(target, r)
        if cached is None and r.oid not in tails:
            continue  # nothing staged for it: no batch needs its cursor, so it is not read
        if cached != max(target.inner.read_cursor(r.schema) or 0, 0):
            return False
    return True


def test_the_cached_cursor_follows_batches_failures_and_restarts(source_dsn: str, tmp_path: Path,
                                                                 spark: Any) -> None:
    tables(source_dsn, "quiet_a", "quiet_b")
    config = make_config(source_dsn, tmp_path, ["public.quiet_a", "public.quiet_b"], faulty(tmp_path))
    state = Pipeline(config).setup()
    try:
        pipeline = Pipeline(config, spark=spark)
        with running(pipeline):
            wait_until(lambda: streaming(state), 180, "the tables never reached STREAMING")
            # One table changes, the other stays quiet: both converge, and the cache says where.
            change(source_dsn, "quiet_a")
            wait_until(lambda: assert_same(pipeline, source_dsn, "public.quiet_a") == 21, 60, "quiet_a applied")
            assert assert_same(pipeline, source_dsn, "public.quiet_b") == 20
            wait_until(lambda: _cache_matches_target(pipeline, state), 60, "the cache matches the lake")

            # A failed batch: the cursor is read back from the lake, and the retry converges.
            target = pipeline.target
            assert isinstance(target, FaultyTarget)
            target.inject(Fault(fail_on="apply_batch", table="public.quiet_b", error="transient", times=1))
            change(source_dsn, "quiet_b")
            wait_until(lambda: row(state, "public.quiet_b").state is TableState.STREAMING
                       and len(target.injected) == 1 and assert_same(pipeline, source_dsn, "public.quiet_b") == 21,
                       120, "quiet_b recovered from its failed batch")
            wait_until(lambda: _cache_matches_target(pipeline, state), 60, "the cache matches the lake after the failure")

        # Changes made while stopped: a new run reads each cursor from the lake and applies them once.
        with psycopg.connect(source_dsn, autocommit=True) as conn:
            conn.execute("DELETE FROM quiet_a WHERE id = 1; INSERT INTO quiet_b VALUES (200, 'after restart')")
        again = Pipeline(config, spark=spark)
        run_caught_up(again)
        assert assert_same(again, source_dsn, "public.quiet_a") == 20
        assert assert_same(again, source_dsn, "public.quiet_b") == 22
    finally:
        state.close()
