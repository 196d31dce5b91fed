"""A MariaDB chunk put in the row shape without Spark (``chunk_rows``, the copy's file lane) holds
exactly what Spark's casts give (``chunk_dataframe``) for every type of the type matrix, with each
row's ``_hr_lsn`` its chunk's snapshot position; a value only Spark decides (a zero date) hands the
chunk to Spark."""

from __future__ import annotations

import contextlib
from typing import Any

import pyarrow as pa

from headrace.core.position import Position
from headrace.core.rows import HR_LSN
from headrace.core.spark_types import ValueRules
from headrace.engines.chunks import chunk_rows, prefetched, takes_files
from headrace.engines.spark.copy import chunk_dataframe
from headrace.source.base import ChunkRead, Route
from headrace.source.mysql.catalog import read_table_schema
from headrace.source.mysql.connect import connect
from headrace.source.mysql.copy import OPEN_HIGH, OPEN_LOW, copy_chunk
from tests.source.mysql.test_types import typed_table  # noqa: F401 (a fixture)

ROUND = Position(7, 0)  # the round's position: each row must carry its chunk's own instead


def _rows(table: pa.Table) -> list[str]:
    """Every row as text: tells -0.0 from 0.0 and a timestamp's zone from none."""
    return sorted(repr(tuple(r.values())) for r in table.to_pylist())


def test_mysql_chunk_rows_equal_sparks_for_every_type_and_carry_the_chunk_position(
        typed_table: tuple[str, str, int], mariadb_server: Any, spark: Any) -> None:  # noqa: F811
    database, dsn, _start = typed_table
    with contextlib.closing(connect(mariadb_server.root_dsn + database)) as root, root.cursor() as cur:
        cur.execute("DELETE FROM typed WHERE id = 2")  # its zero dates: Spark's (below)
        cur.execute("INSERT INTO typed (id, i, fl, db, dtm6, ts3) VALUES"
                    " (4, 1, -0.0, 1e-300, '0001-01-01 00:00:00', '1970-01-01 00:00:00.001')")
    with contextlib.closing(connect(dsn)) as conn:
        schema = read_table_schema(conn, database, "typed")
    batches = list(copy_chunk(dsn, schema, OPEN_LOW, OPEN_HIGH))
    position = batches[0].column("_pos")[0].as_py()
    reader = ChunkRead(lambda start, end: iter(batches), [Route.TEXT] * len(schema.columns), per_row_position=True)
    assert takes_files(schema, reader)

    rows = chunk_rows(schema, reader.routes, batches, ROUND.lsn)
    assert rows is not None and rows.num_rows == 3
    assert set(rows.column(HR_LSN).to_pylist()) == {position} and position > ROUND.lsn
    df = chunk_dataframe(spark, schema, prefetched(reader, OPEN_LOW, OPEN_HIGH), [(OPEN_LOW, OPEN_HIGH)], ROUND,
                         ValueRules(f"{database}.typed", "stop"))
    by_spark = pa.Table.from_batches(df._collect_as_arrow())
    assert by_spark.column_names == rows.column_names
    assert _rows(by_spark.cast(rows.schema)) == _rows(rows)
    assert [f.type for f in rows.schema][:3] == [pa.int32(), pa.int32(), pa.int32()]  # typed, not text

    with contextlib.closing(connect(mariadb_server.root_dsn + database)) as root, root.cursor() as cur:
        cur.execute("SET sql_mode = ''")
        cur.execute("INSERT INTO typed (id, i, dt) VALUES (5, 1, '0000-00-00')")
    zero = list(copy_chunk(dsn, schema, OPEN_LOW, OPEN_HIGH))
    assert chunk_rows(schema, reader.routes, zero, ROUND.lsn) is None  # -infinity: values.infinity decides
