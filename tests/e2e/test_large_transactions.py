"""Transactions streamed while in progress (pgoutput protocol 2, PostgreSQL 14+), on 15 and 18.

The source's ``logical_decoding_work_mem`` is set to its floor (64kB) on the test's database, so a
transaction of a few thousand rows is streamed in blocks, and ``staging.flush_bytes`` is small, so
capture spills them to files: the whole path (blocks, spill files, a subtransaction's abort, the
commit's registration, a whole transaction's abort) runs on a light test. The server's own count of
streamed transactions (``pg_stat_replication_slots``) shows they were streamed, not sent at commit;
the target is read back with DuckDB and compared with the source row by row.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from headrace.config import parse_config
from headrace.pipeline import Pipeline
from tests.e2e.helpers import assert_same, make_config, raw_config, run_command, wait_until
from tests.e2e.test_pipeline import run_caught_up

BOTH = pytest.mark.pg_versions(15, 18)
SMALL = {"flush_bytes": 256 << 10}  # spill every ~256 KiB staged: spill files even for a light test


def _stream_small(dsn: str) -> None:
    """Make the server stream any transaction over 64kB of decoded changes (its floor)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        name = conn.info.dbname
        conn.execute(f'ALTER DATABASE "{name}" SET logical_decoding_work_mem = \'64kB\'')
        conn.execute("CREATE TABLE big (id bigint PRIMARY KEY, v int, note text)")


def _streamed_count(dsn: str) -> int:
    """Transactions the server streamed while in progress through this database's slots."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT coalesce(sum(s.stream_txns), 0) FROM pg_stat_replication_slots s"
                           " JOIN pg_replication_slots r USING (slot_name) WHERE r.database = current_database()"
                           ).fetchone()
    assert row is not None
    return int(row[0])


def _transactions(dsn: str, rows: int) -> None:
    """A committed insert and update of ``rows`` rows, an aborted insert, and a savepoint rolled back."""
    half = rows // 2
    with psycopg.connect(dsn) as conn:
        conn.execute("INSERT INTO big SELECT g, 0, repeat('x', 40) FROM generate_series(1, %s::bigint) g", (rows,))
        conn.execute("UPDATE big SET v = v + 1, note = md5(id::text) WHERE id <= %s", (half,))
        conn.commit()
        conn.execute("INSERT INTO big SELECT g, -1, 'aborted' FROM generate_series(%s::bigint, %s::bigint) g", (rows + 1, 2 * rows))
        conn.rollback()
        conn.execute("UPDATE big SET v = 2 WHERE id <= %s", (half,))
        conn.execute("SAVEPOINT s")
        conn.execute("INSERT INTO big SELECT g, -2, 'rolled back' FROM generate_series(%s::bigint, %s::bigint) g",
                     (2 * rows + 1, 2 * rows + half))
        conn.execute("DELETE FROM big WHERE id > %s", (half,))
        conn.execute("ROLLBACK TO SAVEPOINT s")
        conn.execute("UPDATE big SET v = 3 WHERE id > %s", (rows - 100,))
        conn.commit()


def _spill_files(staging: Path) -> list[Path]:
    return [p for p in staging.rglob("_streamed/*/*") if p.is_file()]


def _check(pipeline: Pipeline, dsn: str, rows: int, staging: Path) -> None:
    assert assert_same(pipeline, dsn, "public.big") == rows
    with psycopg.connect(dsn) as conn:
        kept = conn.execute("SELECT count(*) FILTER (WHERE v = 2), count(*) FILTER (WHERE v < 0) FROM big").fetchone()
    assert kept == (rows // 2, 0)
    assert _spill_files(staging) == [], "spill files left behind"


@BOTH
def test_streamed_transactions_commit_abort_and_roll_back_a_savepoint(source_dsn: str, pg_version: int,
                                                                       tmp_path: Path, spark: Any) -> None:
    _stream_small(source_dsn)
    pipeline = Pipeline(make_config(source_dsn, tmp_path, ["public.big"], "ducklake", staging=SMALL), spark=spark)
    run_caught_up(pipeline)  # the copy of the empty table; the slot exists from here
    _transactions(source_dsn, 10_000)
    run_caught_up(pipeline)
    # The committed and the savepoint's transactions; 18 does not stream a transaction it already
    # knows aborted (decoded after its rollback, as here), 15 does.
    assert _streamed_count(source_dsn) >= (3 if pg_version < 18 else 2)
    _check(pipeline, source_dsn, 10_000, tmp_path / "staging")


def test_protocol_1_when_streaming_is_off(source_dsn: str, tmp_path: Path, spark: Any) -> None:
    _stream_small(source_dsn)
    config = make_config(source_dsn, tmp_path, ["public.big"], "ducklake", staging=SMALL,
                         source={"stream_transactions": False})
    pipeline = Pipeline(config, spark=spark)
    run_caught_up(pipeline)
    _transactions(source_dsn, 5_000)
    run_caught_up(pipeline)
    assert _streamed_count(source_dsn) == 0
    _check(pipeline, source_dsn, 5_000, tmp_path / "staging")


@BOTH
@pytest.mark.slow  # 80-120 s a version (loaded machine); the same path at 10K rows runs unmarked above
def test_streamed_transactions_of_200k_rows(source_dsn: str, pg_version: int, tmp_path: Path, spark: Any) -> None:
    _stream_small(source_dsn)
    pipeline = Pipeline(make_config(source_dsn, tmp_path, ["public.big"], "ducklake"), spark=spark)
    run_caught_up(pipeline)
    _transactions(source_dsn, 200_000)
    run_caught_up(pipeline, timeout=600)
    assert _streamed_count(source_dsn) >= (3 if pg_version < 18 else 2)
    _check(pipeline, source_dsn, 200_000, tmp_path / "staging")


@BOTH
def test_kill_9_in_the_middle_of_a_streamed_transaction(source_dsn: str, pg_version: int, tmp_path: Path,
                                                        spark: Any) -> None:
    _stream_small(source_dsn)
    raw = raw_config(source_dsn, tmp_path, ["public.big"], "ducklake", staging=SMALL)
    staging = tmp_path / "staging"
    log_path = tmp_path / "run.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(run_command(raw, tmp_path), stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: "capture.start" in log_path.read_text(), 120, "capture to start")
        with psycopg.connect(source_dsn) as conn:
            conn.execute("INSERT INTO big SELECT g, 0, 'before' FROM generate_series(1, 1000) g")
            conn.commit()
            next_id = 1001
            # The transaction stays open while capture spills it, and until the process is killed.
            deadline = time.monotonic() + 60
            while not _spill_files(staging) and time.monotonic() < deadline:
                conn.execute("INSERT INTO big SELECT g, 1, repeat('y', 40) FROM generate_series(%s::bigint, %s::bigint) g",
                             (next_id, next_id + 999))
                conn.execute("UPDATE big SET v = v + 1 WHERE id < 500")
                next_id += 1000
                time.sleep(0.2)
            assert _spill_files(staging), "capture spilled nothing of the streamed transaction"
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
            conn.execute("INSERT INTO big SELECT g, 2, 'after the kill' FROM generate_series(%s::bigint, %s::bigint) g",
                         (next_id, next_id + 999))
            conn.commit()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert _streamed_count(source_dsn) >= 1
    pipeline = Pipeline(parse_config(yaml.safe_load(yaml.safe_dump(raw))), spark=spark)
    run_caught_up(pipeline)  # PostgreSQL streams the transaction again from its start
    assert assert_same(pipeline, source_dsn, "public.big") == next_id + 999
    assert _spill_files(staging) == []
