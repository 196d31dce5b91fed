"""Closing a DuckLake target whose catalog connection broke inside a transaction: DuckDB rolls an open
transaction back in its destructor, where the failing ROLLBACK ("server closed the connection
unexpectedly") cannot be raised and aborts the process. ``DuckLakeTarget.close`` rolls back and
detaches first, catching their errors. Run in a child process: an abort would take pytest with it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import psycopg

CHILD = textwrap.dedent("""
    import sys
    import psycopg
    from headrace.targets.ducklake.config import DuckLakeConfig
    from headrace.targets.ducklake.target import CURSOR_TABLE, DuckLakeTarget

    dsn, catalog, data_path = sys.argv[1:4]
    target = DuckLakeTarget(None, DuckLakeConfig(catalog=catalog, data_path=data_path), "p")
    target._con.execute("BEGIN")  # a batch's transaction, cut short by the outage
    target._con.execute(f"INSERT INTO {CURSOR_TABLE} VALUES ('p', 1, 1, now())")
    with psycopg.connect(dsn, autocommit=True) as conn:  # the catalog's server drops our session
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                     " WHERE datname = current_database() AND pid <> pg_backend_pid()")
    target.close()
    print("closed")
""")


def test_close_after_the_catalog_connection_broke_mid_transaction(source_dsn: str, tmp_path: Path) -> None:
    info = psycopg.conninfo.conninfo_to_dict(source_dsn)
    catalog = f"postgres:host={info['host']} port={info['port']} user={info['user']} dbname={info['dbname']}"
    done = subprocess.run([sys.executable, "-c", CHILD, source_dsn, catalog, str(tmp_path / "data")],
                          capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0 and "closed" in done.stdout, done.stderr[-2000:]
