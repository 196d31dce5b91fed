"""A PostgreSQL 18 hot standby as the source (16+): ``check`` names what the standby and the settings
lack, and a pipeline reading a standby made by ``pg_basebackup`` from a primary under a workload
ends equal to the primary. The refusal of a standby on 15: tests/source/postgres/test_standby.py."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg

from headrace.control.assess import assess_config
from headrace.pipeline import Pipeline
from headrace.source.postgres.standby import replay_until
from headrace.source.postgres.throwaway import ThrowawayPostgres
from headrace.state.lifecycle import TableState
from headrace.state.store import StateStore
from tests.e2e.helpers import (
    assert_same,
    create_items_and_lines,
    make_config,
    raw_config,
    run_command,
    running,
    wait_until,
    wal_insert_lsn,
    workload,
)
from tests.e2e.test_pipeline import run_caught_up

TABLES = ["public.items", "public.lines"]


def _streaming(state_dsn: str) -> bool:
    state = StateStore(state_dsn, "t")
    try:
        rows = state.tables()
    except psycopg.errors.UndefinedTable:
        return False  # not installed yet
    finally:
        state.close()
    return len(rows) == len(TABLES) and all(r.state is TableState.STREAMING for r in rows)


def test_check_and_run_on_a_standby_name_feedback_state_and_publication_with_their_fixes(tmp_path: Path) -> None:
    with ThrowawayPostgres(version=18) as primary:
        create_items_and_lines(primary.dsn, 10)
        standby = ThrowawayPostgres().start_standby(primary)  # hot_standby_feedback off, PostgreSQL's default
        try:
            problems = assess_config(make_config(standby.dsn, tmp_path, TABLES, "ducklake"))["problems"]
            text = "\n".join(problems)
            assert "hot_standby_feedback = on" in text, text
            assert "set source.state_dsn" in text, text
            assert ("publication headrace_t does not exist on the standby, which cannot change it: create it on"
                    " the primary (CREATE PUBLICATION \"headrace_t\" FOR TABLE public.items, public.lines WITH"
                    " (publish_via_partition_root = true, publish_generated_columns = stored))") in text, text
            # run, with the state elsewhere but no publication: the same sentence, no read-only traceback.
            raw = raw_config(standby.dsn, tmp_path, TABLES, "ducklake", source={"state_dsn": primary.dsn})
            ran = subprocess.run(run_command(raw, tmp_path), capture_output=True, text=True, timeout=120)
            assert ran.returncode == 1 and "Traceback" not in ran.stderr, ran.stderr[-3000:]
            assert "publication headrace_t does not exist on the standby" in ran.stderr, ran.stderr[-3000:]
            with psycopg.connect(primary.dsn, autocommit=True) as conn:
                conn.execute("CREATE PUBLICATION headrace_t FOR TABLE items, lines"
                             " WITH (publish_via_partition_root = true)")
                conn.execute("ALTER SYSTEM SET wal_level = replica")  # not yet in force
            with psycopg.connect(standby.dsn, autocommit=True) as conn:
                replay_until(conn, wal_insert_lsn(primary.dsn))
            config = make_config(standby.dsn, tmp_path, TABLES, "ducklake",
                                 source={"state_dsn": primary.dsn, "primary_dsn": standby.dsn})
            text = "\n".join(assess_config(config)["problems"])
            assert "publication" not in text and "state_dsn" not in text, text
            assert "is a standby too: point it at the primary" in text, text
        finally:
            standby.stop()


def test_run_on_a_standby_of_a_primary_without_logical_wal_stops_naming_the_fix(tmp_path: Path) -> None:
    with ThrowawayPostgres(version=18, settings={"wal_level": "replica"}) as primary:
        create_items_and_lines(primary.dsn, 10)
        with psycopg.connect(primary.dsn, autocommit=True) as conn:
            conn.execute("CREATE PUBLICATION headrace_t FOR TABLE items, lines WITH (publish_via_partition_root = true)")
        standby = ThrowawayPostgres(settings={"wal_level": "logical", "hot_standby_feedback": "on"}).start_standby(primary)
        try:
            raw = raw_config(standby.dsn, tmp_path, TABLES, "ducklake", source={"state_dsn": primary.dsn})
            ran = subprocess.run(run_command(raw, tmp_path), capture_output=True, text=True, timeout=120)
        finally:
            standby.stop()
    assert ran.returncode == 1 and "Traceback" not in ran.stderr, ran.stderr[-3000:]
    assert "cannot create replication slot headrace_t" in ran.stderr, ran.stderr[-3000:]
    assert "set wal_level = logical in the primary's postgresql.conf and restart it" in ran.stderr, ran.stderr[-3000:]


def test_a_standby_of_a_primary_under_load_copies_and_streams_to_equal_the_primary(
    tmp_path: Path, spark: Any
) -> None:
    with ThrowawayPostgres(version=18) as primary:
        create_items_and_lines(primary.dsn, 2000)
        with workload(primary.dsn, seed=41):
            standby = ThrowawayPostgres(settings={"hot_standby_feedback": "on"}).start_standby(primary)
            try:
                # The state and the publication on the primary; the slot, the copy and the stream on the standby.
                config = make_config(standby.dsn, tmp_path, TABLES, "ducklake",
                                     source={"state_dsn": primary.dsn, "primary_dsn": primary.dsn})
                assert assess_config(config)["problems"] == []
                pipeline = Pipeline(config, spark=spark)
                with running(pipeline):
                    wait_until(lambda: _streaming(primary.dsn), 120, "the tables never reached STREAMING")
                    time.sleep(2)  # changes go on while streaming
            except BaseException:
                standby.stop()
                raise
        try:
            with psycopg.connect(standby.dsn, autocommit=True) as conn:
                slot = conn.execute("SELECT slot_type, database FROM pg_replication_slots WHERE slot_name = %s",
                                    (config.slot_name,)).fetchone()
                replay_until(conn, wal_insert_lsn(primary.dsn))
            assert slot == ("logical", "postgres")  # on the standby
            run_caught_up(pipeline)
            assert assert_same(pipeline, primary.dsn, "public.items") > 1000
            assert assert_same(pipeline, primary.dsn, "public.lines") > 1000
        finally:
            standby.stop()
