"""Per-table isolation: one table whose target storage fails goes to ERRORED and is retried with
exponential backoff, while the other tables keep streaming and the slot keeps advancing (the
failing table's changes wait in the staged log); once the cause is gone the table converges.

The failure is real, not mocked: the failing table's DuckLake data folder is replaced by a plain
file (root ignores permission bits, so a read-only folder would not do), which makes DuckDB raise
an IOException, which the error boundary (headrace.materialize.failure) classifies as transient.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from headrace.pipeline import Pipeline
from headrace.state.lifecycle import BACKOFF_BASE_SECONDS, TableState
from headrace.state.store import StateStore, TableRow
from tests.e2e.helpers import assert_same, make_config, running, slot_position, wait_until, wal_insert_lsn


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
            bad_changes_end = wal_insert_lsn(source_dsn)

            # ERRORED with the error recorded, and retried on a doubling schedule.
            seen: dict[int, tuple[datetime, datetime]] = {}  # attempt -> (first seen, its retry_at)

            def failed_twice() -> bool:
                row = _rows(state)["public.bad"]
                if row.state is TableState.ERRORED and row.retry_at is not None and row.error_count not in seen:
                    seen[row.error_count] = (datetime.now(row.retry_at.tzinfo), row.retry_at)
                return 2 in seen

            wait_until(failed_twice, 120, "public.bad did not fail twice", every=0.05)
            bad = _rows(state)["public.bad"]
            assert bad.state is TableState.ERRORED and bad.resume_state is TableState.STREAMING
            assert bad.error is not None and "TransientError" in bad.error and "public.bad" in bad.error, bad.error
            # Retried only once due, each wait twice the last: attempt n waits 2 s * 2**(n-1) from
            # its failure (seen at or after it, hence at most that), and attempt 2 started after
            # attempt 1's retry time, so its own retry time is at least 4 s past that.
            for attempt, (at, retry_at) in seen.items():
                assert (retry_at - at).total_seconds() <= BACKOFF_BASE_SECONDS * 2 ** (attempt - 1) + 0.1
            assert seen[2][0] >= seen[1][1]
            assert (seen[2][1] - seen[1][1]).total_seconds() >= 2 * BACKOFF_BASE_SECONDS - 0.1

            # Meanwhile the other table streams, and the slot moves past the bad table's changes.
            wait_until(lambda: assert_same(pipeline, source_dsn, "public.good") == 21, 120,
                       "public.good stopped streaming while public.bad was failing")
            wait_until(lambda: slot_position(source_dsn, config.slot_name)[1] >= bad_changes_end, 120,
                       "the slot did not advance past the failing table's changes")
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
