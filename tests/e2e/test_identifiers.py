"""End to end: schemas, tables and columns with every awkward kind of PostgreSQL name.

Mixed case, spaces, dots, double quotes, backticks, reserved words, non-ASCII, 63 bytes, a slash;
listed in ``source.tables``, found by ``source.schemas``, added through the API; copied and streamed
(insert, update, delete) with the target read back equal to the source; shown by ``status`` and
``/metrics`` in the display form.
"""

from __future__ import annotations

import html
import json
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from headrace.control.status import pipeline_status
from headrace.core.errors import UnsupportedError
from headrace.core.names import TableName, quote_ident
from headrace.pipeline import Pipeline
from headrace.source.postgres.catalog import read_table_schema
from headrace.source.postgres.throwaway import free_port
from tests.e2e.helpers import assert_same, make_config, running, wait_until
from tests.e2e.test_pipeline import run_caught_up

LONG_TABLE = "é" * 31 + "x"  # 63 bytes in UTF-8: PostgreSQL's longest name
LONG_COLUMN = "c" * 63
# Columns: "ID" and id differ only in case (Spark folds case unless told not to; DuckDB cannot hold
# both, see test_ducklake_refuses_case_twins), a reserved word, a dot, a double quote and a
# backtick, non-ASCII with a space, and 63 bytes.
COLUMNS = ['ID', 'id', 'order', 'a.b', 'q"uote`tick', 'Café 表', LONG_COLUMN]
_TWIN = "id"

# (schema, table) of each awkward kind; every table gets the awkward columns.
LISTED = [
    TableName("Sales", "Order Items"),  # capitals and a space in both parts
    TableName("public", "select"),  # a reserved word
    TableName("café", "表"),  # non-ASCII
    TableName("public", 'x.y"z'),  # a dot and a double quote
    TableName("public", LONG_TABLE),  # 63 bytes
    TableName("public", "in/out"),  # a slash: a directory separator for file-based catalogs
    TableName("public", ".."),  # a path that climbs: mapped in the Iceberg Hadoop catalog
]
ADDED = TableName("Sales", "User")  # added through the API while running


def _create(conn: psycopg.Connection[Any], table: TableName, first_id: int, twins: bool = True) -> None:
    conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(table.schema)}")
    cols = ", ".join(f"{quote_ident(c)} {'int' if c in ('ID', 'id') else 'text'}" for c in COLUMNS
                     if twins or c != _TWIN)
    conn.execute(f"CREATE TABLE {table.sql} ({cols}, PRIMARY KEY ({quote_ident('ID')}))")
    _insert(conn, table, range(first_id, first_id + 3))


def _insert(conn: psycopg.Connection[Any], table: TableName, ids: range) -> None:
    for i in ids:
        values = dict(zip(COLUMNS, (i, -i, f"o{i}", f"a.b{i}", f'"`{i}', f"表{i}", f"long{i}"), strict=True))
        have = [c for (c,) in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0", (table.sql,))]
        names = ", ".join(quote_ident(c) for c in have)
        conn.execute(f"INSERT INTO {table.sql} ({names}) VALUES ({', '.join(['%s'] * len(have))})",
                     [values[c] for c in have])


def _change(conn: psycopg.Connection[Any], table: TableName, first_id: int) -> None:
    _insert(conn, table, range(first_id + 10, first_id + 12))
    conn.execute(f"UPDATE {table.sql} SET {quote_ident('a.b')} = 'changed', {quote_ident('order')} = NULL"
                 f" WHERE {quote_ident('ID')} = %s", (first_id,))
    conn.execute(f"DELETE FROM {table.sql} WHERE {quote_ident('ID')} = %s", (first_id + 1,))


def _api(base: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else (b"{}" if method == "POST" else None)
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except urllib.error.URLError:  # not listening yet
        return 0, {}


def _metric_tables(pipeline: Pipeline) -> set[str]:
    text = pipeline.metrics.exposition().decode()
    return {s.labels["table"] for fam in text_string_to_metric_families(text) for s in fam.samples
            if "table" in s.labels}


@pytest.fixture(params=["iceberg", "ducklake"])
def target(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_awkward_names_listed_added_copied_streamed_and_shown(source_dsn: str, tmp_path: Path, spark: Any,
                                                              target: str) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        for i, table in enumerate([*LISTED, ADDED]):
            _create(conn, table, 100 * i, twins=target == "iceberg")
    port = free_port()
    # The config spells each table in SQL syntax: quoted where needed, the plain one unquoted.
    config = make_config(source_dsn, tmp_path, [str(t) for t in LISTED], target,
                         api={"listen": f"127.0.0.1:{port}"})
    assert config.source.table_names == LISTED
    pipeline = Pipeline(config, spark=spark)
    assert pipeline.check() == []
    run_caught_up(pipeline)
    for table in LISTED:
        assert assert_same(pipeline, source_dsn, str(table)) == 3, table
    base = f"http://127.0.0.1:{port}"
    with running(pipeline):
        wait_until(lambda: _api(base, "GET", "/api/tables")[0] == 200, 60, "the API to answer")
        status, body = _api(base, "POST", "/api/tables", {"table": '"Sales"."User"'})
        assert status in (200, 201, 202), body
        wait_until(lambda: _api(base, "GET", "/api/tables/" + urllib.parse.quote(str(ADDED), safe=""))[1]
                   .get("state") == "STREAMING", 120, "the added table to stream")
        with psycopg.connect(source_dsn, autocommit=True) as conn:
            for i, table in enumerate([*LISTED, ADDED]):
                _change(conn, table, 100 * i)
        for table in [*LISTED, ADDED]:
            wait_until(lambda t=table: assert_same(pipeline, source_dsn, str(t)) == 4, 120,
                       f"{table} to match the source")
        for table in [*LISTED, ADDED]:  # each one by its URL-encoded display form
            status, body = _api(base, "GET", "/api/tables/" + urllib.parse.quote(str(table), safe=""))
            assert status == 200 and body["table"] == str(table), body
        with urllib.request.urlopen(base + "/", timeout=60) as resp:  # the status page
            page = resp.read().decode()
        for table in [*LISTED, ADDED]:  # escaped for HTML, and for the JS of its buttons
            assert f'<tr data-table="{html.escape(str(table))}">' in page
            assert html.escape(json.dumps(str(table))) in page
        status, body = _api(base, "POST", "/api/tables/" + urllib.parse.quote('"Sales".User', safe="") + "/pause")
        assert status == 404 and '"Sales"."user"' in body["error"], body  # unquoted folds, as in SQL
    shown = {t["table"]: t for t in pipeline_status(config)["tables"]}
    assert set(shown) == {str(t) for t in [*LISTED, ADDED]}
    assert all(t["state"] == "STREAMING" and not t["error"] for t in shown.values()), shown
    if target == "iceberg":  # the Hadoop catalog keeps a table in <namespace>/<table>: mapped
        assert shown['public."in/out"']["target_table"].endswith(".public.`in%2Fout`")
        assert shown['public.".."']["target_table"].endswith(".public.`%2E%2E`")
    else:
        assert shown['public."in/out"']["target_table"] == 'public."in/out"'
        assert shown['"Sales"."Order Items"']["target_table"] == '"Sales"."Order Items"'
    assert {str(t) for t in [*LISTED, ADDED]} <= _metric_tables(pipeline)


def test_awkward_schemas_are_discovered(source_dsn: str, tmp_path: Path, spark: Any, target: str) -> None:
    tables = [TableName("Sales", "Order Items"), TableName("café", "表"), TableName("a.b", "c d")]
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        for i, table in enumerate(tables):
            _create(conn, table, 100 * i, twins=target == "iceberg")
        _create(conn, TableName("sales", "elsewhere"), 900)  # "sales" is another schema than "Sales"
    config = make_config(source_dsn, tmp_path, [], target,
                         source={"schemas": ["Sales", "café", "a.b"], "discovery_seconds": 0.5})
    pipeline = Pipeline(config, spark=spark)
    run_caught_up(pipeline)
    for table in tables:
        assert assert_same(pipeline, source_dsn, str(table)) == 3, table
    created = TableName("Sales", "New Table")
    with running(pipeline), psycopg.connect(source_dsn, autocommit=True) as conn:
        _create(conn, created, 500, twins=target == "iceberg")
        for i, table in enumerate([*tables, created]):
            _change(conn, table, 100 * i if table != created else 500)
        for table in [*tables, created]:
            wait_until(lambda t=table: assert_same(pipeline, source_dsn, str(t)) == 4, 120,
                       f"{table} to match the source")
    assert {t["table"] for t in pipeline_status(config)["tables"]} == {str(t) for t in [*tables, created]}


def test_ducklake_refuses_case_twins(source_dsn: str, tmp_path: Path, spark: Any) -> None:
    """DuckDB names are case-insensitive: columns "ID" and id in one table, or tables "Pair" and pair,
    are refused with the fix, never mixed."""
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        _create(conn, TableName("public", "Twins"), 0)
        _create(conn, TableName("public", "Pair"), 0, twins=False)
        _create(conn, TableName("public", "pair"), 0, twins=False)
        twins, pair, pair_lower = (read_table_schema(conn, t) for t in ('"Twins"', '"Pair"', "pair"))
    pipeline = Pipeline(make_config(source_dsn, tmp_path, ['"Twins"'], "ducklake"), spark=spark)
    try:
        with pytest.raises(UnsupportedError, match=r'columns "ID" and id, which differ only in case.*RENAME COLUMN'):
            pipeline.target.ensure_table(twins)
        pipeline.target.ensure_table(pair)
        with pytest.raises(UnsupportedError, match=r'public.pair would be DuckLake table public.pair, but the lake'
                                                   r' has public."Pair"'):
            pipeline.target.ensure_table(pair_lower)
    finally:
        pipeline.target.close()
