"""End to end: tables without a primary key (REPLICA IDENTITY FULL), and REPLICA IDENTITY USING INDEX.

Keyless tables replicate as multisets: identical rows stay as many as in the source, and a delete
or update of one of them touches exactly one copy. ``assert_same`` compares sorted row lists, so
duplicates count.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from headrace.pipeline import Pipeline
from tests.e2e.helpers import assert_same, make_config
from tests.e2e.test_pipeline import run_caught_up


@pytest.fixture(params=["iceberg", "ducklake"])
def target(request: pytest.FixtureRequest) -> str:
    """Each target (keyless multisets on a SQLite DuckLake catalog: tests/targets/test_contract.py)."""
    return str(request.param)


ONE_OF = "ctid = (SELECT min(ctid) FROM bag WHERE {})"  # one of several identical rows


def test_keyless_table_keeps_duplicates(source_dsn: str, tmp_path: Path, spark: Any, target: str) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("""
            CREATE TABLE bag (a int, b text, c numeric, big text);
            ALTER TABLE bag REPLICA IDENTITY FULL;
            INSERT INTO bag VALUES (1, 'x', 1.5), (1, 'x', 1.5), (2, NULL, NULL), (2, NULL, NULL), (3, 'y', 0);
            -- 40 KB of hex, stored out of line: an update that leaves it alone sends it as unchanged
            INSERT INTO bag SELECT 6, 'big', 0, string_agg(md5(g::text), '') FROM generate_series(1, 1250) g;
        """)
    pipeline = Pipeline(make_config(source_dsn, tmp_path, ["public.bag"], target), spark=spark)
    run_caught_up(pipeline)
    assert assert_same(pipeline, source_dsn, "public.bag") == 6
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("UPDATE bag SET c = 7 WHERE a = 6")  # the old row (FULL) carries the big value
        conn.execute("INSERT INTO bag VALUES (1, 'x', 1.5)")  # a third copy
        conn.execute("DELETE FROM bag WHERE " + ONE_OF.format("a = 2"))  # one of two rows with NULLs
        conn.execute("UPDATE bag SET c = 9 WHERE " + ONE_OF.format("a = 1"))  # one of three copies
        with conn.transaction():  # several changes to identical rows in one transaction
            conn.execute("INSERT INTO bag VALUES (4, 'z', 4), (4, 'z', 4)")
            conn.execute("UPDATE bag SET a = 1, b = 'x', c = 1.5 WHERE a = 3")  # now equal to others
            conn.execute("DELETE FROM bag WHERE " + ONE_OF.format("a = 4"))
            conn.execute("UPDATE bag SET b = 'same' WHERE a = 4")  # a no-op in effect
            conn.execute("UPDATE bag SET b = 'same' WHERE a = 4")
    run_caught_up(pipeline)
    assert assert_same(pipeline, source_dsn, "public.bag") == 7
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM bag WHERE " + ONE_OF.format("a = 1"))
        conn.execute("TRUNCATE bag")
        conn.execute("INSERT INTO bag VALUES (5, 'after', 5), (5, 'after', 5)")
        conn.execute("DELETE FROM bag WHERE " + ONE_OF.format("a = 5"))
    run_caught_up(pipeline)
    assert assert_same(pipeline, source_dsn, "public.bag") == 1


@pytest.mark.parametrize("target", ["iceberg", "ducklake"])
def test_replica_identity_index_is_the_key(source_dsn: str, tmp_path: Path, spark: Any, target: str) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("""
            CREATE TABLE accounts (id int PRIMARY KEY, email text NOT NULL, region text NOT NULL, v int);
            CREATE UNIQUE INDEX accounts_email_region ON accounts (email, region);
            ALTER TABLE accounts REPLICA IDENTITY USING INDEX accounts_email_region;
            INSERT INTO accounts SELECT g, 'u' || g || '@x', 'eu', g FROM generate_series(1, 20) g;
        """)
    pipeline = Pipeline(make_config(source_dsn, tmp_path, ["public.accounts"], target), spark=spark)
    run_caught_up(pipeline)
    assert assert_same(pipeline, source_dsn, "public.accounts") == 20
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("UPDATE accounts SET v = -v WHERE id <= 5")
        conn.execute("UPDATE accounts SET region = 'us' WHERE id BETWEEN 3 AND 8")  # the index key changes
        conn.execute("UPDATE accounts SET email = 'moved@x', v = 0 WHERE id = 9")
        conn.execute("UPDATE accounts SET id = 100 WHERE id = 10")  # the primary key is not the identity
        conn.execute("DELETE FROM accounts WHERE id IN (4, 11)")
        with conn.transaction():  # an index key is freed and reused in one transaction
            conn.execute("UPDATE accounts SET email = 'tmp@x' WHERE id = 12")
            conn.execute("UPDATE accounts SET email = 'u12@x' WHERE id = 13")
        conn.execute("INSERT INTO accounts VALUES (50, 'u4@x', 'us', 4)")
    run_caught_up(pipeline)
    assert assert_same(pipeline, source_dsn, "public.accounts") == 19
