"""End to end on DuckLake and Iceberg: small batches are built on the driver (no Spark job to build
them), a batch with a value only Spark casts goes through Spark, and the target equals the source,
read back by a DuckDB that knows nothing of headrace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from headrace.pipeline import Pipeline
from headrace.readers import duckdb_with, iceberg_metadata_location
from headrace.targets.ducklake.config import DuckLakeConfig
from headrace.targets.iceberg.config import IcebergConfig
from tests.e2e.helpers import assert_same, make_config
from tests.e2e.test_pipeline import run_caught_up
from tests.targets.test_ducklake_target import plain_duckdb

BIG = "(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 400) g)"  # 12.8 kB: TOASTed


def _batches(pipeline: Pipeline, build_lane: str) -> float:
    """Batches of public.kinds built by ``build_lane``, whatever the reasons and the apply lane."""
    return sum(s.value for m in pipeline.metrics.registry.collect() if m.name == "headrace_apply_batches"
               for s in m.samples if s.name.endswith("_total") and s.labels["table"] == "public.kinds"
               and s.labels["build_lane"] == build_lane)


@pytest.mark.parametrize("kind", ["ducklake", "iceberg"])
def test_small_batches_skip_spark_and_the_target_equals_the_source(source_dsn: str, tmp_path: Path, spark: Any,
                                                                   kind: str) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE kinds (id int PRIMARY KEY, n numeric(10,2), f float8, t text, d date,"
                     " ts timestamptz, b bytea, a int[], u uuid, j jsonb, big text);"
                     "ALTER TABLE kinds ALTER COLUMN big SET STORAGE EXTERNAL;"
                     "INSERT INTO kinds SELECT g, g / 3.0, g * 0.1, 'r' || g, DATE '2000-01-01' + g,"
                     " TIMESTAMPTZ '2020-01-01 00:00+00' + g * INTERVAL '1 second', '\\x01', ARRAY[g, NULL],"
                     " gen_random_uuid(), '{\"k\": 1}', NULL FROM generate_series(1, 20) g")
    config = make_config(source_dsn, tmp_path, ["public.kinds"], kind, apply={"driver_batch_rows": 25})
    pipeline = Pipeline(config, spark=spark)
    run_caught_up(pipeline)
    rounds = [
        # inserts with awkward but ordinary values, updates, a delete
        "INSERT INTO kinds VALUES (100, -0.01, 'NaN', 'h\u00e9 \u2603 , \"q\"', '0001-01-01',"
        " '9999-12-31 23:59:59.999999+00', '\\x', '{}', '00000000-0000-0000-0000-000000000000', 'null', NULL);"
        "UPDATE kinds SET t = NULL, f = '-Infinity' WHERE id = 1; DELETE FROM kinds WHERE id = 2",
        # a TOASTed value, then an update that leaves it unchanged, and a key move
        f"UPDATE kinds SET big = {BIG} WHERE id = 3; UPDATE kinds SET t = 'later' WHERE id = 3;"
        "UPDATE kinds SET id = 500 WHERE id = 4",
        # a value the driver leaves to Spark (a BC date, which the check below cannot read): this
        # batch goes through Spark
        "UPDATE kinds SET d = '0044-03-15 BC' WHERE id = 6",
        # a truncate, then rows again
        "UPDATE kinds SET d = NULL WHERE id = 6; TRUNCATE kinds; INSERT INTO kinds VALUES (1, 1.5, 2.5, 'after', '2024-02-29', '2024-02-29 12:00+00',"
        " '\\x00ff', '{1,2,3}', NULL, '[1, \"x\"]', 'small')",
        # more staged rows than apply.driver_batch_rows: Spark
        f"INSERT INTO kinds SELECT g, g, g, 'again', NULL, NULL, NULL, NULL, NULL, NULL, {BIG}"
        " FROM generate_series(2, 30) g; UPDATE kinds SET n = 7 WHERE id = 2",
    ]
    for sql in rounds:
        with psycopg.connect(source_dsn, autocommit=True) as conn:
            conn.execute(sql)
        run_caught_up(pipeline)
        if "BC" not in sql:
            assert_same(pipeline, source_dsn, "public.kinds")
    assert _batches(pipeline, "driver") >= 3 and _batches(pipeline, "spark") >= 2
    query = "SELECT id, n::varchar, t, a, j::varchar, length(big) FROM {} ORDER BY id"
    settings = config.target.settings
    if isinstance(settings, IcebergConfig):
        con = duckdb_with("avro", "iceberg")
        where = f"iceberg_scan('{iceberg_metadata_location(settings, 'public', 'kinds')}')"
    else:
        assert isinstance(settings, DuckLakeConfig)
        pipeline.target.close()  # one process attaches a DuckDB file once
        con, where = plain_duckdb(settings), "lake.public.kinds"
    try:
        got = con.execute(query.format(where)).fetchall()
    finally:
        con.close()
    with psycopg.connect(source_dsn) as conn:
        expected = conn.execute("SELECT id, n::text, t, a, j::text, length(big) FROM kinds ORDER BY id").fetchall()
    assert [(r[0], r[1], r[2], r[3], r[5]) for r in got] == [(r[0], r[1], r[2], r[3], r[5]) for r in expected]
    assert [r[4] for r in got] == ['[1, "x"]'] + [None] * 29  # jsonb's text, kept as PostgreSQL printed it
