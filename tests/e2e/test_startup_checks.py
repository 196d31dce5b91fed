"""Start-up refuses state that no longer matches the source or the staging store, with a remedy.

Real Postgres, real capture (no Spark needed: ``setup`` and capture run without it).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import psycopg
import pytest

from headrace.config import PipelineConfig
from headrace.core.errors import SourceError
from headrace.pipeline import Pipeline
from headrace.source.postgres.throwaway import ThrowawayPostgres
from headrace.state.store import StateStore
from tests.e2e.helpers import capture_while, make_config, wait_until


@pytest.fixture
def items(source_dsn: str) -> str:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, v int); CREATE TABLE noise (x int)")
    return source_dsn


def _setup(config: PipelineConfig) -> StateStore:
    return Pipeline(config).setup()


def _remedy(exc: pytest.ExceptionInfo[SourceError]) -> str:
    """The SQL the message tells the operator to run."""
    match = re.search(r"\((DELETE FROM .*?;)\)", str(exc.value))
    assert match, str(exc.value)
    return match.group(1)


def _inserts(start: int, n: int) -> list[str]:
    return [f"INSERT INTO items VALUES ({i}, {i})" for i in range(start, start + n)]


def test_normal_restart_passes_even_when_other_wal_moved_on(items: str, tmp_path: Path) -> None:
    # Heartbeats far apart, other tables writing: psycopg2 would forward the confirmation past what
    # we registered; the recorded bound (acked_lsn) must keep that from looking like a foreign advance.
    config = make_config(items, tmp_path, ["public.items"], target="ducklake",
                         staging={"heartbeat_seconds": 60.0})
    # Stop while only others' WAL has moved: no commit of ours, so no last flush records a new bound.
    capture_while(config, items, _inserts(1, 3) + ["INSERT INTO noise SELECT generate_series(1, 2000)"] * 12,
                   pause=1.0, wait=False)
    with psycopg.connect(items) as conn:
        slot, captured = conn.execute(
            "SELECT confirmed_flush_lsn - '0/0'::pg_lsn, captured_lsn FROM pg_replication_slots,"
            " _headrace.pipeline_meta m WHERE m.slot_name = pg_replication_slots.slot_name AND m.slot_name = %s", (config.slot_name,)).fetchone()  # type: ignore[misc]
    assert slot >= captured
    _setup(config).close()  # no refusal


def test_refuses_another_source_cluster(items: str, tmp_path: Path) -> None:
    config = make_config(items, tmp_path, ["public.items"], target="ducklake")
    _setup(config).close()
    other = ThrowawayPostgres().start()
    try:
        with psycopg.connect(other.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE items (id int PRIMARY KEY, v int)")
        # Same state database, but the source now points at another cluster.
        moved = make_config(other.dsn, tmp_path, ["public.items"], target="ducklake",
                            source={"state_dsn": items})
        with pytest.raises(SourceError, match="was set up on another PostgreSQL cluster .*use a new pipeline name"):
            _setup(moved)
    finally:
        other.stop()


def _drop_slot(conn: psycopg.Connection, slot: str) -> None:
    """Drop ``slot`` once the walsender of the stopped capture has exited (it may take a moment on a
    loaded machine: a slot still active cannot be dropped)."""
    wait_until(lambda: conn.execute("SELECT NOT active FROM pg_replication_slots WHERE slot_name = %s",
                                    (slot,)).fetchone() == (True,), 30, "the slot stayed active")
    conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


def test_refuses_a_dropped_slot(items: str, tmp_path: Path) -> None:
    config = make_config(items, tmp_path, ["public.items"], target="ducklake")
    capture_while(config, items, _inserts(1, 2))
    with psycopg.connect(items, autocommit=True) as conn:
        _drop_slot(conn, config.slot_name)
    with pytest.raises(SourceError, match=f"replication slot {config.slot_name} .* no longer exists") as exc:
        _setup(config)
    with psycopg.connect(items, autocommit=True) as conn:
        # The slot was not silently recreated, and the remedy works.
        assert conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s",
                            (config.slot_name,)).fetchone() == (0,)
        conn.execute(_remedy(exc))
    _setup(config).close()


def test_refuses_a_slot_advanced_behind_our_back(items: str, tmp_path: Path) -> None:
    config = make_config(items, tmp_path, ["public.items"], target="ducklake")
    capture_while(config, items, _inserts(1, 2))
    _setup(config).close()  # as left by capture: fine
    with psycopg.connect(items, autocommit=True) as conn:
        conn.execute("INSERT INTO items VALUES (100, 100)")  # a change the pipeline never sees
        end = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]  # type: ignore[index]
        deadline = time.monotonic() + 10
        while conn.execute("SELECT confirmed_flush_lsn < %s FROM pg_replication_slots WHERE slot_name = %s",
                           (end, config.slot_name)).fetchone()[0]:  # type: ignore[index]
            # advance stops at the flushed WAL (the test server commits asynchronously)
            assert time.monotonic() < deadline
            conn.execute("SELECT pg_replication_slot_advance(%s, %s)", (config.slot_name, end))
    with pytest.raises(SourceError, match=r"replication slot \w+ is at .*, beyond the .* confirmed"):
        _setup(config)


def test_refuses_a_slot_dropped_and_recreated(items: str, tmp_path: Path) -> None:
    config = make_config(items, tmp_path, ["public.items"], target="ducklake")
    capture_while(config, items, _inserts(1, 2))
    with psycopg.connect(items, autocommit=True) as conn:
        _drop_slot(conn, config.slot_name)
        conn.execute("INSERT INTO items VALUES (100, 100)")  # lost with the old slot
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (config.slot_name,))
    with pytest.raises(SourceError, match="advanced or consumed it, or dropped and recreated it"):
        _setup(config)


def test_refuses_a_table_whose_oid_changed(items: str, tmp_path: Path) -> None:
    # With the default policy (resync) start-up resyncs it instead: tests/e2e/test_discovery.py.
    config = make_config(items, tmp_path, ["public.items"], target="ducklake",
                         schema_changes={"recreated_table": "refuse"})
    _setup(config).close()
    with psycopg.connect(items, autocommit=True) as conn:
        conn.execute("DROP TABLE items; CREATE TABLE items (id int PRIMARY KEY, v int)")
    with pytest.raises(SourceError, match="table public.items was dropped and recreated .*oid") as exc:
        _setup(config)
    with psycopg.connect(items, autocommit=True) as conn:
        conn.execute(_remedy(exc))
    state = _setup(config)
    try:
        (row,) = state.tables()
        assert row.state.value == "PENDING"  # copied afresh on the next run
    finally:
        state.close()


def test_refuses_a_missing_staged_file(items: str, tmp_path: Path) -> None:
    config = make_config(items, tmp_path, ["public.items"], target="ducklake")
    capture_while(config, items, _inserts(1, 3), pause=0.5)
    state = _setup(config)
    try:
        (row,) = state.tables()
        entries = state.log_index.entries(row.oid, 0, 100)
    finally:
        state.close()
    assert entries
    os.remove(entries[-1].path)
    with pytest.raises(SourceError, match=f"staged file .* \\(table public.items, log offset {entries[-1].offset}\\)"
                                          " is registered but missing") as exc:
        _setup(config)
    with psycopg.connect(items, autocommit=True) as conn:
        conn.execute(_remedy(exc))
    _setup(config).close()

