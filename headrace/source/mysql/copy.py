"""The initial copy of a MySQL/MariaDB table, in chunks that run as Spark tasks.

Method: each chunk is one primary-key range read in its own ``START TRANSACTION WITH CONSISTENT
SNAPSHOT``; MariaDB reports the binlog position of that snapshot (``binlog_snapshot_file`` and
``binlog_snapshot_position``), which every row of the chunk carries as ``_pos``. Transactions in
the snapshot start before that position, later ones at or after it, so the chunk plus the binlog
from its position gives the range's rows at any later point; chunks taken at different positions
converge once the binlog after the smallest of them is applied (the same merge as the PostgreSQL
resume path). No global lock (no ``FLUSH TABLES WITH READ LOCK``), and a failed chunk is copied
again alone. MySQL (not MariaDB) has no snapshot position: there this raises, naming the fix.

Rows stream through a server-side cursor; values are the text ``types.to_text`` gives, so a
copied row and the same row read from the binlog are equal.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pymysql.cursors

from headrace.core.errors import SourceError, TransientError
from headrace.core.faults import hold_seconds
from headrace.core.filesink import ROW_GROUP_ROWS
from headrace.core.names import TableName
from headrace.core.schema import TableSchema, TypeKind
from headrace.source.mysql.catalog import read_table_schema
from headrace.source.mysql.connect import connect
from headrace.source.mysql.copy_arrow import arrow_plan, read_chunk_arrow
from headrace.source.mysql.copy_locks import marked
from headrace.source.mysql.position import to_int
from headrace.source.mysql.types import select_expression, text_converter

Conn = Any  # a pymysql connection
WHOLE_TABLE = (0, 0)
# A chunk bound at these values is open: the first chunk has no lower bound and the last no upper
# bound, so rows inserted past the planned range after planning are still copied by some chunk.
OPEN_LOW, OPEN_HIGH = -(2**63), 2**63 - 1
BATCH_ROWS = 10_000
_TABLE_DEF_CHANGED = 1412  # ER_TABLE_DEF_CHANGED: altered after the snapshot began
_CONNECTION_LOST = (2006, 2013)  # server gone, connection lost (errmsg.h)
log = logging.getLogger(__name__)
_told: set[int] = set()  # tables whose reason for the pymysql path was logged (once per process)


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _from(schema: TableSchema) -> str:
    return f"{_quote(schema.schema)}.{_quote(schema.name)}"


def _chunk_key(schema: TableSchema) -> str | None:
    """The single integer key column ranges can split on, or None (then one whole-table chunk)."""
    if len(schema.key) != 1:
        return None
    column = schema.column(schema.key[0])
    return column.name if column.type.kind in (TypeKind.INT, TypeKind.LONG) else None


def plan_chunks(conn: Conn, schema: TableSchema, rows_per_chunk: int) -> list[tuple[int, int]]:
    """Key ranges ``(start, end)`` (``start <= key < end``) of about ``rows_per_chunk`` rows each.

    The first range starts at ``OPEN_LOW`` and the last ends at ``OPEN_HIGH``, both meaning
    unbounded. A table without a single integer key column (or an empty one) is one chunk,
    ``WHOLE_TABLE`` = ``(0, 0)``.
    """
    key = _chunk_key(schema)
    if key is None:
        return [WHOLE_TABLE]
    with conn.cursor() as cur:
        cur.execute(f"SELECT MIN({_quote(key)}), MAX({_quote(key)}), COUNT(*) FROM {_from(schema)}")
        low, high, count = cur.fetchone()
    if not count:
        return [WHOLE_TABLE]
    chunks = max(1, -(-int(count) // max(1, rows_per_chunk)))
    width = max(1, -(-(int(high) - int(low) + 1) // chunks))
    bounds = list(range(int(low), int(high) + 1, width))[1:]
    starts = [OPEN_LOW, *bounds]
    ends = [*bounds, OPEN_HIGH]
    return list(zip(starts, ends, strict=True))


def snapshot_position(conn: Conn, epoch: int = 0) -> int:
    """The binlog position of the connection's consistent snapshot (or, outside one, of now).

    Call it inside ``START TRANSACTION WITH CONSISTENT SNAPSHOT``: MariaDB reports where the binlog
    stood when the snapshot was taken.
    """
    with conn.cursor() as cur:
        cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
        status = {name.lower(): value for name, value in cur.fetchall()}
    file, offset = status.get("binlog_snapshot_file"), status.get("binlog_snapshot_position")
    if not file or offset is None:
        raise SourceError("the source reports no binlog_snapshot_file/position: the chunked copy needs MariaDB"
                          " (10.0 or later) with the binary log on (log_bin in my.cnf)")
    return to_int(str(file), int(offset), epoch)


def _where(schema: TableSchema, start: int, end: int) -> tuple[str, tuple[int, ...]]:
    key = _chunk_key(schema)
    if (start, end) == WHOLE_TABLE or key is None:
        return "", ()
    conditions, args = [], []
    if start != OPEN_LOW:
        conditions.append(f"{_quote(key)} >= %s")
        args.append(start)
    if end != OPEN_HIGH:
        conditions.append(f"{_quote(key)} < %s")
        args.append(end)
    return (" WHERE " + " AND ".join(conditions) if conditions else ""), tuple(args)


def _same_shape(copied: TableSchema, now: TableSchema) -> bool:
    return [(c.name, c.type) for c in copied.columns] == [(c.name, c.type) for c in now.columns]


def _inlined(schema: TableSchema, start: int, end: int) -> str:
    where, args = _where(schema, start, end)
    return where.replace("%s", "{}").format(*(int(a) for a in args))  # integer bounds only


def _check_shape(dsn: str, schema: TableSchema) -> None:
    with contextlib.closing(connect(dsn)) as conn:
        now = read_table_schema(conn, schema.schema, schema.name)
    if not _same_shape(schema, now):
        raise TransientError(f"table {TableName(schema.schema, schema.name)} changed shape since its copy was"
                             " planned; the copy is planned again with the new shape")


def copy_chunk(dsn: str, schema: TableSchema, start: int, end: int, batch_rows: int = BATCH_ROWS,
               compiled: bool = True, epoch: int = 0) -> Iterator[pa.RecordBatch]:
    """The rows of chunk ``(start, end)`` of ``schema``'s table as Arrow batches (runs in a Spark task).

    Columns ``c0..cN`` (strings, in ``schema.columns`` order; NULL for SQL NULL) and ``_pos`` (int64,
    the snapshot's binlog position, on every row, in server ``epoch``: ``position.to_int``). Read by connectorx (``copy_arrow``) when it reads
    every column exactly and ``compiled`` and the chunk is a key range, else by pymysql (the reason
    logged once per table). Raises
    TransientError when the table's shape differs from ``schema`` (changed since the copy was planned:
    the caller re-reads it and retries).
    """
    plan = arrow_plan(schema.columns) if compiled else "compiled=False"
    if (start, end) == WHOLE_TABLE:
        # connectorx reads a chunk into memory whole; a table that is one chunk may be any size.
        plan = "a table copied as one chunk (no single integer key, or empty when planned) streams through pymysql"
    if isinstance(plan, str):
        if compiled and schema.oid not in _told:
            _told.add(schema.oid)
            log.info("copying %s.%s through pymysql: %s", schema.schema, schema.name, plan)
        yield from _copy_chunk_pymysql(dsn, schema, start, end, batch_rows, epoch)
        return
    # The shape before and after the read: an ALTER during the read fails it (ER_TABLE_DEF_CHANGED)
    # or waits for it and shows after it.
    _check_shape(dsn, schema)
    before = []
    if held := hold_seconds("snapshot.read"):  # tests: a long read, holding the table's lock
        before.append(f"SELECT {marked(schema.oid)} SLEEP({float(held)}) FROM {_from(schema)} LIMIT 1")
    # The compiled read holds the chunk whole: batches up to a Parquet row group's rows, so the
    # copy's work per batch (chunk_rows' casts) runs about once a chunk, not every BATCH_ROWS rows.
    whole = max(batch_rows, ROW_GROUP_ROWS)
    yield from read_chunk_arrow(dsn, schema, plan, _inlined(schema, start, end), before, whole, epoch)
    _check_shape(dsn, schema)


def _copy_chunk_pymysql(dsn: str, schema: TableSchema, start: int, end: int,
                        batch_rows: int, epoch: int) -> Iterator[pa.RecordBatch]:
    """``copy_chunk`` through pymysql: the connection, its snapshot transaction and the server-side
    cursor live as long as the iterator."""
    names = [f"c{i}" for i in range(len(schema.columns))]
    arrow_schema = pa.schema([*(pa.field(n, pa.string()) for n in names), pa.field("_pos", pa.int64())])
    conn = connect(dsn, cursorclass=pymysql.cursors.SSCursor, autocommit=False)
    with contextlib.closing(conn):
        with conn.cursor() as cur:
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        position = snapshot_position(conn, epoch)
        now = read_table_schema(conn, schema.schema, schema.name)
        if not _same_shape(schema, now):
            raise TransientError(f"table {TableName(schema.schema, schema.name)} changed shape since its copy was"
                                 " planned; the copy is planned again with the new shape")
        where, args = _where(schema, start, end)
        columns = schema.columns
        converters = [text_converter(c) for c in columns]
        # Marked, so the copy's watch can tell its reads from the application's (copy_locks).
        sql = (f"SELECT {marked(schema.oid)} {', '.join(select_expression(c) for c in columns)}"
               f" FROM {_from(schema)}{where}")
        table = TableName(schema.schema, schema.name)
        try:
            with conn.cursor() as cur:
                if held := hold_seconds("snapshot.read"):  # tests: a long read, holding the table's lock
                    cur.execute(f"SELECT {marked(schema.oid)} SLEEP(%s) FROM {_from(schema)} LIMIT 1", (held,))
                    cur.fetchall()
                cur.execute(sql, args)
                while rows := cur.fetchmany(batch_rows):
                    texts = [[convert(row[i]) for row in rows] for i, convert in enumerate(converters)]
                    arrays = [pa.array(t, pa.string()) for t in texts]
                    arrays.append(pa.array([position] * len(rows), pa.int64()))
                    yield pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)
            conn.commit()
        except pymysql.err.OperationalError as exc:
            code = exc.args[0] if exc.args else 0
            if code == _TABLE_DEF_CHANGED:
                raise TransientError(f"table {table} was altered while its chunk was copied; the chunk is copied"
                                     " again") from exc
            if code in _CONNECTION_LOST:
                raise TransientError(f"the connection copying {table} was lost ({exc.args[-1]}); the chunk is"
                                     " copied again") from exc
            raise
