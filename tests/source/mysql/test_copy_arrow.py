"""The compiled copy (connectorx, ``copy_arrow``) against the pymysql copy: the same text for every type
of the type matrix, the same snapshot position, and the pymysql path kept for what it cannot read."""

from __future__ import annotations

import contextlib
from typing import Any

import pyarrow as pa

from headrace.core.schema import Column, ColumnType, TypeKind
from headrace.source.mysql.catalog import read_table_schema
from headrace.source.mysql.connect import connect
from headrace.source.mysql.copy import OPEN_HIGH, OPEN_LOW, copy_chunk, plan_chunks
from headrace.source.mysql.copy_arrow import arrow_plan
from tests.source.mysql.test_types import INET4S, INET6S, UUIDS, typed_table  # noqa: F401 (a fixture)

EXTRA = [
    ("l", "VARCHAR(10) CHARACTER SET latin1", ["'ü'", "''"]),
    ("u", "UUID", [f"'{UUIDS[0]}'", f"'{UUIDS[2]}'"]),
    ("i4", "INET4", [f"'{INET4S[1]}'", f"'{INET4S[0]}'"]),
    ("i6", "INET6", [f"'{INET6S[2]}'", f"'{INET6S[0]}'"]),
    ("f2", "FLOAT", ["1e-7", "-0.0"]),
    ("d2", "DOUBLE", ["1e22", "100"]),
    ("dtm3", "DATETIME(3)", ["'2024-01-01 00:00:00.5'", "'2024-01-01 00:00:00'"]),
    ("d0", "DECIMAL(30,20)", ["'-0.00000000000000000001'", "0"]),
]


def _copied(dsn: str, schema: Any, compiled: bool, chunk: tuple[int, int] = (OPEN_LOW, OPEN_HIGH)) -> list[dict[str, Any]]:
    return pa.Table.from_batches(list(copy_chunk(dsn, schema, *chunk, batch_rows=2, compiled=compiled))).to_pylist()


def test_compiled_copy_equals_pymysql_copy_for_every_type(typed_table: tuple[str, str, int],  # noqa: F811
                                                          mariadb_server: Any) -> None:
    database, dsn, _start = typed_table
    with contextlib.closing(connect(mariadb_server.root_dsn + database)) as root, root.cursor() as cur:
        cur.execute("ALTER TABLE typed " + ", ".join(f"ADD {name} {sql_type}" for name, sql_type, _ in EXTRA))
        for row_id in (1, 2):
            values = ", ".join(f"{name} = {values[row_id - 1]}" for name, _, values in EXTRA)
            cur.execute(f"UPDATE typed SET {values} WHERE id = {row_id}")
    with contextlib.closing(connect(dsn)) as conn:
        schema = read_table_schema(conn, database, "typed")
    assert not isinstance(arrow_plan(schema.columns), str)
    by_id = {True: _copied(dsn, schema, True), False: _copied(dsn, schema, False)}
    compiled, reference = (sorted(rows, key=lambda r: int(r["c0"])) for rows in by_id.values())
    assert len(compiled) == 3 and compiled == reference  # every column, every row, and _pos


def test_compiled_copy_chunks_and_fallback(mariadb_server: Any, mysql_db: tuple[str, str]) -> None:
    database, dsn = mysql_db
    with contextlib.closing(connect(mariadb_server.root_dsn + database)) as root, root.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))")
        cur.executemany("INSERT INTO t VALUES (%s, %s)", [(i, f"v{i}") for i in range(1, 31)])
    with contextlib.closing(connect(dsn)) as conn:
        schema = read_table_schema(conn, database, "t")
        chunks = plan_chunks(conn, schema, rows_per_chunk=10)
    for chunk in chunks:
        assert _copied(dsn, schema, True, chunk) == _copied(dsn, schema, False, chunk)
    assert sorted(int(r["c0"]) for c in chunks for r in _copied(dsn, schema, True, c)) == list(range(1, 31))
    # MySQL's JSON (no server here): the table stays on the pymysql path, and says why.
    json = Column("doc", ColumnType(TypeKind.JSON, "json"), 0, -1, True, 1)
    assert arrow_plan([json]) == "column doc (json) has no exact compiled read"
