"""Small tables copied into Iceberg from the driver: each table created with its rows in one catalog
commit (``files.create_with_rows``), every table read through a few driver sessions that the round's
tables share (``Permits.session``), and what lands is the source, read back by DuckDB's iceberg
extension (not ours) and by Spark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from headrace.core.names import quote_ident
from headrace.readers import duckdb_with, iceberg_metadata_location
from headrace.source.postgres import binary_copy
from tests.e2e.helpers import assert_same, make_config
from tests.e2e.test_small_tables_copy import copied_to_streaming

TABLES = 12


def _tables(dsn: str) -> dict[str, int]:
    """Keyed tables (one empty), a keyless one with duplicate rows, an awkward name; name -> rows."""
    rows = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(TABLES):
            conn.execute(f"CREATE TABLE s{i} (id bigint PRIMARY KEY, v text, amount numeric(10,2), at timestamptz)")
            conn.execute(f"INSERT INTO s{i} SELECT g, md5(g::text), g / 7.0, '2024-01-01'::timestamptz + g *"
                         f" interval '1 minute' FROM generate_series(1, {i * 30}) g")
            rows[f"s{i}"] = i * 30
        conn.execute("CREATE TABLE dup (a int, b text); ALTER TABLE dup REPLICA IDENTITY FULL")
        conn.execute("INSERT INTO dup SELECT g % 3, 'x' FROM generate_series(1, 20) g")
        rows["dup"] = 20
        conn.execute('CREATE TABLE "Odd Name" (id int PRIMARY KEY, "Val ue" text)')
        conn.execute("""INSERT INTO "Odd Name" SELECT g, 'v' || g FROM generate_series(1, 10) g""")
        rows["Odd Name"] = 10
    return rows


def test_small_iceberg_tables_are_created_with_their_rows_in_one_commit_through_shared_sessions(
    source_dsn: str, tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[object] = []

    class CountedSession(binary_copy.SnapshotSession):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            opened.append(self)

    monkeypatch.setattr(binary_copy, "SnapshotSession", CountedSession)
    rows = _tables(source_dsn)
    names = [f"public.{quote_ident(n)}" for n in rows]
    # 4 connections: the exported snapshot's session, at most 2 driver sessions, 1 left for planning.
    config = make_config(source_dsn, tmp_path, names, "iceberg", snapshot={"tables_at_once": 6, "max_connections": 4})
    pipeline = copied_to_streaming(source_dsn, config, spark)
    assert 1 <= len(opened) <= 2, f"{len(opened)} driver sessions for {len(rows)} tables"
    for name in names:
        assert_same(pipeline, source_dsn, name)
    settings = config.target.settings
    con = duckdb_with("avro", "iceberg")
    try:
        for name, count in rows.items():
            metadata = iceberg_metadata_location(settings, "public", name)
            # One commit made the table and its rows: its first metadata holds its one snapshot.
            assert Path(metadata).name.startswith(("v1.", "00000-")), metadata
            snapshots = con.execute(f"SELECT count(*) FROM iceberg_snapshots('{metadata}')").fetchone()
            assert snapshots == ((1,) if count else (0,)), (name, snapshots)
            got = con.execute(f"SELECT count(*) FROM iceberg_scan('{metadata}')").fetchone() if count else (0,)
            assert got == (count,), (name, got)
    finally:
        con.close()
