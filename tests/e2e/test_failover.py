"""Failover: a slot lost with the old primary is found, at a reconnection and by ``headrace check``.

A physical standby promoted before PostgreSQL 17 has no copy of the slot; dropping the slot while
capture is disconnected is what capture and ``check`` then see. Capture stops with the start-up
check's message (streaming on from a new slot would skip changes silently), and ``check`` lists it.
"""

from __future__ import annotations

import threading
from pathlib import Path

import psycopg

from headrace.capture.loop import Capture
from headrace.control.assess import assess_config
from headrace.pipeline import Pipeline
from tests.e2e.helpers import create_items_and_lines, make_config, slot_position, wait_until


def _drop_slot(dsn: str, slot: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = %s"
                     " AND active_pid IS NOT NULL", (slot,))
        wait_until(lambda: conn.execute("SELECT NOT active FROM pg_replication_slots WHERE slot_name = %s",
                                        (slot,)).fetchone() == (True,), 30, "the walsender did not go")
        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


def test_a_slot_lost_while_disconnected_stops_capture_and_check_names_it(source_dsn: str, tmp_path: Path) -> None:
    create_items_and_lines(source_dsn, 10)
    # A long first wait: the slot is dropped before capture reconnects.
    config = make_config(source_dsn, tmp_path, ["public.items"], target="ducklake",
                         reconnect={"first_seconds": 3, "max_seconds": 3})
    state = Pipeline(config).setup()
    capture = Capture(config, source_dsn, source_dsn, {r.oid: r.schema for r in state.tables()})
    stop = threading.Event()
    raised: list[BaseException] = []

    def run() -> None:
        try:
            capture.run(stop)
        except Exception as exc:  # what the run loop would see: capture stopped, and why
            raised.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        wait_until(lambda: capture.connected and slot_position(source_dsn, config.slot_name)[0] is not None, 30,
                   "capture never streamed")
        _drop_slot(source_dsn, config.slot_name)
        thread.join(30)
        assert not thread.is_alive(), "capture kept retrying on a lost slot"
        assert "no longer exists" in (capture.last_error or ""), capture.last_error
        assert raised and "no longer exists" in str(raised[0])
    finally:
        stop.set()
        thread.join(30)
        state.close()
    problems = assess_config(config)["problems"]
    assert any(f"replication slot {config.slot_name}" in p and "no longer exists" in p for p in problems), problems
