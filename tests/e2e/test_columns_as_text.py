"""``source.columns_as_text``: values a column's mapped type cannot hold, kept as PostgreSQL's text.

An ``integer[]`` column holds a 2-D value and one with a lower bound of 0 (PostgreSQL allows both
in any array column) and a ``numeric(5,2)`` column holds NaN. Unlisted, the first such value
stops its table with an error naming the YAML line to add. Listed (config edited, restart, resync),
the copy, a streamed INSERT and a streamed UPDATE all read back exactly ``col::text``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from headrace.core.names import quote_spark
from headrace.pipeline import Pipeline
from headrace.state.lifecycle import TableState
from headrace.state.store import StateStore, TableRow
from tests.e2e.helpers import make_config, running, wait_until

AWKWARD = [("'{{1,2},{3,4}}'", "'NaN'"), ("'[0:1]={1,2}'", "'-0.50'"), ("'{{{NULL}}}'", "NULL"),
           ("'{1,NULL}'", "'999.99'"), ("NULL", "'NaN'")]
COPY, INSERTED, UPDATED = 10, 100, 200
LISTED = {"columns_as_text": ["public.grid.cells", 'public.grid."Price"']}


def _row(state: StateStore) -> TableRow:
    return next(r for r in state.tables() if r.qualified_name == "public.grid")


def _insert(conn: psycopg.Connection[Any], base: int) -> None:
    for i, (cells, price) in enumerate(AWKWARD, start=base + 1):
        conn.execute(f'INSERT INTO grid (id, cells, "Price") VALUES ({i}, {cells}, {price})')


def _source(dsn: str) -> dict[int, tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute('SELECT id, cells::text, "Price"::text FROM grid').fetchall()
    return {r[0]: tuple(r) for r in rows}


def _target(pipeline: Pipeline, state: StateStore) -> dict[int, tuple[Any, ...]]:
    schema = _row(state).schema
    df = pipeline.target.read_table(schema).select(*[quote_spark(c) for c in ("id", "cells", "Price")])
    return {r[0]: tuple(r) for r in df.collect()}


@pytest.mark.parametrize("target", ["ducklake", "iceberg"])
def test_an_unlisted_column_stops_naming_the_yaml_line_and_listed_it_reads_back_as_text_on_every_path(
    source_dsn: str, tmp_path: Path, spark: Any, target: str
) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute('CREATE TABLE grid (id integer PRIMARY KEY, cells integer[], "Price" numeric(5,2));'
                     "INSERT INTO grid VALUES (1, '{1,2}', 1.5)")
    api = {"listen": "127.0.0.1:0"}
    config = make_config(source_dsn, tmp_path, ["public.grid"], target, api=api)
    pipeline = Pipeline(config, spark=spark)
    state = Pipeline(config).setup()
    try:
        with running(pipeline):
            wait_until(lambda: _row(state).state is TableState.STREAMING, 180, "grid never streamed")
            with psycopg.connect(source_dsn, autocommit=True) as conn:
                conn.execute("INSERT INTO grid VALUES (2, '{{1,2},{3,4}}', 2)")
            wait_until(lambda: _row(state).state is TableState.ERRORED, 120, "grid did not stop")
        error = _row(state).error or ""
        assert "public.grid column cells: value '{{1,2},{3,4}}' cannot be stored as array<int>" in error
        assert "add `- public.grid.cells` under `source.columns_as_text:`" in error, error
        assert error.index("source.columns_as_text") < error.index("one-dimensional in the source")

        # The config lists the columns; at start-up the table's shape differs from state: it waits for a resync.
        listed = make_config(source_dsn, tmp_path, ["public.grid"], target, api=api, source=LISTED)
        pipeline = Pipeline(listed, spark=spark)
        with psycopg.connect(source_dsn, autocommit=True) as conn:
            _insert(conn, COPY)  # values only text can hold, for the copy
        with running(pipeline):
            wait_until(lambda: "source.columns_as_text now lists it" in (_row(state).error or ""), 120,
                       "start-up did not see the changed list")
            stopped = _row(state)
            assert stopped.error_kind == "terminal" and stopped.waits_for_operator
            assert "column cells (integer[]) is stored as string instead of list<int>" in (stopped.error or "")
            assert "headrace resync public.grid" in (stopped.error or "")
            wait_until(lambda: pipeline.loop_passes > 0, 60, "the run loop did not start")
            done, _ = pipeline.operations.call(pipeline.operations.resync_table("public.grid"))
            assert done
            wait_until(lambda: _row(state).state is TableState.STREAMING, 180, "grid did not stream after resync")
            assert _target(pipeline, state) == _source(source_dsn)  # the copy
            with psycopg.connect(source_dsn, autocommit=True) as conn:
                _insert(conn, INSERTED)
                for i in range(UPDATED + 1, UPDATED + 1 + len(AWKWARD)):
                    conn.execute(f"INSERT INTO grid VALUES ({i}, '{{7}}', 7)")
                for i, (cells, price) in enumerate(AWKWARD, start=UPDATED + 1):
                    conn.execute(f'UPDATE grid SET cells = {cells}, "Price" = {price} WHERE id = {i}')
            expected = _source(source_dsn)
            assert len(expected) == 2 + 3 * len(AWKWARD)
            wait_until(lambda: _target(pipeline, state) == expected, 120, "streamed values differ from col::text")
        assert _target(pipeline, state)[1 + COPY] == (1 + COPY, "{{1,2},{3,4}}", "NaN")
        assert _target(pipeline, state)[2 + UPDATED] == (2 + UPDATED, "[0:1]={1,2}", "-0.50")
    finally:
        state.close()


def test_check_names_entries_that_name_no_column_and_lists_the_others_as_kept_as_text(
    source_dsn: str, tmp_path: Path
) -> None:
    from headrace.control.assess import assess_config, format_assessment

    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute('CREATE TABLE grid (id integer PRIMARY KEY, cells integer[][], "Price" numeric(5,2))')
    listed = {"columns_as_text": ["public.grid.cells", "public.grid.price", "public.nope.x"]}
    config = make_config(source_dsn, tmp_path, ["public.grid"], "ducklake", source=listed)
    problems = assess_config(config)["problems"]
    assert problems == [
        'source.columns_as_text: table public.grid has no column price (did you mean public.grid."Price"? unquoted'
        ' names fold to lower case; quote them): fix or remove public.grid.price in source.columns_as_text',
        "source.columns_as_text: table public.nope does not exist: fix or remove public.nope.x in"
        " source.columns_as_text",
    ]
    assert Pipeline(config).check() == problems  # run refuses to start on them too
    fixed = make_config(source_dsn, tmp_path, ["public.grid"], "ducklake", source=LISTED)
    assessment = assess_config(fixed)
    assert assessment["problems"] == []
    (table,) = assessment["tables"]
    assert table["kept_as_text"] == [{"column": "cells", "pg_type": "integer[]"},
                                     {"column": "Price", "pg_type": "numeric(5,2)"}]
    assert table["multi_dimensional_arrays"] == []  # kept as text: no longer a risk
    assert "kept as text: cells (integer[]), Price (numeric(5,2))" in format_assessment("t", assessment)
