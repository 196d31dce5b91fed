"""Many small tables copied side by side (``snapshot.tables_at_once``), each read before it is written,
within ``snapshot.max_connections`` source connections. On DuckLake every one of them is written from
the driver (no Spark job), every scalar type of the type matrix included, and reads back the same
with a DuckDB that knows nothing of headrace."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from headrace.core.names import quote_ident
from headrace.pipeline import Pipeline
from headrace.source.postgres.copy import APPLICATION_NAME
from headrace.state.lifecycle import TableState
from headrace.state.store import StateStore
from headrace.targets.ducklake.files import SNAPSHOT_FOLDER
from headrace.targets.ducklake.types import cast_out
from tests.e2e.helpers import HELD, assert_same, make_config
from tests.e2e.test_copy_on_driver import create_cell_table
from tests.e2e.test_pipeline import run_caught_up
from tests.e2e.test_type_matrix import _arrow_values, _source
from tests.targets.test_ducklake_target import plain_duckdb

KEYED = 20
KEYLESS = 8
ODD = ["Odd Name", "MiXed", "ünï", "a.b", "select"]


def copied_to_streaming(source_dsn: str, config: Any, spark: Any) -> Pipeline:
    """Run ``config``'s pipeline until caught up; every table must then be STREAMING."""
    pipeline = Pipeline(config, spark=spark)
    run_caught_up(pipeline)
    state = StateStore(source_dsn, config.name)
    try:
        assert {r.state for r in state.tables()} == {TableState.STREAMING}
    finally:
        state.close()
    return pipeline


def _tables(dsn: str) -> list[str]:
    """Keyed tables (some empty), keyless ones with duplicate rows, and awkward names: 33 in all."""
    names = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(KEYED):
            conn.execute(f"CREATE TABLE k{i} (id int PRIMARY KEY, v text, amount numeric(10,2), at timestamptz)")
            conn.execute(f"INSERT INTO k{i} SELECT g, md5(g::text), g / 3.0, '2024-01-01'::timestamptz + g *"
                         f" interval '1 hour' FROM generate_series(1, {(i % 4) * 25}) g")  # 0, 25, 50, 75 rows
            names.append(f"public.k{i}")
        for i in range(KEYLESS):
            conn.execute(f"CREATE TABLE n{i} (a int, b text); ALTER TABLE n{i} REPLICA IDENTITY FULL")
            conn.execute(f"INSERT INTO n{i} SELECT g % 5, 'x' FROM generate_series(1, {i * 7}) g")  # duplicates
            names.append(f"public.n{i}")
        for name in ODD:
            conn.execute(f"CREATE TABLE {quote_ident(name)} (id bigint PRIMARY KEY, {quote_ident('Val ue')} text)")
            conn.execute(f"INSERT INTO {quote_ident(name)} SELECT g, 'v' || g FROM generate_series(1, 10) g")
            names.append(f"public.{quote_ident(name)}")
    return names


def _matrix(dsn: str) -> None:
    """``public.matrix``: every scalar column of the type matrix, one awkward value a row, the values
    the driver writes (not those only Spark's range rules decide)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        create_cell_table(conn, "matrix")


def _plain_duckdb_matrix(pipeline: Pipeline, dsn: str) -> int:
    """``public.matrix`` read by plain DuckDB equals the source, value for value (as the type matrix test)."""
    schema, expected = _source(dsn, infinite=True)
    con = plain_duckdb(pipeline.config.target.settings)
    try:
        exprs = ", ".join(f"{cast_out(quote_ident(c.name), c.type)} AS {quote_ident(c.name)}" for c in schema.columns)
        table = con.execute(f"SELECT {exprs} FROM lake.public.matrix").arrow()
        table = table if isinstance(table, pa.Table) else table.read_all()
    finally:
        con.close()
    columns = [_arrow_values(table.column(c.name), c.type) for c in schema.columns]
    actual = {row[0]: row for row in zip(*columns, strict=True)}
    assert actual == expected
    return len(actual)


def _plain_duckdb_counts(pipeline: Pipeline) -> dict[str, int]:
    """Rows per table, read by a DuckDB that knows nothing of headrace."""
    con = plain_duckdb(pipeline.config.target.settings)
    tables = con.execute("SELECT table_schema, table_name FROM information_schema.tables"
                         " WHERE table_catalog = 'lake' AND table_schema = 'public'").fetchall()
    counts = {name: con.execute(f"SELECT count(*) FROM lake.{quote_ident(schema)}.{quote_ident(name)}")
              .fetchone()[0] for schema, name in tables}  # type: ignore[index]
    con.close()
    return counts


@pytest.mark.parametrize("target", ["iceberg", "ducklake"])
def test_many_small_tables_copy_side_by_side_and_match_the_source(
    source_dsn: str, tmp_path: Path, spark: Any, target: str
) -> None:
    names = _tables(source_dsn)
    if target == "ducklake":
        _matrix(source_dsn)
        names.append("public.matrix")
    config = make_config(source_dsn, tmp_path, names, target, snapshot={"tables_at_once": 4, "max_connections": 3})
    pipeline = copied_to_streaming(source_dsn, config, spark)
    for name in names:
        if name != "public.matrix":
            assert_same(pipeline, source_dsn, name)
    if target == "ducklake":
        # Written from the driver, every one: Spark's snapshot files were never written.
        assert not (Path(config.target.settings.data_path) / SNAPSHOT_FOLDER).exists()
        with psycopg.connect(source_dsn) as conn:
            want = {}
            want_matrix = conn.execute("SELECT id FROM matrix").fetchall()
            for name in [*(f"k{i}" for i in range(KEYED)), *(f"n{i}" for i in range(KEYLESS)), *ODD]:
                want[name] = conn.execute(f"SELECT count(*) FROM {quote_ident(name)}").fetchone()[0]  # type: ignore[index]
        pipeline.target.close()  # DuckDB attaches a catalog file once per process
        assert _plain_duckdb_counts(pipeline) == want | {"matrix": len(want_matrix)}
        assert _plain_duckdb_matrix(pipeline, source_dsn) == len(want_matrix)


def test_small_tables_copy_within_max_connections(source_dsn: str, tmp_path: Path, spark: Any) -> None:
    """The copy's chunk reads and the session holding its snapshot never exceed max_connections,
    while more tables than that copy side by side."""
    names = _tables(source_dsn)
    dbname = psycopg.conninfo.conninfo_to_dict(source_dsn)["dbname"]
    config = make_config(source_dsn, tmp_path, names, "ducklake",
                         snapshot={"tables_at_once": 6, "max_connections": 2})
    seen: list[int] = []
    reads: list[int] = []
    over: list[tuple[Any, ...]] = []  # the source's view of our connections the first time there were too many
    done = threading.Event()

    def sample() -> None:
        with psycopg.connect(source_dsn, autocommit=True) as conn:
            while not done.is_set():
                n_reads, n_snapshot = conn.execute(
                    # A read closes its connection right after its ROLLBACK; the backend then takes a
                    # while to see the close and exit (20-30 ms on a loaded machine), shown idle after
                    # that ROLLBACK. With reads no longer a Spark job apart, the sampler saw one beside
                    # the next read: a connection released, not held, so not counted.
                    "SELECT (SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND application_name = %s"
                    f" AND {HELD}),"
                    " (SELECT count(*) FROM pg_replication_slots WHERE database = %s AND slot_name LIKE %s"
                    " AND active)", (dbname, APPLICATION_NAME, dbname, "%\\_copy")).fetchone()  # type: ignore[misc]
                seen.append(n_reads + n_snapshot)
                reads.append(n_reads)
                if n_reads + n_snapshot > 2 and not over:
                    # What the connections were doing, for the failure's message (the count alone
                    # has failed now and then, and could not tell a held read from a closing one).
                    over.extend(conn.execute(
                        "SELECT pid, state, left(query, 60), now() - state_change FROM pg_stat_activity"
                        " WHERE datname = %s AND application_name = %s", (dbname, APPLICATION_NAME)).fetchall())
                done.wait(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        pipeline = Pipeline(config, spark=spark)
        run_caught_up(pipeline)
    finally:
        done.set()
        sampler.join()
    assert max(reads) >= 1, "the sampler never saw a chunk read"
    assert max(seen) <= 2, f"the copy held {max(seen)} source connections with max_connections 2: {over}"
    for name in names[:3]:
        assert_same(pipeline, source_dsn, name)
