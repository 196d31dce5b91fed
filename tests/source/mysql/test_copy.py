"""Chunked copy: key ranges covering every key, each chunk under its own snapshot and position."""

from __future__ import annotations

import contextlib
from typing import Any

import pyarrow as pa

from headrace.source.mysql.catalog import read_table_schema
from headrace.source.mysql.connect import connect
from headrace.source.mysql.copy import (
    OPEN_HIGH,
    OPEN_LOW,
    WHOLE_TABLE,
    copy_chunk,
    plan_chunks,
    snapshot_position,
)


def _rows(batches: list[pa.RecordBatch]) -> list[dict[str, Any]]:
    return pa.Table.from_batches(batches).to_pylist() if batches else []


def test_chunks_cover_the_table_each_at_its_snapshot(mariadb_server: Any, mysql_db: tuple[str, str]) -> None:
    database, dsn = mysql_db
    root = connect(mariadb_server.root_dsn + database)
    with contextlib.closing(root), root.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10), f FLOAT)")
        cur.execute("CREATE TABLE keyless (v TEXT)")
        cur.executemany("INSERT INTO t VALUES (%s, %s, 0.3)", [(i, f"v{i}") for i in range(1, 31)])
        conn = connect(dsn)
        schema = read_table_schema(conn, database, "t")
        chunks = plan_chunks(conn, schema, rows_per_chunk=10)
        assert len(chunks) == 3 and chunks[0][0] == OPEN_LOW and chunks[-1][1] == OPEN_HIGH
        assert plan_chunks(conn, read_table_schema(conn, database, "keyless"), 10) == [WHOLE_TABLE]

        first = copy_chunk(dsn, schema, *chunks[0], batch_rows=4)
        head = next(first)  # its snapshot is taken now
        cur.execute("INSERT INTO t VALUES (0, 'new', 1), (1000, 'past', 2)")  # below and past the planned range
        cur.execute("UPDATE t SET v = 'changed' WHERE id IN (2, 29)")
        copied = [_rows([head, *first]), *(_rows(list(copy_chunk(dsn, schema, *c))) for c in chunks[1:])]
        assert snapshot_position(conn) > copied[0][0]["_pos"]
        conn.close()

    assert [r["c0"] for r in copied[0]] == [str(i) for i in range(1, 11)]  # 0 and the update came later
    assert {r["c1"] for r in copied[0] if r["c0"] == "2"} == {"v2"} and {r["c2"] for r in copied[0]} == {"0.3"}
    assert {r["c1"] for r in copied[2] if r["c0"] == "29"} == {"changed"}
    assert "1000" in {r["c0"] for r in copied[2]}
    positions = [{r["_pos"] for r in rows} for rows in copied]
    assert all(len(p) == 1 for p in positions) and min(positions[0]) < min(positions[1]) == min(positions[2])
    # Key 0 was inserted into the first range after its snapshot: the binlog brings it (test_binlog).
    assert sorted(int(r["c0"]) for rows in copied for r in rows) == [*range(1, 31), 1000]
