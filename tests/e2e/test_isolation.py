"""Per-table isolation under a real storage failure: one table whose target storage fails goes to
ERRORED (classified transient) while the other tables keep streaming; once the cause is gone the
table converges.

The failure is real, not injected: the failing table's DuckLake data folder is replaced by a plain
file (root ignores permission bits, so a read-only folder would not do), which makes DuckDB raise
an IOException, which the error boundary (headrace.materialize.error_boundary) classifies as transient.
The retry policy itself (the doubling backoff, the slot moving past the failing table's changes,
terminal and unknown errors) is driven by the fault-injecting target in tests/targets/test_faulty.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg

from headrace.pipeline import Pipeline
from headrace.state.lifecycle import TableState
from headrace.state.store import StateStore, TableRow
from tests.e2e.helpers import assert_same, make_config, running, wait_until


def _rows(state: StateStore) -> dict[str, TableRow]:
    return {r.qualified_name: r for r in state.tables()}


def test_a_failing_table_is_retried_while_the_others_stream(source_dsn: str, tmp_path: Path, spark: Any) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE good (id int PRIMARY KEY, v text); CREATE TABLE bad (id int PRIMARY KEY, v text);"
                     "INSERT INTO good SELECT g, 'seed' FROM generate_series(1, 20) g;"
                     "INSERT INTO bad SELECT g, 'seed' FROM generate_series(1, 20) g")
    config = make_config(source_dsn, tmp_path, ["public.good", "public.bad"], target="ducklake")
    pipeline = Pipeline(config, spark=spark)
    state = Pipeline(config).setup()  # the state tables exist before the run starts
    folder = tmp_path / "lake" / "data" / "public" / "bad"
    aside = folder.with_name("bad.aside")
    try:
        with running(pipeline):
            wait_until(lambda: all(r.state is TableState.STREAMING for r in _rows(state).values()), 180,
                       "the tables never reached STREAMING")
            # The bad table's storage goes away: its folder becomes a file DuckDB cannot write into.
            if folder.exists():
                folder.rename(aside)
            folder.parent.mkdir(parents=True, exist_ok=True)
            folder.write_text("not a folder")
            with psycopg.connect(source_dsn, autocommit=True) as conn:
                conn.execute("UPDATE bad SET v = 'changed' WHERE id <= 10; INSERT INTO bad VALUES (100, 'new')")
                conn.execute("UPDATE good SET v = 'changed' WHERE id <= 10; INSERT INTO good VALUES (100, 'new')")
            # ERRORED with the storage error, classified transient: it will be retried.
            wait_until(lambda: _rows(state)["public.bad"].state is TableState.ERRORED, 120,
                       "public.bad did not fail")
            bad = _rows(state)["public.bad"]
            assert (bad.error_kind, bad.resume_state) == ("transient", TableState.STREAMING), bad
            assert bad.retry_at is not None and bad.error is not None and "public.bad" in bad.error, bad.error
            wait_until(lambda: assert_same(pipeline, source_dsn, "public.good") == 21, 120,
                       "public.good stopped streaming while public.bad was failing")

            assert _rows(state)["public.bad"].state is TableState.ERRORED  # still failing all along
            with psycopg.connect(source_dsn, autocommit=True) as conn:
                conn.execute("DELETE FROM good WHERE id > 15; DELETE FROM bad WHERE id > 15")
            wait_until(lambda: assert_same(pipeline, source_dsn, "public.good") == 15, 120,
                       "public.good stopped streaming while public.bad was failing")

            # The storage comes back: the next retry applies everything staged meanwhile.
            folder.unlink()
            if aside.exists():
                aside.rename(folder)
            wait_until(lambda: _rows(state)["public.bad"].state is TableState.STREAMING, 120,
                       "public.bad did not recover")
            assert _rows(state)["public.bad"].error is None
            assert assert_same(pipeline, source_dsn, "public.bad") == 15
            assert assert_same(pipeline, source_dsn, "public.good") == 15
    finally:
        state.close()
