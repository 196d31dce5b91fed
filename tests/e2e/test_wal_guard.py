"""The WAL guard: retained WAL warned about while headrace is paused; a slot PostgreSQL invalidated
(``max_slot_wal_keep_size``) refused at start-up and stopped at run time, and ``headrace reset``
bringing the target back to equality with the source."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from headrace.config import parse_config
from headrace.control.health import readiness
from headrace.control.page import render_page
from headrace.control.status import pipeline_status
from headrace.core.errors import SourceError
from headrace.pipeline import Pipeline
from headrace.source.postgres.throwaway import ThrowawayPostgres
from tests.e2e.helpers import assert_same, make_config, raw_config, running, wait_until


def _more_wal(dsn: str, segments: int, checkpoint: bool = False) -> None:
    """Write ``segments`` WAL segments' worth of positions (a change, then a segment switch, each)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(segments):
            conn.execute("INSERT INTO filler DEFAULT VALUES")
            conn.execute("SELECT pg_switch_wal()")
        if checkpoint:
            conn.execute("CHECKPOINT")  # where PostgreSQL invalidates slots past max_slot_wal_keep_size


def _wal_status(dsn: str, slot: str) -> str | None:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
    return row[0] if row else None


def _streaming(config: Any) -> bool:
    return [t["state"] for t in pipeline_status(config)["tables"]] == ["STREAMING"]


def test_retained_wal_is_reported_while_paused(source_dsn: str, tmp_path: Path, spark: Any) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY); CREATE TABLE filler (id serial PRIMARY KEY)")
    # Backpressure at one staged change: once paused, capture stops reading and the slot keeps WAL.
    config = make_config(source_dsn, tmp_path, ["public.items"], "ducklake",
                         source={"max_retained_wal": "4MB"}, staging={"max_pending_rows": 1})
    pipeline = Pipeline(config, spark)
    with running(pipeline):
        wait_until(lambda: readiness(pipeline)[0], 60, "pipeline ready")
        pipeline.operations.paused = True
        with psycopg.connect(source_dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO items SELECT generate_series(1, 10)")
        wait_until(lambda: pipeline.capture is not None and pipeline.capture.paused, 30, "capture held back")
        _more_wal(source_dsn, 2)

        ready, body = readiness(pipeline)
        assert not ready
        assert any("more than source.max_retained_wal (4 MB)" in r for r in body["reasons"]), body
        assert body["wal"]["retained_wal_bytes"] > 4 << 20
        status = pipeline_status(config)
        assert "stopped, paused or behind" in status["wal"]["wal_warning"]
        metrics = {line.split()[0]: float(line.split()[1]) for line in
                   pipeline.metrics.exposition().decode().splitlines() if line and not line.startswith("#")}
        assert metrics["headrace_slot_max_retained_wal_bytes"] == 4 << 20
        assert metrics["headrace_slot_retained_wal_bytes"] > 4 << 20
        assert metrics["headrace_slot_wal_lost"] == 0
        assert 'id="wal-warning"' in render_page(pipeline, auth=False)  # the status page shows it too

        pipeline.operations.paused = False
        _more_wal(source_dsn, 0, checkpoint=True)  # a running-xacts record: the slot's restart point moves on
        wait_until(lambda: readiness(pipeline)[0], 60, "ready again once resumed and caught up")
        assert pipeline_status(config)["wal"]["wal_warning"] is None


@pytest.fixture(scope="module")
def small_wal_server() -> Any:
    """A server of our own that invalidates slots keeping more than 1 MB of WAL."""
    with ThrowawayPostgres(settings={"max_slot_wal_keep_size": "1MB"}) as pg:
        yield pg


def test_lost_slot_is_refused_and_reset_copies_everything_again(small_wal_server: ThrowawayPostgres,
                                                                 tmp_path: Path, spark: Any) -> None:
    dsn = small_wal_server.dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, v text); CREATE TABLE filler (id serial PRIMARY KEY);"
                     "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 30) g")
    raw = raw_config(dsn, tmp_path, ["public.items"], "ducklake")
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw))
    config = parse_config(raw)
    assert Pipeline(config, spark).run(until_caught_up=True) == 0

    # Stopped: changes, then more WAL than the slot may keep, and a checkpoint.
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE items SET v = 'changed' WHERE id <= 10; DELETE FROM items WHERE id > 25;"
                     "INSERT INTO items VALUES (100, 'new')")
    _more_wal(dsn, 3, checkpoint=True)
    assert _wal_status(dsn, config.slot_name) == "lost"
    assert pipeline_status(config)["wal"]["wal_status"] == "lost"

    with pytest.raises(SourceError, match=r"invalidated by PostgreSQL.*headrace reset -c"):
        Pipeline(config, spark).run(until_caught_up=True)

    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    reset = subprocess.run([sys.executable, "-m", "headrace.cli", "reset", "-c", str(path), "--yes"],
                           capture_output=True, text=True, env=env, timeout=120)
    assert reset.returncode == 0, reset.stderr
    pipeline = Pipeline(config, spark)
    assert pipeline.run(until_caught_up=True) == 0
    assert assert_same(pipeline, dsn, "public.items") == 26
    assert _wal_status(dsn, config.slot_name) in ("reserved", "extended")


def test_slot_lost_while_running_stops_the_run(small_wal_server: ThrowawayPostgres, tmp_path: Path,
                                               spark: Any) -> None:
    with psycopg.connect(small_wal_server.dsn, autocommit=True) as conn:
        conn.execute("CREATE DATABASE running_loss")
    dsn = small_wal_server.dsn_for("running_loss")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY); CREATE TABLE filler (id serial PRIMARY KEY)")
    config = make_config(dsn, tmp_path, ["public.items"], "ducklake", name="loss")  # slots are per server
    pipeline = Pipeline(config, spark)
    outcome: dict[str, Any] = {}
    stop = threading.Event()

    def run() -> None:
        try:
            outcome["code"] = pipeline.run(stop=stop)
        except Exception as exc:
            outcome["exc"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    try:
        wait_until(lambda: _streaming(config) or "exc" in outcome, 60, "items copied")
        assert "exc" not in outcome, outcome
        # An open transaction that wrote holds the slot's restart position back while the run goes on.
        with psycopg.connect(dsn) as holder:
            holder.execute("INSERT INTO items VALUES (1)")
            _more_wal(dsn, 3, checkpoint=True)
            wait_until(lambda: _wal_status(dsn, config.slot_name) == "lost", 30, "slot invalidated")
            holder.rollback()
        thread.join(60)
    finally:
        stop.set()
        thread.join(60)
    assert isinstance(outcome.get("exc"), SourceError), outcome
    assert "wal_status = 'lost'" in str(outcome["exc"]) and "headrace reset" in str(outcome["exc"])


def test_check_reports_max_slot_wal_keep_size(small_wal_server: ThrowawayPostgres, source_dsn: str,
                                              tmp_path: Path) -> None:
    from headrace.control.assess import assess_config, format_assessment

    for dsn, expected in [(source_dsn, "unlimited: a stopped or stuck headrace"),
                          (small_wal_server.dsn, "1 MB is not above source.max_retained_wal (10 GB)")]:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS checked (id int PRIMARY KEY)")
        config = make_config(dsn, tmp_path, ["public.checked"])
        text = format_assessment(config.name, assess_config(config))
        assert f"source max_slot_wal_keep_size: {expected}" in text, text
        assert "ALTER SYSTEM SET max_slot_wal_keep_size = '20GB'" in text
