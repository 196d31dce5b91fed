"""Tables applied concurrently (``apply.concurrency``): a slow table holds back no other, and many
tables changed together converge, on both targets.

Real PostgreSQL, Spark and lakes; the slow table is a ``hold`` fault on its ``apply_batch`` (the
faulty target), so the test waits on the target's state, never on time.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import psycopg
import pytest

from headrace.pipeline import Pipeline
from headrace.targets.ducklake.config import DuckLakeConfig
from tests.e2e.helpers import assert_same, make_config, running, source_rows, target_rows, wait_until
from tests.targets.test_ducklake_target import plain_duckdb
from tests.targets.test_faulty import change, faulty, row, running_faulty, streaming, tables


def test_a_held_batch_leaves_the_other_tables_applying(source_dsn: str, tmp_path: Path, spark: Any) -> None:
    # public.slow's first batch is held inside the target's apply_batch until the test releases it:
    # meanwhile public.fast's batches, one after another, must reach the target.
    tables(source_dsn, "slow", "fast")
    config = make_config(source_dsn, tmp_path, ["public.slow", "public.fast"],
                         faulty(tmp_path, {"fail_on": "apply_batch", "table": "public.slow", "error": "hold"}),
                         apply={"concurrency": 4})
    with running_faulty(config, spark) as (pipeline, state, target):
        slow = row(state, "public.slow")
        change(source_dsn, "slow")
        wait_until(lambda: ("apply_batch", "public.slow") in target.injected, 120,
                   "public.slow's batch never reached the target")
        with psycopg.connect(source_dsn, autocommit=True) as conn:
            for i in range(3):  # three rounds, each applied while public.slow's batch is held
                conn.execute(f"INSERT INTO fast VALUES ({500 + i}, 'during the hold');"
                             f" UPDATE fast SET v = 'round {i}' WHERE id = {i + 1}")
                wait_until(lambda i=i: assert_same(pipeline, source_dsn, "public.fast") == 21 + i, 120,
                           f"public.fast's round {i} was not applied while public.slow's batch was held")
        assert pipeline.apply_pass.applying(slow.oid), "public.slow's batch ended early"
        schema, _ = source_rows(source_dsn, "public.slow")
        assert ("changed" not in {v for _id, v in target_rows(pipeline, schema)}), "the held batch committed"
        target.release()
        wait_until(lambda: assert_same(pipeline, source_dsn, "public.slow") == 21, 120,
                   "public.slow did not apply after the release")
        assert not pipeline.apply_pass.applying(slow.oid)


NAMES = [f"c{i}" for i in range(6)]


def _create(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name in NAMES:
            conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v int, note text);"
                         f"INSERT INTO {name} SELECT g, 0, 'seed' FROM generate_series(1, 50) g")


def _interleaved(dsn: str, rounds: int, seed: int) -> None:
    """Transactions that each change several of the tables: inserts, updates, deletes, key moves."""
    rng = random.Random(seed)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for r in range(rounds):
            with conn.transaction():
                for name in rng.sample(NAMES, 3):
                    key = rng.randint(1, 60)
                    conn.execute(f"UPDATE {name} SET v = v + 1, note = %s WHERE id %% 7 = %s", (f"r{r}", r % 7))
                    conn.execute(f"INSERT INTO {name} VALUES (%s, %s, 'new') ON CONFLICT (id) DO NOTHING",
                                 (1000 + r, r))
                    conn.execute(f"DELETE FROM {name} WHERE id = %s", (key,))
                    conn.execute(f"UPDATE {name} SET id = id + 5000 WHERE id = %s", (key + 1,))


@pytest.mark.parametrize("target", ["iceberg", "ducklake"])
def test_six_tables_changed_together_converge_with_concurrency(source_dsn: str, tmp_path: Path, spark: Any,
                                                                target: str) -> None:
    _create(source_dsn)
    # One staged file per batch: many small batches of six tables, up to four of them in flight.
    config = make_config(source_dsn, tmp_path, [f"public.{n}" for n in NAMES], target,
                         apply={"concurrency": 4, "max_batch_files": 1})
    pipeline = Pipeline(config, spark=spark)
    state = Pipeline(config).setup()
    try:
        with running(pipeline):
            wait_until(lambda: streaming(state), 240, "the tables never reached STREAMING")
            _interleaved(source_dsn, 30, seed=7)
            for name in NAMES:
                wait_until(lambda name=name: assert_same(pipeline, source_dsn, f"public.{name}"), 240,
                           f"public.{name}: target != source")
        if target == "ducklake":  # read again by a DuckDB that knows nothing of headrace
            settings = config.target.settings
            assert isinstance(settings, DuckLakeConfig)
            con = plain_duckdb(settings)
            try:
                for name in NAMES:
                    _schema, expected = source_rows(source_dsn, f"public.{name}")
                    got = con.execute(f"SELECT id, v, note FROM lake.public.{name} ORDER BY id").fetchall()
                    assert got == sorted(expected), name
            finally:
                con.close()
    finally:
        state.close()
