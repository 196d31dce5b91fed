"""Outages: the source, state or DuckLake catalog server restarts, crashes or stays down; the staging
disk fills up; a copy is cut short.

Each server test runs its own PostgreSQL (never the session's shared one) under a continuous
small mixed workload: the server is restarted fast, crashed (``pg_ctl stop -m immediate``, then
started) and kept down for longer than the backoff cap (``reconnect.max_seconds``, 1 s here). The
run never exits, reports the outage (``/readyz`` 503 with the reason, ``headrace_source_up`` 0),
and the target ends equal to the source: no change lost, none applied twice. The full-disk test
mounts a 16 MB tmpfs as the staging directory (skipped, saying why, where mounting is not allowed).
DuckLake is the target of these tests (its apply is the faster one); the outage handling is the
run loop's and capture's, the same for Iceberg.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import random
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from headrace.config import parse_config
from headrace.control.health import readiness
from headrace.pipeline import Pipeline
from headrace.source.postgres.throwaway import ThrowawayPostgres
from headrace.state.lifecycle import TableState
from headrace.state.progress import ProgressStore
from headrace.state.store import StateStore
from tests.conftest import server_of
from tests.e2e.helpers import (
    assert_built_by_spark,
    assert_same,
    create_items_and_lines,
    raw_config,
    running,
    wait_until,
    wal_insert_lsn,
)

TABLES = ("public.items", "public.lines")
CAP_SECONDS = 1.0
RECONNECT = {"first_seconds": 0.2, "max_seconds": CAP_SECONDS, "connect_timeout_seconds": 2}


@pytest.fixture
def own_server(tmp_path: Path, pg_version: int) -> Iterator[ThrowawayPostgres]:
    """A PostgreSQL server this test may restart, crash and stop (of the tests' source version)."""
    with server_of(pg_version) as server:
        yield server


@contextlib.contextmanager
def resilient_workload(dsn: str, seed: int) -> Iterator[list[int]]:
    """Small mixed transactions over items and lines in a thread, reconnecting whenever the server is
    gone; yields a one-item list counting committed transactions."""
    stop = threading.Event()
    committed = [0]
    ids = itertools.count(100_000)  # never reused, even for a transaction whose commit was in doubt

    def write() -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            try:
                with psycopg.connect(dsn, autocommit=True, connect_timeout=2) as conn:
                    while not stop.is_set():
                        with conn.transaction():
                            for _ in range(rng.randint(1, 5)):
                                some, roll = rng.randint(1, 300), rng.random()
                                if roll < 0.3:
                                    new = next(ids)
                                    conn.execute("INSERT INTO items VALUES (%s, 0, 'new')", (new,))
                                    conn.execute("INSERT INTO lines VALUES (%s, 1, 1)", (new,))
                                elif roll < 0.7:
                                    conn.execute("UPDATE items SET v = v + 1 WHERE id = %s", (some,))
                                    conn.execute(
                                        "UPDATE lines SET qty = qty + 1 WHERE order_id = %s", (some,)
                                    )
                                elif roll < 0.85:
                                    conn.execute("DELETE FROM items WHERE id = %s", (some,))
                                    conn.execute(
                                        "DELETE FROM lines WHERE order_id = %s AND line = 2", (some,)
                                    )
                                else:
                                    conn.execute("UPDATE items SET id = %s WHERE id = %s", (next(ids), some))
                        committed[0] += 1
                        time.sleep(0.02)
            except psycopg.OperationalError:
                stop.wait(0.1)  # the server is going or gone: try again

    writer = threading.Thread(target=write, name="resilient-workload")
    writer.start()
    try:
        yield committed
    finally:
        stop.set()
        writer.join()


def _streaming(state_dsn: str, name: str) -> bool:
    with contextlib.suppress(psycopg.Error):  # not installed yet, or the server is restarting
        state = StateStore(state_dsn, name)
        try:
            return len(state.tables()) == 2 and all(r.state is TableState.STREAMING for r in state.tables())
        finally:
            state.close()
    return False


def _more_commits(committed: list[int], n: int = 20) -> None:
    """Let the workload commit ``n`` more transactions (changes in flight across the next outage)."""
    start = committed[0]
    wait_until(lambda: committed[0] >= start + n, 60, "the workload does not commit")


def _back(pipeline: Pipeline) -> None:
    wait_until(
        lambda: (
            pipeline.capture is not None
            and pipeline.capture.connected
            and pipeline.outage.up("source")
            and pipeline.outage.up("state")
        ),
        60,
        "the run did not reconnect",
    )


def _converges(pipeline: Pipeline, dsn: str) -> None:
    end = wal_insert_lsn(dsn)
    wait_until(
        lambda: pipeline.capture is not None and pipeline.capture.captured_lsn >= end,
        60,
        "capture did not catch up after the outages",
    )
    for table in TABLES:
        wait_until(lambda t=table: assert_same(pipeline, dsn, t) > 250, 120, f"{table} did not converge")


def _reports_outage(pipeline: Pipeline, role: str) -> None:
    """While ``role`` is down: /readyz is 503 with the reason, and (for the source) source_up is 0."""
    wait_until(lambda: not pipeline.outage.up(role), 30, f"the run did not notice the {role} server is down")
    ready, body = readiness(pipeline)
    assert not ready and any(f"the {role} server" in r for r in body["reasons"]), body
    if role == "source":
        assert b"headrace_source_up 0.0" in pipeline.metrics.exposition()
    # Over HTTP too: 503 with the reason, not a 500 (the status reads the source and the state).
    for path in ("/readyz", "/api/status") if role in ("source", "state") else ("/readyz",):
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(f"http://{pipeline.api_address}{path}", timeout=30)
        assert answer.value.code == 503 and f"the {role} server" in answer.value.read().decode(), path


@pytest.mark.parametrize("engine", ["auto", "spark"])
def test_source_restarted_crashed_and_kept_down_while_streaming(
    own_server: ThrowawayPostgres, tmp_path: Path, spark: Any, engine: str
) -> None:
    dsn = own_server.dsn
    create_items_and_lines(dsn, 300)
    config = parse_config(
        raw_config(
            dsn, tmp_path, list(TABLES), target="ducklake", reconnect=RECONNECT, api={"listen": "127.0.0.1:0"},
            engine=engine,
        )
    )
    pipeline = Pipeline(config, spark=spark)
    with running(pipeline):
        wait_until(lambda: _streaming(dsn, config.name), 180, "the tables never reached STREAMING")
        with resilient_workload(dsn, seed=1) as committed:
            _more_commits(committed)
            own_server.restart("fast")
            _back(pipeline)
            _more_commits(committed)
            own_server.stop_server("immediate")  # a crash: the server recovers from WAL at start
            own_server.start_server()
            _back(pipeline)
            _more_commits(committed)
            own_server.stop_server("fast")
            _reports_outage(pipeline, "source")
            time.sleep(4 * CAP_SECONDS)  # down for longer than the backoff cap: the waits stay at the cap
            own_server.start_server()
            _back(pipeline)
            _more_commits(committed)
        # The outage kept down past the cap is always waited out by the loop; a fast restart or a
        # crash that falls between two passes of an idle loop (it waits on a wake-up, up to
        # apply.idle_max_seconds) is ridden out by capture alone, so they may count as one or none.
        assert pipeline.outage.outages >= 1, "the run loop never waited out an outage"
        _converges(pipeline, dsn)
        if engine == "spark":
            assert_built_by_spark(pipeline)


def test_state_server_separate_from_the_source_restarted_and_kept_down(
    own_server: ThrowawayPostgres, tmp_path: Path, spark: Any
) -> None:
    dsn = own_server.dsn
    create_items_and_lines(dsn, 300)
    with ThrowawayPostgres() as state_server:
        state_dsn = state_server.dsn
        raw = raw_config(
            dsn, tmp_path, list(TABLES), target="ducklake", reconnect=RECONNECT, api={"listen": "127.0.0.1:0"}
        )
        raw["source"]["state_dsn"] = state_dsn
        config = parse_config(raw)
        pipeline = Pipeline(config, spark=spark)
        with running(pipeline):
            wait_until(lambda: _streaming(state_dsn, config.name), 180, "the tables never reached STREAMING")
            with resilient_workload(dsn, seed=2) as committed:
                _more_commits(committed)
                state_server.restart("fast")
                _back(pipeline)
                _more_commits(committed)
                state_server.stop_server("immediate")
                _reports_outage(pipeline, "state")
                time.sleep(4 * CAP_SECONDS)
                state_server.start_server()
                _back(pipeline)
                _more_commits(committed)
                own_server.stop_server("immediate")  # and the source crashes, the state server up
                own_server.start_server()
                _back(pipeline)
                _more_commits(committed)
            _converges(pipeline, dsn)


def _mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a full staging disk needs a small tmpfs: run the test as root (mount -t tmpfs)")
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs for the full-disk test: {proc.stderr.strip()}")


@contextlib.contextmanager
def full_disk(path: Path) -> Iterator[None]:
    """Keep the filesystem at ``path`` full for the block (space freed meanwhile, e.g. by the staging
    GC, is taken again at once); free it all on leaving."""
    filler = path / "filler"
    stop = threading.Event()
    full = threading.Event()

    def fill() -> None:
        with filler.open("wb", buffering=0) as fh:
            while not stop.is_set():
                try:
                    fh.write(b"\0" * 4096)
                except OSError:
                    full.set()
                    stop.wait(0.02)

    thread = threading.Thread(target=fill, name="disk-filler")
    thread.start()
    try:
        assert full.wait(30), "could not fill the staging filesystem"
        yield
    finally:
        stop.set()
        thread.join()
        filler.unlink()


def test_a_full_staging_disk_pauses_capture_until_space_returns(
    source_dsn: str, tmp_path: Path, spark: Any
) -> None:
    staging = tmp_path / "staging"
    _mount_tmpfs(staging, "16m")
    try:
        create_items_and_lines(source_dsn, 300)
        config = parse_config(
            raw_config(
                source_dsn,
                tmp_path,
                list(TABLES),
                target="ducklake",
                reconnect=RECONNECT,
                api={"listen": "127.0.0.1:0"},
            )
        )
        pipeline = Pipeline(config, spark=spark)
        with running(pipeline):
            wait_until(lambda: _streaming(source_dsn, config.name), 180, "the tables never reached STREAMING")
            with resilient_workload(source_dsn, seed=3) as committed:
                _more_commits(committed)
                capture = pipeline.capture
                assert capture is not None
                with full_disk(staging):
                    wait_until(
                        lambda: capture.storage_error is not None,
                        60,
                        "capture did not pause on the full staging disk",
                    )
                    ready, body = readiness(pipeline)
                    assert not ready and any("cannot take files" in r for r in body["reasons"]), body
                    paused_at = capture.captured_lsn
                    _more_commits(committed, 100)  # these wait in the slot
                    assert capture.storage_error is not None and capture.captured_lsn == paused_at
                wait_until(
                    lambda: capture.storage_error is None and capture.captured_lsn > paused_at,
                    60,
                    "capture did not resume once space returned",
                )
                _more_commits(committed)
            _converges(pipeline, source_dsn)
    finally:
        subprocess.run(["umount", "-l", str(staging)], check=False)


def test_ducklake_catalog_server_restarted_and_kept_down(
    own_server: ThrowawayPostgres, source_dsn: str, tmp_path: Path, spark: Any
) -> None:
    """The target side: the DuckLake catalog's PostgreSQL restarts and stays down a while; capture
    goes on staging, apply waits, and the lake is attached anew once the catalog answers."""
    create_items_and_lines(source_dsn, 300)
    raw = raw_config(
        source_dsn,
        tmp_path,
        list(TABLES),
        target="ducklake",
        reconnect=RECONNECT,
        api={"listen": "127.0.0.1:0"},
    )
    raw["target"]["ducklake"]["catalog"] = (
        f"postgres:host=127.0.0.1 port={own_server.port} user=postgres dbname=postgres"
    )
    config = parse_config(raw)
    pipeline = Pipeline(config, spark=spark)
    with running(pipeline):
        wait_until(lambda: _streaming(source_dsn, config.name), 180, "the tables never reached STREAMING")
        with resilient_workload(source_dsn, seed=4) as committed:
            _more_commits(committed)
            own_server.restart("fast")
            _more_commits(committed)
            own_server.stop_server("immediate")
            _reports_outage(pipeline, "ducklake catalog")
            _more_commits(committed)  # staged meanwhile: capture does not depend on the lake
            own_server.start_server()
            _more_commits(committed)
        wait_until(lambda: pipeline.outage.up("ducklake catalog"), 60, "the run did not see the catalog back")
        _converges(pipeline, source_dsn)


def _chunks(dsn: str) -> tuple[int, int]:
    """(chunks done, chunks planned) of the copy under way; (0, 0) when unknown."""
    with contextlib.suppress(psycopg.Error):
        store = ProgressStore(dsn, "t")
        try:
            progress = list(store.progress().values())
        finally:
            store.close()
        if progress:
            return progress[0].chunks_done, progress[0].chunks_total
    return 0, 0


def test_a_copy_cut_short_by_a_source_restart_resumes_by_chunk(own_server: ThrowawayPostgres, tmp_path: Path,
                                                               spark: Any, caplog: pytest.LogCaptureFixture,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    dsn = own_server.dsn
    # Each chunk's read holds 0.5 s, so the restart lands mid-copy however fast the reads are.
    monkeypatch.setenv("HEADRACE_HOLD_AT", "snapshot.read:0.5")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE big (id bigint PRIMARY KEY, pad text)")
        conn.execute("INSERT INTO big SELECT g, repeat('x', 200) FROM generate_series(1, 10000) g")
    # About 300 heap pages: 8 chunks of 40 pages, one chunk per Spark job.
    raw = raw_config(dsn, tmp_path, ["public.big"], target="ducklake", reconnect=RECONNECT,
                     api={"listen": "127.0.0.1:0"}, snapshot={"chunk_pages": 40, "max_connections": 1})
    pipeline = Pipeline(parse_config(raw), spark=spark)
    with caplog.at_level(logging.INFO, logger="headrace"), running(pipeline):
        wait_until(lambda: 2 <= _chunks(dsn)[0] < _chunks(dsn)[1] - 3, 120, "the copy did not get under way")
        own_server.restart("fast")
        wait_until(lambda: _streaming_one(dsn), 180, "the table never reached STREAMING after the restart")
        assert assert_same(pipeline, dsn, "public.big") == 10_000
    starts = [r for r in caplog.records if r.getMessage() == "snapshot.start"]
    assert any(getattr(r, "resume", False) and getattr(r, "chunks_todo", 0) < getattr(r, "chunks", 0)
               for r in starts), [(getattr(r, "resume", None), getattr(r, "chunks_todo", None)) for r in starts]


def _streaming_one(dsn: str) -> bool:
    with contextlib.suppress(psycopg.Error):
        state = StateStore(dsn, "t")
        try:
            return [r.state for r in state.tables()] == [TableState.STREAMING]
        finally:
            state.close()
    return False


def test_a_slot_psycopg2_confirmed_past_untracked_writes_is_taken_as_ours(own_server: ThrowawayPostgres,
                                                                          tmp_path: Path, spark: Any) -> None:
    """Writes to tables the pipeline does not track move the WAL with nothing to send. psycopg2
    forwards the slot's confirmation to the keepalives' wal_end and sends it when the server asks
    (after ``wal_sender_timeout / 2`` without news, 0.5 s here with no heartbeats; when it restarts).
    The slot then stands beyond what capture acknowledged: a reconnection after a restart and a new
    run both take it as this pipeline's, not as moved by someone else (CI saw that refusal). With
    no heartbeats, the copied table reaches STREAMING because the apply loop asks capture for one."""
    dsn = own_server.dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER DATABASE postgres SET wal_sender_timeout = '1s'")
        conn.execute("CREATE TABLE kept (id int PRIMARY KEY, v text)")
        conn.execute("CREATE TABLE other (id int PRIMARY KEY, pad text)")
        conn.execute("INSERT INTO kept SELECT g, 'x' FROM generate_series(1, 50) g")
    raw = raw_config(dsn, tmp_path, ["public.kept"], target="ducklake", reconnect=RECONNECT,
                     api={"listen": "127.0.0.1:0"}, staging={"heartbeat_seconds": 3600})

    def untracked_writes(first: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for i in range(first, first + 50):
                conn.execute("INSERT INTO other VALUES (%s, repeat('y', 500))", (i,))
            before = conn.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0]  # type: ignore[index]
            wait_until(lambda: conn.execute("SELECT confirmed_flush_lsn >= %s FROM pg_replication_slots"
                                            " WHERE slot_name = 'headrace_t'", (before,)).fetchone()[0],  # type: ignore[index]
                       30, "psycopg2 never confirmed the slot past the untracked writes")

    pipeline = Pipeline(parse_config(raw), spark=spark)
    with running(pipeline):
        wait_until(lambda: _streaming_one(dsn), 180, "the table never reached STREAMING")
        wait_until(lambda: assert_same(pipeline, dsn, "public.kept") == 50, 60, "the copy did not land")
        untracked_writes(0)
        own_server.restart("fast")
        _back(pipeline)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO kept VALUES (51, 'after a restart')")
        wait_until(lambda: assert_same(pipeline, dsn, "public.kept") == 51, 60, "kept did not converge")
        untracked_writes(100)
    pipeline = Pipeline(parse_config(raw), spark=spark)  # a new run checks the slot at start-up
    with running(pipeline):
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO kept VALUES (52, 'in a new run')")
        wait_until(lambda: assert_same(pipeline, dsn, "public.kept") == 52, 60, "kept did not converge")
