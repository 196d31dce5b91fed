"""kill -9 in the middle of a MariaDB table's initial copy, with writes going on: the restart copies only
the chunks left (a finished chunk keeps the position it was copied at), and the target equals the
source with no duplicates (read back through Spark, and through plain DuckDB for DuckLake)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from headrace.config import parse_config
from headrace.materialize.file_copy import CHUNKS_PER_TASK, GROUPS_PER_COMMIT
from headrace.pipeline import Pipeline
from headrace.source.mysql.catalog import table_id
from headrace.source.mysql.connect import connect
from headrace.state.progress import ProgressStore
from tests.e2e.helpers import raw_config, run_command
from tests.e2e.test_mysql import CREATE, _plain_duckdb_ids, _run, _same, _source_rows, shop, state_dsn, target
from tests.e2e.test_pipeline import run_caught_up

__all__ = ["shop", "state_dsn", "target"]  # fixtures shared with test_mysql
ROWS = 1_000  # chunk_pages 1 is 50 rows: 20 chunks, 10 groups: more than one commit takes
# The copy writes files (``file_copy``): with one connection, a group holds CHUNKS_PER_TASK chunks, and a
# commit takes the groups finished by then (at most GROUPS_PER_COMMIT). The second commit's groups are
# written, not recorded: the first's are done.
CRASH_AFTER = 2


def _writes(root: str, stop: threading.Event, rounds: int | None = None, first: int = 100_000) -> None:
    """Updates, deletes and inserts across the key range (inserts from ``first`` on) until stopped or
    ``rounds``."""
    with contextlib.closing(connect(root)) as conn, conn.cursor() as cur:
        i = 0
        while not stop.wait(0.01) and i != rounds:
            i += 1
            cur.execute("UPDATE items SET qty = qty + 1, name = CONCAT(name, 'u') WHERE id = %s",
                        ((i * 37) % ROWS + 1,))
            cur.execute("DELETE FROM items WHERE id = %s", ((i * 53) % ROWS + 1,))
            cur.execute("INSERT INTO items (id, name, qty) VALUES (%s, 'new', %s)", (first + i, i))


@pytest.mark.parametrize("target", ["ducklake", "iceberg"], indirect=True)
def test_mysql_kill_mid_copy_resumes_with_the_chunks_left(
        mariadb_server: Any, shop: tuple[str, str], state_dsn: str, tmp_path: Path, spark: Any, target: str) -> None:
    database, root = shop
    _run(root, CREATE, f"INSERT INTO items (id, name, qty, price, seen) SELECT seq, CONCAT('n', seq), seq,"
         f" seq / 7, '2024-02-29 12:34:56.5' + INTERVAL seq SECOND FROM seq_1_to_{ROWS}")
    raw = raw_config(mariadb_server.dsn_for(database), tmp_path, [f"{database}.items"], target,
                     source={"state_dsn": state_dsn}, snapshot={"chunk_pages": 1, "max_connections": 1},
                     spark={"master": "local[1]"})
    stop = threading.Event()
    writer = threading.Thread(target=_writes, args=(root, stop))
    writer.start()  # the copy reads a table being written
    try:
        env = {**os.environ, "HEADRACE_CRASH_AT": f"snapshot.after_chunk:{CRASH_AFTER}"}
        crashed = subprocess.run([*run_command(raw, tmp_path), "--until-caught-up"], env=env, capture_output=True,
                                 text=True, timeout=300)
    finally:
        stop.set()
        writer.join()
    assert crashed.returncode == 137, crashed.stderr[-3000:]
    oid = table_id(database, "items")
    progress = ProgressStore(state_dsn, raw["name"])
    try:
        before = {c.number: c for c in progress.chunks(oid) if c.done}
        assert sorted(before) == list(range(len(before))), "the groups written but not recorded are copied again"
        assert len(before) % CHUNKS_PER_TASK == 0 and 0 < len(before) <= GROUPS_PER_COMMIT * CHUNKS_PER_TASK
        assert len(progress.chunks(oid)) > 10
        _writes(root, threading.Event(), rounds=100, first=1_000_000)  # more changes while nothing runs
        local = Pipeline(parse_config({**raw, "spark": {"master": "local[2]"}}), spark=spark)
        try:
            run_caught_up(local)
            after = {c.number: c for c in progress.chunks(oid)}
            assert all(after[n].snapshot_lsn == c.snapshot_lsn for n, c in before.items()), "finished chunks redone"
            assert all(c.done for c in after.values())
            assert _same(local, root, database) > 0  # row for row, so no duplicate either
        finally:
            local.target.close()
        if target == "ducklake":  # DuckDB attaches a lake once per process: after the pipeline's closed
            _, rows = _source_rows(root, database)
            assert _plain_duckdb_ids(local) == sorted(r[0] for r in rows)
    finally:
        progress.close()
