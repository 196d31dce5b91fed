"""Backpressure: capture stops reading WAL while the staged backlog exceeds the bound, keeps its
replication connection alive meanwhile, and resumes once the materializer catches up."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psycopg

from headrace.capture.loop import Capture
from headrace.pipeline import Pipeline
from headrace.source.postgres.throwaway import ThrowawayPostgres
from tests.e2e.helpers import make_config

TXNS, ROWS_PER_TXN = 40, 25


def _wait(condition: object, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _slot_pid(dsn: str, slot: str) -> int | None:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
    return row[0] if row else None


def test_capture_pauses_over_the_bound_and_resumes(source_dsn: str, pg_server: ThrowawayPostgres,
                                                   tmp_path: Path) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
    config = make_config(source_dsn, tmp_path, ["public.items"], target="ducklake",
                         staging={"max_pending_rows": 100, "flush_rows": 50, "flush_seconds": 0.2})
    state = Pipeline(config).setup()
    (row,) = state.tables()
    capture = Capture(config, source_dsn, source_dsn, {row.oid: row.schema})
    stop = threading.Event()
    thread = threading.Thread(target=capture.run, args=(stop,))
    with psycopg.connect(pg_server.dsn, autocommit=True) as admin:
        # A short sender timeout: a paused capture that stopped answering would be cut off.
        admin.execute("ALTER SYSTEM SET wal_sender_timeout = '2s'")
        admin.execute("SELECT pg_reload_conf()")
    try:
        thread.start()
        with psycopg.connect(source_dsn, autocommit=True) as conn:
            for t in range(TXNS):
                with conn.transaction():
                    for i in range(ROWS_PER_TXN):
                        conn.execute("INSERT INTO items VALUES (%s, repeat('x', 100))", (t * ROWS_PER_TXN + i,))
                time.sleep(0.05)
            end = conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()[0]  # type: ignore[index]
        _wait(lambda: capture.paused, 20, "capture never paused")
        pid = _slot_pid(source_dsn, config.slot_name)
        time.sleep(6)  # three sender timeouts
        assert capture.paused and capture.last_error is None
        assert _slot_pid(source_dsn, config.slot_name) == pid  # same connection, never cut off
        pending_rows, _ = state.log_index.pending_totals()
        assert 100 < pending_rows < TXNS * ROWS_PER_TXN  # over the bound (by at most a read), not all
        assert capture.captured_lsn < end

        # The materializer applies (the cursor moves): capture reads on, until everything is staged.
        def drained() -> bool:
            state.log_index.advance(row.oid, state.log_index.last_offset(row.oid), 0, 0)
            capture.request_heartbeat()
            return capture.captured_lsn >= end

        _wait(drained, 60, "capture did not resume")
        assert capture.last_error is None
        staged = state.conn.execute("SELECT sum(rows) AS n FROM _headrace.log_index WHERE pipeline = %s",
                                    (config.name,)).fetchone()
        assert staged is not None and staged["n"] == TXNS * ROWS_PER_TXN
    finally:
        stop.set()
        thread.join(30)
        state.close()
        with psycopg.connect(pg_server.dsn, autocommit=True) as admin:
            admin.execute("ALTER SYSTEM RESET wal_sender_timeout")
            admin.execute("SELECT pg_reload_conf()")
