"""End to end: staged files carry their facts into the log index, and entries written by the
previous version (NULL facts) still apply, through the Spark job that finds them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg

from headrace.pipeline import Pipeline
from tests.e2e.helpers import assert_same, make_config
from tests.e2e.test_pipeline import _rewind, run_caught_up


def test_entries_without_facts_still_apply(source_dsn: str, tmp_path: Path, spark: Any) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE notes (id int PRIMARY KEY, body text);"
                     "INSERT INTO notes SELECT g, 'n' || g FROM generate_series(1, 20) g")
    pipeline = Pipeline(make_config(source_dsn, tmp_path, ["public.notes"], "ducklake"), spark=spark)
    run_caught_up(pipeline)
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("UPDATE notes SET body = body || '!' WHERE id <= 5")
        conn.execute("UPDATE notes SET id = id + 100 WHERE id = 6")  # a key move
        conn.execute("TRUNCATE notes")
        conn.execute("INSERT INTO notes VALUES (1, 'after the truncate'), (2, 'x')")
        conn.execute("DELETE FROM notes WHERE id = 2")
    run_caught_up(pipeline)
    assert assert_same(pipeline, source_dsn, "public.notes") == 1
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        facts = [r[0] for r in conn.execute("SELECT facts FROM _headrace.log_index ORDER BY log_offset")]
        assert facts and all(f is not None for f in facts)
        assert sum(f["truncates"] for f in facts) == 1 and sum(f["deletes"] for f in facts) == 1
        # As the previous version registered them: no facts. Replay the whole log from there.
        conn.execute("UPDATE _headrace.log_index SET facts = NULL")
        conn.execute("INSERT INTO notes VALUES (3, 'later')")
    _rewind(pipeline, source_dsn, "ducklake", 0)
    run_caught_up(pipeline)
    assert assert_same(pipeline, source_dsn, "public.notes") == 2
