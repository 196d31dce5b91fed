"""A real client no one here wrote: sysbench's oltp_read_write (``--delete_inserts``: a DELETE and an
INSERT of the same id per transaction, index and non-index updates) against MariaDB beside a running
pipeline into DuckLake; once caught up, every table equals the source row for row.
(``bench/sysbench_mysql.py`` measures the same at full size.)"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from headrace.config import parse_config
from headrace.pipeline import Pipeline
from headrace.source.mysql.connect import connect
from headrace.source.mysql.throwaway import ThrowawayMariaDB
from headrace.state.lifecycle import TableState
from headrace.state.store import StateStore
from tests.e2e.helpers import raw_config, running, wait_until
from tests.e2e.test_mysql import state_dsn  # noqa: F401 -- a fixture shared with test_mysql

TABLES = 2


def _sysbench(server: ThrowawayMariaDB, database: str, command: str, *options: str) -> None:
    binary = shutil.which("sysbench")
    assert binary, "sysbench is not installed: apt-get install sysbench (scripts/bootstrap.sh --with-browser does)"
    subprocess.run([binary, "oltp_read_write", "--db-driver=mysql", "--mysql-host=127.0.0.1",
                    f"--mysql-port={server.port}", "--mysql-user=root", f"--mysql-db={database}",
                    f"--tables={TABLES}", "--table_size=2000", *options, command],
                   check=True, capture_output=True, text=True)


def _streaming(dsn: str) -> bool:
    state = StateStore(dsn, "sysbench")
    try:
        rows = state.tables() if state.installed() else []
        return len(rows) == TABLES and all(r.state is TableState.STREAMING for r in rows)
    finally:
        state.close()


def _equal(pipeline: Pipeline, root: str, database: str) -> bool:
    from headrace.source.mysql.catalog import read_table_schema

    with contextlib.closing(connect(root)) as conn, conn.cursor() as cur:
        for i in range(1, TABLES + 1):
            cur.execute(f"SELECT id, k, c, pad FROM sbtest{i}")
            source = sorted(tuple(r) for r in cur.fetchall())
            schema = read_table_schema(conn, database, f"sbtest{i}")
            rows = pipeline.target.read_table(schema).select("id", "k", "c", "pad").collect()
            if sorted(tuple(r) for r in rows) != source:
                return False
    return True


@pytest.mark.slow
def test_sysbench_oltp_read_write_beside_a_pipeline(mariadb_server: Any, state_dsn: str,  # noqa: F811
                                                     tmp_path: Path, spark: Any) -> None:
    database = f"sbtest_{tmp_path.name[-8:]}".replace("-", "_")
    mariadb_server.create_database(database)
    try:
        _sysbench(mariadb_server, database, "prepare")
        raw = raw_config(mariadb_server.dsn_for(database), tmp_path, [f"{database}.sbtest{i}"
                                                                     for i in range(1, TABLES + 1)],
                         "ducklake", source={"state_dsn": state_dsn}, name="sysbench")
        pipeline = Pipeline(parse_config(raw), spark=spark)
        with running(pipeline):
            wait_until(lambda: _streaming(state_dsn), 180, "the copy to finish")
            _sysbench(mariadb_server, database, "run", "--time=5", "--threads=2", "--delete_inserts=1")
            wait_until(lambda: _equal(pipeline, mariadb_server.root_dsn + database, database), 120,
                       "the target to equal the source", every=1)
    finally:
        mariadb_server.drop_database(database)
