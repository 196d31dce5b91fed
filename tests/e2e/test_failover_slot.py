"""A failover slot (PostgreSQL 17+, here 18) across a promotion: the standby keeps a synchronized copy
of headrace's slot (``sync_replication_slots``); the primary stops, the standby is promoted, and the
pipeline pointed at it continues from that slot: no table copied again, the target equal to the new
primary (nothing lost, nothing twice). The slot lost with a failover before 17: test_failover.py."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import psycopg
import pytest

from headrace.pipeline import Pipeline
from headrace.source.postgres.throwaway import ThrowawayPostgres
from tests.e2e.helpers import (
    assert_same,
    create_items_and_lines,
    make_config,
    running,
    wait_until,
    workload,
)
from tests.e2e.test_pipeline import run_caught_up
from tests.e2e.test_standby_source import TABLES, _streaming


def _synced(standby_dsn: str, slot: str) -> bool:
    with psycopg.connect(standby_dsn, autocommit=True) as conn:
        row = conn.execute("SELECT synced AND NOT temporary AND invalidation_reason IS NULL FROM pg_replication_slots"
                           " WHERE slot_name = %s", (slot,)).fetchone()
    return bool(row and row[0])


@pytest.mark.slow  # ~30 s (the standby synchronizes the slot on its own schedule); the slot is a failover
# slot: tests/source/postgres/test_versions.py
def test_a_promoted_standby_continues_from_the_synchronized_failover_slot_without_a_copy(
    tmp_path: Path, spark: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with ThrowawayPostgres(version=18) as primary:
        with psycopg.connect(primary.dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_create_physical_replication_slot('standby1', true)")
            # A failover slot's changes reach headrace only once the standby has their WAL.
            conn.execute("ALTER SYSTEM SET synchronized_standby_slots = 'standby1'")
            conn.execute("SELECT pg_reload_conf()")
        create_items_and_lines(primary.dsn, 1000)
        standby = ThrowawayPostgres(settings={
            "primary_slot_name": "standby1", "sync_replication_slots": "on", "hot_standby_feedback": "on",
            "primary_conninfo": f"host=127.0.0.1 port={primary.port} user=postgres dbname=postgres",
            "synchronized_standby_slots": "",  # not the primary's, copied by pg_basebackup: no standby of its own
        }).start_standby(primary)
        try:
            # The state in the source database, as by default: it reaches the standby by replication too.
            config = make_config(primary.dsn, tmp_path, TABLES, "ducklake")
            pipeline = Pipeline(config, spark=spark)
            with workload(primary.dsn, seed=17), running(pipeline):
                wait_until(lambda: _streaming(primary.dsn), 120, "the tables never reached STREAMING")
                wait_until(lambda: _synced(standby.dsn, config.slot_name), 60, "the slot was never synchronized")
            with psycopg.connect(primary.dsn, autocommit=True) as conn:  # changes headrace has not read
                conn.execute("INSERT INTO items SELECT g, 1, 'after' FROM generate_series(500000, 500099) g;"
                             " UPDATE items SET v = v + 100 WHERE id <= 50;"
                             " DELETE FROM lines WHERE order_id BETWEEN 100 AND 120")
            primary.stop_server("fast")  # the standby receives all WAL before a fast shutdown completes
            standby.promote()
            promoted = make_config(standby.dsn, tmp_path, TABLES, "ducklake")
            after = Pipeline(promoted, spark=spark)
            caplog.clear()  # the first run's copy
            with caplog.at_level(logging.INFO, logger="headrace"):
                run_caught_up(after)
            copies = [r for r in caplog.records if r.getMessage() == "snapshot.start"]
            assert copies == [], "a table was copied again after the failover"
            assert assert_same(after, standby.dsn, "public.items") > 500
            assert assert_same(after, standby.dsn, "public.lines") > 500
        finally:
            standby.stop()
