"""DuckLake table maintenance with DuckLake's own functions.

Every apply batch commits a DuckLake snapshot, small Parquet files and delete files. One pass:
``ducklake_rewrite_data_files`` rewrites files with deletes (deletes applied),
``ducklake_merge_adjacent_files`` merges small files into larger ones, ``ducklake_expire_snapshots``
drops snapshots past the retention (keeping the newest few; snapshots are lake-wide),
``ducklake_cleanup_old_files`` deletes the files only expired snapshots used, and
``ducklake_delete_orphaned_files`` those no snapshot knows (crashed writes), once old enough.

The caller holds the target's lock: in one process, maintenance and apply take turns on the one
DuckDB connection, so they never conflict there. Another process (``headrace maintain`` beside a
running pipeline, on a PostgreSQL or SQLite catalog) commits optimistically; a conflict fails the
maintenance pass, which is retried, and the apply's own commit wins or is retried by the run.
"""

from __future__ import annotations

import logging
import time

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from headrace.core.maintenance import MaintenancePolicy, TableFiles
from headrace.logs import event
from headrace.targets.ducklake import inlining
from headrace.targets.ducklake.extension import fetch_arrow

log = logging.getLogger("headrace.targets.ducklake.maintenance")

ATTEMPTS = 3


def table_files(con: duckdb.DuckDBPyConnection, lake: str, schema: str, table: str) -> TableFiles | None:
    """Counts from ``ducklake_table_info`` and ``ducklake_snapshots`` (catalog rows, no data read)."""
    row = con.execute(
        "SELECT i.file_count, i.delete_file_count, i.file_size_bytes + i.delete_file_size_bytes,"
        " (SELECT count(*) FROM ducklake_snapshots(?)) FROM ducklake_table_info(?) i"
        " JOIN duckdb_tables() t ON t.database_name = ? AND t.table_name = i.table_name"
        " AND t.schema_name = ? WHERE i.table_name = ?", [lake, lake, lake, schema, table]).fetchone()
    if row is None:
        return None
    return TableFiles(data_files=int(row[0]), delete_files=int(row[1]), snapshots=int(row[3]), bytes=int(row[2]))


def maintain(con: duckdb.DuckDBPyConnection, lake: str, schema: str, table: str, policy: MaintenancePolicy) -> None:
    """One maintenance pass over ``schema.table`` of the lake attached as ``lake``; retried on a
    commit conflict with another process."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            _pass(con, lake, schema, table, policy)
            return
        except duckdb.TransactionException as exc:
            if attempt == ATTEMPTS:
                raise
            event(log, "maintenance.conflict", logging.INFO, table=f"{schema}.{table}", attempt=attempt,
                  error=str(exc).splitlines()[0][:300])
            time.sleep(0.5 * attempt)


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _call(con: duckdb.DuckDBPyConnection, sql: str) -> pa.Table:
    """What a maintenance function returns, a row per file, snapshot or table it handled.

    Fetched as Arrow: these functions return TIMESTAMPTZ columns, which duckdb's Python client only
    turns into Python values with pytz. Called whole: under ``SELECT count(*) FROM``, DuckDB 1.5.5
    runs them without committing their work.
    """
    return fetch_arrow(con.execute(f"CALL {sql}"))


def _count(con: duckdb.DuckDBPyConnection, sql: str) -> int:
    """Rows a maintenance function returns (files or snapshots it handled)."""
    return int(_call(con, sql).num_rows)


def _processed(con: duckdb.DuckDBPyConnection, sql: str) -> int:
    """The files a rewrite (``ducklake_rewrite_data_files``, ``ducklake_merge_adjacent_files``: a row a
    table) took in."""
    return int(pc.sum(_call(con, sql).column("files_processed")).as_py() or 0)


def _pass(con: duckdb.DuckDBPyConnection, lake: str, schema: str, table: str, policy: MaintenancePolicy) -> None:
    args = f"{_literal(lake)}, {_literal(table)}, schema => {_literal(schema)}"
    inlining.flush(con, lake, schema, table)  # the rows small batches left in the catalog, first
    rewritten = _processed(con, f"ducklake_rewrite_data_files({args}, delete_threshold => 0)")
    merged = _processed(con, f"ducklake_merge_adjacent_files({args})")
    # Keep the newest keep_last snapshots whatever their age: expire only before the oldest of them.
    row = con.execute(
        "SELECT least(now() - to_seconds(?::DOUBLE), coalesce((SELECT min(snapshot_time) FROM"
        " (SELECT snapshot_time FROM ducklake_snapshots(?) ORDER BY snapshot_id DESC LIMIT ?)), now()))::VARCHAR",
        [policy.retention_seconds, lake, policy.keep_last]).fetchone()
    assert row is not None
    cutoff = f"{_literal(str(row[0]))}::TIMESTAMPTZ"
    expired = _count(con, f"ducklake_expire_snapshots({_literal(lake)}, older_than => {cutoff})")
    cleaned = _count(con, f"ducklake_cleanup_old_files({_literal(lake)}, older_than => {cutoff})")
    orphans = _count(con, f"ducklake_delete_orphaned_files({_literal(lake)}, older_than => now() - "
                          f"to_seconds({float(policy.orphan_age_seconds)}))")
    event(log, "maintenance.ducklake", table=f"{schema}.{table}", rewritten=rewritten, merged=merged,
          snapshots_expired=expired, files_removed=cleaned, orphans_removed=orphans)
