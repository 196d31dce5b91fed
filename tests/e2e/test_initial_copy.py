"""Initial copy at scale: many chunks under concurrent writes, resume after kill -9 without redoing
finished chunks, and a table added to a running pipeline copying while another keeps streaming."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from headrace.config import parse_config
from headrace.control.status import pipeline_status
from headrace.materialize.file_copy import CHUNKS_PER_TASK, GROUPS_PER_COMMIT
from headrace.pipeline import Pipeline
from headrace.state.progress import ProgressStore
from tests.e2e.helpers import assert_same, make_config
from tests.e2e.test_pipeline import run_caught_up

WIDE_ROWS = "INSERT INTO big SELECT g, g % 97, repeat(md5(g::text), 3), now() FROM generate_series({lo}, {hi}) g"


def _big_table(dsn: str, rows: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE big (id bigint PRIMARY KEY, grp int, body text, at timestamptz)")
        conn.execute(WIDE_ROWS.format(lo=1, hi=rows))


def _churn(dsn: str, stop: threading.Event, lo: int, rounds: int | None = None) -> None:
    """Updates that move rows to other pages (new ctid), deletes and inserts, until stopped (or
    after ``rounds`` rounds)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        i = 0
        while not stop.is_set() and i != rounds:
            conn.execute("UPDATE big SET grp = grp + 1000, body = body || 'x' WHERE id = %s", (1 + (i * 37) % lo,))
            conn.execute("DELETE FROM big WHERE id = %s", (1 + (i * 53) % lo,))
            conn.execute("INSERT INTO big VALUES (%s, -1, 'new', now())", (lo + 10 + i,))
            i += 1
            time.sleep(0.01)


def test_many_chunks_under_concurrent_writes(source_dsn: str, tmp_path: Path, spark: Any) -> None:
    _big_table(source_dsn, 20_000)
    config = make_config(source_dsn, tmp_path, ["public.big"], snapshot={"chunk_pages": 16, "max_connections": 3})
    stop = threading.Event()
    writer = threading.Thread(target=_churn, args=(source_dsn, stop, 20_000))
    writer.start()
    try:
        pipeline = Pipeline(config, spark=spark)
        run_caught_up(pipeline)
    finally:
        stop.set()
        writer.join()
    run_caught_up(pipeline)
    assert assert_same(pipeline, source_dsn, "public.big") > 19_000
    (table,) = pipeline_status(config)["tables"]
    assert table["snapshot"]["chunks_total"] > 10
    assert table["snapshot"]["chunks_done"] == table["snapshot"]["chunks_total"]


def test_kill_mid_copy_resumes_with_the_chunks_left(source_dsn: str, tmp_path: Path, spark: Any,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    _big_table(source_dsn, 20_000)  # ~24 chunks of 16 pages: more than one commit's GROUPS_PER_COMMIT groups
    raw = {"name": "resume", "source": {"dsn": source_dsn, "tables": ["public.big"]},
           "target": {"iceberg": {"warehouse": str(tmp_path / "wh"), "catalog_name": "hrresume"}},
           "staging": {"path": str(tmp_path / "staging"), "flush_seconds": 0.3},
           "snapshot": {"chunk_pages": 16, "max_connections": 1}, "spark": {"master": "local[1]"}}
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw))
    env = {**os.environ, "HEADRACE_CRASH_AT": "snapshot.after_chunk:2"}
    cmd = [sys.executable, "-m", "headrace.cli", "run", "-c", str(path), "--until-caught-up"]
    crashed = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert crashed.returncode == 137, crashed.stderr[-3000:]
    progress = ProgressStore(source_dsn, "resume")
    try:
        oid = next(iter(progress.progress()))
        before = {c.number: c for c in progress.chunks(oid) if c.done}
        # The first commit's groups (those finished by then, at most GROUPS_PER_COMMIT) of one task's
        # CHUNKS_PER_TASK chunks are recorded; the second commit's were written but not recorded: redone.
        assert sorted(before) == list(range(len(before)))
        assert len(before) % CHUNKS_PER_TASK == 0 and 0 < len(before) <= GROUPS_PER_COMMIT * CHUNKS_PER_TASK
        assert len(before) < len(progress.chunks(oid)) - CHUNKS_PER_TASK
        # Rows move between pages while no snapshot holds the copy (as many rounds as the old 2 s gave).
        _churn(source_dsn, threading.Event(), 20_000, rounds=100)
        # The resuming run is the same pipeline in this process (the session's Spark starts no JVM).
        local = Pipeline(parse_config({**raw, "spark": {"master": "local[2]"}}), spark=spark)
        with caplog.at_level(logging.INFO, logger="headrace"):
            run_caught_up(local)
        assert any(r.getMessage() == "snapshot.start" and getattr(r, "resume", False) for r in caplog.records)
        after = {c.number: c for c in progress.chunks(oid)}
        assert all(after[n].snapshot_lsn == c.snapshot_lsn for n, c in before.items()), "finished chunks redone"
        assert all(c.done for c in after.values())
        assert {c.snapshot_lsn for n, c in after.items() if n not in before} != {before[0].snapshot_lsn}
    finally:
        progress.close()
    assert assert_same(local, source_dsn, "public.big") > 9_000


def test_added_table_copies_while_another_keeps_streaming(source_dsn: str, tmp_path: Path, spark: Any,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE small (id int PRIMARY KEY, v text); INSERT INTO small VALUES (1, 'a')")
    _big_table(source_dsn, 40_000)
    first = make_config(source_dsn, tmp_path, ["public.small"])
    run_caught_up(Pipeline(first, spark=spark))
    # The user adds a table to the config and restarts; the copy is slow (many 1-chunk jobs, each
    # chunk's read held 0.3 s: finished groups share a commit, so commits no longer pace the copy).
    monkeypatch.setenv("HEADRACE_HOLD_AT", "snapshot.read:0.3")
    catalog = first.target.settings.catalog_name
    second = make_config(source_dsn, tmp_path, ["public.small", "public.big"],
                         snapshot={"chunk_pages": 32, "max_connections": 1})
    second = second.model_copy(update={"target": first.target})
    assert second.target.settings.catalog_name == catalog
    pipeline = Pipeline(second, spark=spark)
    stop = threading.Event()
    runner = threading.Thread(target=pipeline.run, kwargs={"stop": stop})
    runner.start()
    try:
        deadline = time.monotonic() + 120
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            states = {t["table"]: t["state"] for t in pipeline_status(second)["tables"]}
            if states.get("public.big") == "SNAPSHOT":
                break
            time.sleep(0.2)
        assert states.get("public.big") == "SNAPSHOT", states
        with psycopg.connect(source_dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO small VALUES (2, 'during the copy')")
        seen = False
        while time.monotonic() < deadline and not seen:
            rows = pipeline.target.read_table(pipeline_schema(source_dsn, "public.small")).collect()
            seen = any(r["id"] == 2 for r in rows)
            big_state = {t["table"]: t for t in pipeline_status(second)["tables"]}["public.big"]
            if not seen:
                assert big_state["state"] == "SNAPSHOT" or time.sleep(0.3) is None
        assert seen, "the streaming table stalled during the other table's copy"
        assert big_state["state"] == "SNAPSHOT", "the copy finished before the change showed; make it slower"
    finally:
        stop.set()
        runner.join(180)
    run_caught_up(pipeline)
    assert assert_same(pipeline, source_dsn, "public.big") == 40_000
    assert assert_same(pipeline, source_dsn, "public.small") == 2


def pipeline_schema(dsn: str, table: str) -> Any:
    from headrace.source.postgres.catalog import read_table_schema

    with psycopg.connect(dsn) as conn:
        return read_table_schema(conn, table)
