"""End to end: TOASTed values (100 KB, stored out of line) survive updates that leave them untouched.

With REPLICA IDENTITY DEFAULT, pgoutput sends such a value as "unchanged"; the target must keep
the value it has, also when the key changes in the same update (the value then lives under the old
key: in the batch, or in the target).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
import pytest

from headrace.pipeline import Pipeline
from tests.e2e.helpers import assert_same, make_config
from tests.e2e.test_pipeline import run_caught_up

# The TOASTed column's name holds a comma and a percent sign: the list of unchanged columns is
# comma-separated, so names are escaped in it (``headrace.core.rows.unchanged_token``).
BIG = '"big, 100%"'
# 3200 md5 digests: 100 KB of hex, which pglz cannot compress, so it is stored out of line.
SETUP = f"""
CREATE FUNCTION hexblob() RETURNS text LANGUAGE sql AS
  $$ SELECT string_agg(md5(random()::text || g::text), '') FROM generate_series(1, 3200) g $$;
CREATE TABLE docs (id int PRIMARY KEY, name text, {BIG} text, n int);
INSERT INTO docs SELECT g, 'd' || g, hexblob(), 0 FROM generate_series(1, 5) g;
INSERT INTO docs VALUES (6, 'no big value', NULL, 0);
"""


@pytest.fixture(params=["iceberg", "ducklake"])
def target(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _unchanged_staged(staging: Path) -> int:
    """Staged changes that carried a TOAST column as unchanged (proves the test exercises it)."""
    return sum(
        sum(1 for v in pq.read_table(f, columns=["_unchanged_cols"]).column(0).to_pylist() if v)
        for f in staging.rglob("*.parquet")
    )


def test_toast_values_survive_updates_and_key_changes(source_dsn: str, tmp_path: Path, spark: Any,
                                                      target: str) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute(SETUP)
        toast = conn.execute(
            "SELECT pg_relation_size(reltoastrelid) FROM pg_class WHERE oid = 'docs'::regclass"
        ).fetchone()
        assert toast and toast[0] > 400_000, "the big values should be stored out of line"
    pipeline = Pipeline(make_config(source_dsn, tmp_path, ["public.docs"], target), spark=spark)
    run_caught_up(pipeline)
    assert assert_same(pipeline, source_dsn, "public.docs") == 6
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("UPDATE docs SET n = n + 1")  # unrelated to the big values
        for i in range(3):  # several updates of one row in one batch
            conn.execute("UPDATE docs SET name = %s WHERE id = 2", (f"v{i}",))
        with conn.transaction():  # sets the big value, then an update leaves it unchanged
            conn.execute(f"UPDATE docs SET {BIG} = hexblob() WHERE id = 3")
            conn.execute("UPDATE docs SET name = 'after' WHERE id = 3")
        conn.execute("DELETE FROM docs WHERE id = 4")
        conn.execute("INSERT INTO docs VALUES (4, 'reborn', hexblob(), 0)")
        conn.execute("UPDATE docs SET n = 40 WHERE id = 4")
        conn.execute("UPDATE docs SET id = 100 WHERE id = 1")  # key change: the value is in the target
        conn.execute("UPDATE docs SET id = 300 WHERE id = 3")  # key change: the value is in the batch
        conn.execute("UPDATE docs SET id = 500, name = 'moved' WHERE id = 5")
        conn.execute("UPDATE docs SET id = 501 WHERE id = 500")  # two hops in one batch
        conn.execute("UPDATE docs SET id = 5 WHERE id = 2")  # onto a key used earlier in the batch
    run_caught_up(pipeline)
    assert assert_same(pipeline, source_dsn, "public.docs") == 6
    with psycopg.connect(source_dsn, autocommit=True) as conn:  # across batches
        conn.execute("UPDATE docs SET name = 'again' WHERE id = 100")
        conn.execute("UPDATE docs SET id = 101 WHERE id = 100")
        conn.execute("UPDATE docs SET n = -1")
    run_caught_up(pipeline)
    assert assert_same(pipeline, source_dsn, "public.docs") == 6
    assert _unchanged_staged(tmp_path / "staging") > 0  # (applied files may be collected already)
