"""Failover to a MariaDB replica by GTID: the pipeline continues without a copy, nothing lost or duplicated.

A primary and a replica (``MASTER_USE_GTID=slave_pos``, ``log_slave_updates``) started here; a
pipeline copies and streams the primary while it is written, stops mid-stream, the writes go on,
the replica catches up and the primary is stopped. The same pipeline pointed at the replica
(``source.dsn``) continues from the GTID state recorded with its position: no table is copied again,
and the target equals the replica row for row. Then the replica is promoted and written: a restart on
it continues by its own file and offset.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from headrace.config import parse_config
from headrace.control.status import pipeline_status
from headrace.core.errors import SourceError
from headrace.pipeline import Pipeline
from headrace.source.mysql.catalog import table_id
from headrace.source.mysql.connect import connect
from headrace.source.mysql.throwaway import ThrowawayMariaDB
from headrace.state.lifecycle import TableState
from tests.e2e.helpers import raw_config, running, wait_until
from tests.e2e.test_mysql import CREATE, _run, _same, _source_rows, _state_of, _target_rows, state_dsn  # noqa: F401 (state_dsn: a fixture)
from tests.e2e.test_pipeline import run_caught_up

DATABASE = "shop"


def _writer(root: str, stop: threading.Event, done: list[int]) -> None:
    """Transactions of inserts, updates and deletes across the key range until ``stop``; ``done[0]``:
    how many so far."""
    with contextlib.closing(connect(root)) as conn, conn.cursor() as cur:
        i = 0
        while not stop.is_set():
            i += 1
            done[0] = i
            cur.execute("BEGIN")
            cur.execute("INSERT INTO items (id, name, qty) VALUES (%s, %s, %s)", (10_000 + i, f"w{i}", i))
            cur.execute("UPDATE items SET qty = qty + 1, note = %s WHERE id = %s", (f"u{i}", (i * 37) % 300 + 1))
            if i % 4 == 0:
                cur.execute("DELETE FROM items WHERE id = %s", (10_000 + i // 2,))
            cur.execute("COMMIT")


def _newest_id(pipeline: Pipeline, root: str) -> int:
    schema, _rows = _source_rows(root, DATABASE)
    return max((row[0] for row in _target_rows(pipeline, schema)), default=0)


@contextlib.contextmanager
def _writing(root: str) -> Any:
    stop, done = threading.Event(), [0]
    thread = threading.Thread(target=_writer, args=(root, stop, done), daemon=True)
    thread.start()
    try:
        yield done
    finally:
        stop.set()
        thread.join(30)
    assert done[0] > 0


@pytest.mark.slow
def test_mysql_failover_to_a_replica_continues_by_gtid(tmp_path: Path, state_dsn: str, spark: Any,  # noqa: F811
                                                       caplog: pytest.LogCaptureFixture) -> None:
    with ThrowawayMariaDB(str(tmp_path)) as primary, ThrowawayMariaDB(
            str(tmp_path), settings={"server_id": "2", "log_slave_updates": "ON"}) as replica:
        replica.replicate_from(primary)
        primary.create_database(DATABASE)
        root = primary.root_dsn + DATABASE
        _run(root, CREATE, "INSERT INTO items (id, name, qty) SELECT seq, CONCAT('n', seq), seq FROM seq_1_to_300")
        raw = raw_config(primary.dsn_for(DATABASE), tmp_path, [f"{DATABASE}.items"], "ducklake",
                         source={"state_dsn": state_dsn}, name="failover")
        pipeline = Pipeline(parse_config(raw), spark=spark)
        with _writing(root) as done, running(pipeline):
            wait_until(lambda: _state_of(state_dsn, table_id(DATABASE, "items"), "failover")
                       == TableState.STREAMING, 180, "the copy to finish")
            written = 10_000 + done[0]
            wait_until(lambda: _newest_id(pipeline, root) >= written, 120, "the writes to stream", every=1)
            # The pipeline stopped mid-stream; the writes go on past its position.
        wait_until(lambda: replica.caught_up_with(primary), 60, "the replica to catch up")
        primary.stop_server()

        moved = parse_config({**raw, "source": {**raw["source"], "dsn": replica.dsn_for(DATABASE)}})
        after = Pipeline(moved, spark=spark)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="headrace"):
            run_caught_up(after)
        assert [r for r in caplog.records if r.getMessage() == "snapshot.start"] == [], "a table was copied again"
        replica_root = replica.root_dsn + DATABASE
        assert _same(after, replica_root, DATABASE) > 300
        assert pipeline_status(moved)["captured_lsn"].startswith("1/")  # the replica's positions: epoch 1
        after.target.close()
        after._target = None  # DuckLake: one attach of a lake per process

        # Promoted and written: a restart on it continues by its own file and offset.
        replica.promote()
        _run(replica_root, "UPDATE items SET name = 'promoted' WHERE id <= 20", "DELETE FROM items WHERE id > 10000")
        again = Pipeline(moved, spark=spark)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="headrace"):
            run_caught_up(again)
        assert [r for r in caplog.records if r.getMessage() == "snapshot.start"] == []
        assert _same(again, replica_root, DATABASE) == 300


@pytest.mark.slow
def test_mysql_refuses_a_replica_behind_the_position(tmp_path: Path, state_dsn: str, spark: Any) -> None:  # noqa: F811
    """A replica that has not applied what the pipeline read (stopped before it could) is refused with
    the GTIDs it lacks, not read from a point it never reached."""
    with ThrowawayMariaDB(str(tmp_path)) as primary, ThrowawayMariaDB(
            str(tmp_path), settings={"server_id": "2", "log_slave_updates": "ON"}) as replica:
        replica.replicate_from(primary)
        primary.create_database(DATABASE)
        root = primary.root_dsn + DATABASE
        _run(root, CREATE, "INSERT INTO items (id, name) VALUES (1, 'a')")
        wait_until(lambda: replica.caught_up_with(primary), 60, "the replica to catch up")
        with contextlib.closing(connect(replica.root_dsn)) as conn, conn.cursor() as cur:
            cur.execute("STOP SLAVE")
        _run(root, "INSERT INTO items (id, name) VALUES (2, 'b')")
        raw = raw_config(primary.dsn_for(DATABASE), tmp_path, [f"{DATABASE}.items"], "ducklake",
                         source={"state_dsn": state_dsn}, name="behind")
        run_caught_up(Pipeline(parse_config(raw), spark=spark))
        moved = parse_config({**raw, "source": {**raw["source"], "dsn": replica.dsn_for(DATABASE)}})
        with pytest.raises(SourceError, match="does not hold GTID 0-1-") as refused:
            run_caught_up(Pipeline(moved, spark=spark), timeout=120)
        assert "headrace reset -c <pipeline file> --yes" in str(refused.value)
