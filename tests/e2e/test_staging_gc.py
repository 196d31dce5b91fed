"""Staged files: orphans (written, never registered) go at capture start; applied ones are collected."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psycopg

from headrace.log.codec import StagingBuffer, write_staging_file
from headrace.log.store import StagingStore
from headrace.materialize.apply import current_cursor
from headrace.materialize.retention import Collector
from headrace.pipeline import Pipeline
from headrace.state.store import StateStore
from tests.e2e.helpers import assert_same, capture_while, make_config
from tests.e2e.test_pipeline import run_caught_up


def _files(root: Path) -> set[str]:
    return {os.path.abspath(p) for p in root.rglob("*") if p.is_file()}


def _registered(state: StateStore) -> set[str]:
    return {os.path.abspath(p) for p in state.log_index.registered_paths()}


def test_orphaned_staged_files_are_removed_at_capture_start(source_dsn: str, tmp_path: Path) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, v int)")
    config = make_config(source_dsn, tmp_path, ["public.items"], target="ducklake")
    capture_while(config, source_dsn, ["INSERT INTO items VALUES (1, 1)"])
    state = Pipeline(config).setup()
    try:
        (row,) = state.tables()
        kept = _registered(state)
        assert kept and _files(tmp_path / "staging") == kept
        # What a crash between write and register leaves: a complete file and a half-written one.
        buf = StagingBuffer()
        buf.append("I", 1, 1, 0, 1, '{"id":"9","v":"9"}')
        orphan = tmp_path / "staging" / config.name / str(row.oid) / "00000000DEADBEEF-orphan.parquet"
        write_staging_file(orphan, buf)
        half = orphan.with_name("00000000DEADBEEF-half.tmp")
        half.write_bytes(b"PAR1")
        capture_while(config, source_dsn, ["INSERT INTO items VALUES (2, 2)"])
        registered = _registered(state)
        assert not orphan.exists() and not half.exists()
        assert kept < registered  # registered files stay, new ones were added
        assert _files(tmp_path / "staging") == registered
    finally:
        state.close()


def test_applied_files_are_collected_and_pending_ones_kept(source_dsn: str, tmp_path: Path, spark: Any) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE a (id int PRIMARY KEY, v int); CREATE TABLE b (id int PRIMARY KEY, v int);"
                     "INSERT INTO a SELECT g, g FROM generate_series(1, 50) g;"
                     "INSERT INTO b SELECT g, g FROM generate_series(1, 50) g")
    config = make_config(source_dsn, tmp_path, ["public.a", "public.b"], target="ducklake",
                         staging={"gc_seconds": 3600.0})
    run_caught_up(Pipeline(config, spark=spark))  # the copy
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("UPDATE a SET v = v + 1 WHERE id <= 10; DELETE FROM b WHERE id <= 5")
    pipeline = Pipeline(config, spark=spark)
    run_caught_up(pipeline)  # staged and applied
    # Staged but not applied, for both tables; then b is sent back to be copied again.
    capture_while(config, source_dsn, ["UPDATE a SET v = -v WHERE id > 40",
                                                   "UPDATE b SET id = id + 1000 WHERE id > 45"])
    state = Pipeline(config).setup()
    try:
        rows = {r.qualified_name: r for r in state.tables()}
        state.copy_restarted(rows["public.b"].oid)
        before = {name: state.log_index.entries(r.oid, 0, 10_000) for name, r in rows.items()}
        cursors = {name: current_cursor(state, pipeline.target, r) for name, r in rows.items()}
        assert all(c > 0 for c in cursors.values())
        assert all(any(e.offset > cursors[n] for e in before[n]) for n in rows)  # something still to apply

        staging = StagingStore.for_pipeline(config.staging.path, config.name)
        collector = Collector(staging)
        assert collector.step(state, pipeline.target)
        collector.close()  # the files' deletes, on the collector's thread, end

        for name, row in rows.items():
            after = state.log_index.entries(row.oid, 0, 10_000)
            assert [e for e in before[name] if e.offset > cursors[name]] == after  # pending entries kept
            for entry in before[name]:
                assert os.path.exists(entry.path) == (entry.offset > cursors[name])
        assert any(e.offset <= cursors[n] for n in rows for e in before[n])  # something was collected
    finally:
        state.close()
        pipeline.target.close()
    # The kept entries are what the tables need: both converge (b through a new copy).
    run_caught_up(Pipeline(config, spark=spark))
    check = Pipeline(config, spark=spark)
    try:
        assert assert_same(check, source_dsn, "public.a") == 50
        assert assert_same(check, source_dsn, "public.b") == 45
    finally:
        check.target.close()


def test_the_run_loop_collects_applied_files(source_dsn: str, tmp_path: Path, spark: Any) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE a (id int PRIMARY KEY, v int); INSERT INTO a VALUES (1, 1)")
    no_gc = make_config(source_dsn, tmp_path, ["public.a"], target="ducklake", staging={"gc_seconds": 3600.0})
    config = make_config(source_dsn, tmp_path, ["public.a"], target="ducklake", staging={"gc_seconds": 0.05})
    run_caught_up(Pipeline(no_gc, spark=spark))  # the copy
    first = Pipeline(no_gc, spark=spark)
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        for i in range(2, 6):
            conn.execute("INSERT INTO a VALUES (%s, %s)", (i, i))
    run_caught_up(first)
    state = StateStore(first.state_dsn, config.name)
    try:
        applied_in_first_run = {e.path for r in state.tables() for e in state.log_index.entries(r.oid, 0, 10_000)}
    finally:
        state.close()
    assert applied_in_first_run, "the first run staged nothing"
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("UPDATE a SET v = 0")
    second = Pipeline(config, spark=spark)
    run_caught_up(second)
    assert not any(os.path.exists(p) for p in applied_in_first_run)
    try:
        assert assert_same(second, source_dsn, "public.a") == 5
    finally:
        second.target.close()
