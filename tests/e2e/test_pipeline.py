"""End to end: a real Postgres, the real capture/staging/materializer path, real Iceberg tables."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from headrace.materialize.apply import apply_next, current_cursor
from headrace.pipeline import Pipeline
from headrace.state.store import StateStore
from tests.e2e.helpers import assert_built_by_spark, assert_same, make_config, wait_until

ALL_TYPES_DDL = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE all_types (
    id integer PRIMARY KEY,
    c_small smallint, c_int integer, c_big bigint, c_real real, c_double double precision,
    c_num numeric(20,6), c_num_free numeric, c_bool boolean, c_text text, c_varchar varchar(10),
    c_char char(4), c_uuid uuid, c_inet inet, c_mood mood, c_json json, c_jsonb jsonb,
    c_interval interval, c_date date, c_ts timestamp, c_tstz timestamptz, c_bytea bytea,
    c_int_arr integer[], c_text_arr text[]
);
"""

ALL_TYPES_ROWS = """
INSERT INTO all_types VALUES
 ({id}, -32768, 2147483647, -9223372036854775808, 3.4028235e38, 1.7976931348623157e308,
  12345678901234.123456, 1234567890123456789012345678901234567890.0123456789, true, 'héllo ☃ 𝄞', '',
  'ab', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '192.168.0.1/24', 'happy', '{{"a": [1, 2]}}',
  '{{"b": null, "c": "d"}}', '1 year 2 mons 3 days 04:05:06.789', '2024-02-29',
  '2024-01-02 03:04:05.123456', '2024-01-02 03:04:05.654321+02', '\\x00ff10',
  '{{1,NULL,3}}', '{{"a b","x\\"y",NULL,"NULL",""}}'),
 ({id2}, NULL, NULL, NULL, 'NaN', '-Infinity', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
  NULL, NULL, NULL, NULL, NULL, NULL, '\\x', '{{}}', NULL)
"""


def run_caught_up(pipeline: Pipeline, timeout: float = 180) -> None:
    """Run until caught up, failing the test if that takes longer than ``timeout``."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["code"] = pipeline.run(until_caught_up=True)
        except BaseException as exc:  # surfaced below
            result["exc"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "pipeline did not catch up in time"
    if "exc" in result:
        raise result["exc"]
    assert result["code"] == 0


@pytest.fixture(params=["iceberg", "ducklake"])
def target(request: pytest.FixtureRequest) -> str:
    """The behaviour suite runs against every target."""
    return str(request.param)


# DuckLake with a SQLite catalog too, on the broadest streaming test (one commit per batch, cursor
# rows). Replays, truncates, the cursor and keyless tables on a SQLite catalog are checked without a
# pipeline by the contract suite (tests/targets/test_contract.py, over TARGET_KINDS).
WITH_SQLITE_CATALOG = pytest.mark.parametrize("target", ["iceberg", "ducklake", "ducklake-sqlite"])


@pytest.fixture
def shop(source_dsn: str) -> str:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("""
            CREATE TABLE customers (id serial PRIMARY KEY, name text NOT NULL, balance numeric(12,2));
            CREATE TABLE order_lines (order_id bigint, line integer, sku text, qty integer,
                                      PRIMARY KEY (order_id, line));
            INSERT INTO customers (name, balance) SELECT 'c' || g, g * 1.5 FROM generate_series(1, 300) g;
            INSERT INTO order_lines SELECT g / 3, g % 3, 'sku' || g, g FROM generate_series(1, 300) g;
        """)
    return source_dsn


def test_every_type_round_trips_through_copy_and_stream(source_dsn: str, tmp_path: Path, spark: Any, target: str) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute(ALL_TYPES_DDL)
        conn.execute(ALL_TYPES_ROWS.format(id=1, id2=2))
    pipeline = Pipeline(make_config(source_dsn, tmp_path, ["public.all_types"], target), spark=spark)
    run_caught_up(pipeline)
    assert assert_same(pipeline, source_dsn, "public.all_types") == 2
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute(ALL_TYPES_ROWS.format(id=3, id2=4))  # the same values through pgoutput
        conn.execute("UPDATE all_types SET c_text = '', c_int_arr = NULL WHERE id = 1")
    run_caught_up(pipeline)
    assert assert_same(pipeline, source_dsn, "public.all_types") == 4


@WITH_SQLITE_CATALOG
def test_changes_stream_after_the_copy(shop: str, tmp_path: Path, spark: Any, target: str) -> None:
    config = make_config(shop, tmp_path, ["public.customers", "public.order_lines"], target)
    pipeline = Pipeline(config, spark=spark)
    run_caught_up(pipeline)
    assert assert_same(pipeline, shop, "public.customers") == 300
    with psycopg.connect(shop, autocommit=True) as conn:
        conn.execute("INSERT INTO customers (name) SELECT 'new' || g FROM generate_series(1, 50) g")
        conn.execute("UPDATE customers SET balance = balance * 2 WHERE id % 7 = 0")
        conn.execute("DELETE FROM customers WHERE id % 11 = 0")
        with conn.transaction():  # several changes to one key in one transaction: last wins
            for i in range(5):
                conn.execute("UPDATE customers SET name = %s WHERE id = 1", (f"v{i}",))
            conn.execute("DELETE FROM customers WHERE id = 2")
            conn.execute("INSERT INTO customers (id, name) VALUES (2, 'reborn')")
            conn.execute("INSERT INTO customers (id, name) VALUES (100000, 'gone')")
            conn.execute("DELETE FROM customers WHERE id = 100000")
        conn.execute("UPDATE customers SET id = id + 1000 WHERE id BETWEEN 10 AND 20")  # key changes
        conn.execute("UPDATE order_lines SET line = line + 10 WHERE order_id = 5")  # composite key change
        conn.execute("DELETE FROM order_lines WHERE order_id = 6 AND line = 0")
        conn.execute("UPDATE order_lines SET qty = -1 WHERE order_id = 7")
    run_caught_up(pipeline)
    assert assert_same(pipeline, shop, "public.customers") == 300 + 50 - 31
    assert assert_same(pipeline, shop, "public.order_lines") == 299


def test_key_swap_and_reuse_within_one_transaction(shop: str, tmp_path: Path, spark: Any, target: str) -> None:
    pipeline = Pipeline(make_config(shop, tmp_path, ["public.customers"], target), spark=spark)
    run_caught_up(pipeline)
    with psycopg.connect(shop, autocommit=True) as conn, conn.transaction():
        conn.execute("UPDATE customers SET id = -1 WHERE id = 1")
        conn.execute("UPDATE customers SET id = 1 WHERE id = 2")
        conn.execute("UPDATE customers SET id = 2 WHERE id = -1")
        conn.execute("INSERT INTO customers (id, name) VALUES (-1, 'fresh')")
    run_caught_up(pipeline)
    assert_same(pipeline, shop, "public.customers")


def test_large_transaction_spills_and_applies(shop: str, tmp_path: Path, spark: Any, target: str) -> None:
    config = make_config(shop, tmp_path, ["public.customers"], target, staging={"flush_bytes": 200_000})
    pipeline = Pipeline(config, spark=spark)
    run_caught_up(pipeline)
    with psycopg.connect(shop, autocommit=True) as conn:
        conn.execute("INSERT INTO customers (name, balance) SELECT 'bulk' || g, g FROM generate_series(1, 30000) g")
    run_caught_up(pipeline)
    assert assert_same(pipeline, shop, "public.customers") == 30300
    state = StateStore(shop, "t")
    try:
        oid = state.tables()[0].oid
        assert len(state.log_index.entries(oid, 0, 1000)) > 1, "the big transaction should span several files"
    finally:
        state.close()


def _rewind(pipeline: Pipeline, dsn: str, target: str, offset: int) -> None:
    """Move every cursor back to ``offset`` in the staged log, as a crash before the cursor moved does."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE _headrace.mat_cursor SET log_offset = %s", (offset,))
    if target.startswith("ducklake"):  # the lake keeps its own cursor, committed with the data
        from headrace.targets.ducklake.target import CURSOR_TABLE

        pipeline.target._con.execute(f"UPDATE {CURSOR_TABLE} SET log_offset = ?", [offset])  # type: ignore[attr-defined]


def test_replaying_applied_batches_changes_nothing(shop: str, tmp_path: Path, spark: Any, target: str) -> None:
    """An older batch applied again after a newer one leaves the newer values (the position rule:
    a change at or before the row's position is skipped); then the whole log replayed in order."""
    pipeline = Pipeline(make_config(shop, tmp_path, ["public.customers"], target), spark=spark)
    run_caught_up(pipeline)
    state = StateStore(shop, "t")
    try:
        row = state.tables()[0]
        before_old = state.log_index.last_offset(row.oid)
        with psycopg.connect(shop, autocommit=True) as conn:  # the older batch
            conn.execute("UPDATE customers SET name = 'old', balance = -1 WHERE id <= 100")
            conn.execute("DELETE FROM customers WHERE id BETWEEN 101 AND 110")
        run_caught_up(pipeline)
        after_old = state.log_index.last_offset(row.oid)
        with psycopg.connect(shop, autocommit=True) as conn:  # the newer batch
            conn.execute("UPDATE customers SET name = 'new' WHERE id <= 100")
            conn.execute("INSERT INTO customers (id, name) SELECT g, 'back' FROM generate_series(101, 110) g")
            conn.execute("DELETE FROM customers WHERE id > 250")
            conn.execute("INSERT INTO customers (name) VALUES ('late')")
        run_caught_up(pipeline)
        assert_same(pipeline, shop, "public.customers")
        assert before_old < after_old < state.log_index.last_offset(row.oid)
        # Only the older batch again, after the newer one: its updates and deletes are stale.
        _rewind(pipeline, shop, target, before_old)
        while current_cursor(state, pipeline.target, row) < after_old:
            assert apply_next(spark, state, pipeline.target, row, max_files=1) is not None
        assert current_cursor(state, pipeline.target, row) == after_old
        assert assert_same(pipeline, shop, "public.customers") == 251
    finally:
        state.close()
    _rewind(pipeline, shop, target, 0)  # forget every cursor: replay the whole log in order
    run_caught_up(pipeline)
    assert_same(pipeline, shop, "public.customers")


def test_truncate_replicates(shop: str, tmp_path: Path, spark: Any, target: str) -> None:
    with psycopg.connect(shop, autocommit=True) as conn:
        conn.execute("CREATE TABLE notes (id int PRIMARY KEY, customer int REFERENCES customers, body text);"
                     "INSERT INTO notes SELECT g, g, 'n' FROM generate_series(1, 10) g")
    tables = ["public.customers", "public.order_lines", "public.notes"]
    pipeline = Pipeline(make_config(shop, tmp_path, tables, target), spark=spark)
    run_caught_up(pipeline)
    with psycopg.connect(shop, autocommit=True) as conn:
        conn.execute("INSERT INTO customers (name) VALUES ('before')")
        conn.execute("TRUNCATE customers CASCADE")  # notes too, through its foreign key
        conn.execute("INSERT INTO customers (name) VALUES ('after')")  # same batch, after the truncate
        conn.execute("INSERT INTO order_lines VALUES (1000, 1, 'x', 1)")
        conn.execute("TRUNCATE order_lines, notes")  # two tables in one statement
        conn.execute("INSERT INTO order_lines VALUES (1001, 1, 'y', 2)")
    run_caught_up(pipeline)
    assert assert_same(pipeline, shop, "public.customers") == 1
    assert assert_same(pipeline, shop, "public.order_lines") == 1
    assert assert_same(pipeline, shop, "public.notes") == 0
    state = StateStore(shop, "t")
    try:  # one truncate event per table batch that held one (notes' two truncates may share a batch)
        assert 3 <= state.ddl_counts().get("truncate", 0) <= 4
    finally:
        state.close()


@pytest.mark.parametrize("engine", ["auto", "spark"])
def test_changes_during_the_copy_and_a_restart(shop: str, tmp_path: Path, spark: Any, target: str,
                                               engine: str) -> None:
    config = make_config(shop, tmp_path, ["public.customers"], target, engine=engine)
    pipeline = Pipeline(config, spark=spark)
    stop = threading.Event()
    writer_done = threading.Event()

    def write() -> None:
        with psycopg.connect(shop, autocommit=True) as conn:
            for i in range(60):
                conn.execute("INSERT INTO customers (name) VALUES (%s)", (f"w{i}",))
                conn.execute("UPDATE customers SET balance = %s WHERE id = %s", (i, 1 + i % 300))
                time.sleep(0.05)
        writer_done.set()

    writer = threading.Thread(target=write)
    runner = threading.Thread(target=pipeline.run, kwargs={"stop": stop})
    writer.start()
    runner.start()
    writer_done.wait(120)
    state = StateStore(shop, "t")
    try:  # streaming: the copy is done and a batch of changes applied
        wait_until(lambda: any(state.log_index.cursor(r.oid) > 0 for r in state.tables()), 120, "no batch applied")
    finally:
        state.close()
    stop.set()  # a graceful stop mid-stream, then a restart resumes where it stopped
    runner.join(120)
    assert not runner.is_alive()
    restarted = Pipeline(config, spark=spark)
    run_caught_up(restarted)
    assert assert_same(pipeline, shop, "public.customers") == 360
    if engine == "spark":
        assert_built_by_spark(pipeline)
