"""The initial copy's fast read: one chunk as binary COPY decoded straight into typed Arrow, in C.

``COPY (SELECT ...) TO STDOUT (FORMAT binary)`` is drained by psycopg2 into a buffer and decoded by
``headrace._copy_binary`` (C) into Arrow buffers, so most columns arrive typed and need no cast in
Spark (``SnapshotSession``; without that extension the ADBC PostgreSQL driver reads and decodes the
same statement). Measured on 2M rows of ``bench/initial_copy.py``'s table read in its seven 4096-page
chunks by one session (2-core machine, 2026-11-28): this read 2.0 s wall / 0.7 s of this process's
CPU, ADBC 1.13 1.8 s / 1.8 s (it decodes while the rows arrive; the copy's threads keep both cores
busy, where CPU is what counts); raw binary COPY into psql ~1.4 s (docs/benchmarks.md).

Each column takes one of three routes (``column_routes``), so a value ends in the target exactly as
the change stream (which casts PostgreSQL's text) would write it:

- ``BINARY``: types whose binary form decodes to the very value the text cast gives: boolean,
  smallint/integer, bigint, real, double precision (NaN and infinities included), bytea, text and
  character varying. Each is selected with an explicit cast to its base type, so a domain over
  one of these (text and varchar excepted: their domains take the text route) reads as its base.
- ``SPLIT``: date, timestamp and timestamptz. Values in years 1..9999 come binary; the rest
  (infinities, BC, beyond 9999) as text in a second column, for ``cast_text``'s range rules. The
  driver would wrap infinities into wrong dates, so they must never come binary.
- ``TEXT``: everything else, as the type's output function prints it (the CSV path's text):
  numeric (the driver prints ``nan`` where PostgreSQL prints ``NaN``), char(n), time, interval,
  uuid, json, arrays, ranges, enums, domains over those and over text, and ``source.columns_as_text``
  columns.
"""

from __future__ import annotations

import enum
import io
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import pyarrow as pa
from psycopg import sql

from headrace.core.errors import SourceError, TransientError
from headrace.core.faults import hold_seconds
from headrace.core.schema import ColumnType, TableSchema, TypeKind
from headrace.core.sqlstate import error_for_sqlstate
from headrace.source.postgres.copy import OPEN_END, copy_connection, copy_conninfo

try:
    from headrace._copy_binary import decode as _native_decode
except ImportError:  # built without a C compiler: the ADBC driver decodes instead
    _native_decode = None
# (buffer, position, kinds, most rows) -> (per column: its buffers and NULL count, rows, next position, done)
_decode: Callable[[Any, int, bytes, int], tuple[list[tuple[Any, ...]], int, int, bool]] | None = _native_decode


class Route(enum.Enum):
    """How one column of a chunk is read (module docstring)."""

    BINARY = "binary"
    SPLIT = "split"
    TEXT = "text"


# kind -> (SQL cast to the base type, Arrow type the driver yields for it)
_BINARY: dict[TypeKind, tuple[str, pa.DataType]] = {
    TypeKind.BOOLEAN: ("boolean", pa.bool_()),
    TypeKind.INT: ("integer", pa.int32()),
    TypeKind.LONG: ("bigint", pa.int64()),
    TypeKind.FLOAT: ("real", pa.float32()),
    TypeKind.DOUBLE: ("double precision", pa.float64()),
    TypeKind.BINARY: ("bytea", pa.binary()),
}
# Strings whose binary form is their text output byte for byte (char(n) is not: its cast trims).
_TEXT_TYPES = ("text", "character varying")
# kind -> (SQL cast, Arrow type, the range [low, high) that comes binary)
_SPLIT: dict[TypeKind, tuple[str, pa.DataType, str, str]] = {
    TypeKind.DATE: ("date", pa.date32(), "0001-01-01", "10000-01-01"),
    TypeKind.TIMESTAMP: ("timestamp", pa.timestamp("us"), "0001-01-01", "10000-01-01"),
    TypeKind.TIMESTAMPTZ: ("timestamptz", pa.timestamp("us", tz="UTC"), "0001-01-01 00:00:00+00",
                           "10000-01-01 00:00:00+00"),
}

# Settings that make the server print text-route values the way headrace's casts expect.
SESSION_SETTINGS = ("SET TimeZone = 'UTC'", "SET DateStyle = 'ISO'", "SET IntervalStyle = 'postgres'",
                    "SET bytea_output = 'hex'", "SET extra_float_digits = 1")


def column_route(ct: ColumnType) -> Route:
    """The route of a column of type ``ct`` (module docstring)."""
    # A kind other than STRING is the column's own type or a domain's base type, never a
    # ``source.columns_as_text`` column (those are STRING whatever their type).
    if ct.kind in _BINARY:
        return Route.BINARY
    if ct.kind is TypeKind.STRING and ct.pg_type.split("(")[0] in _TEXT_TYPES:
        return Route.BINARY
    if ct.kind in _SPLIT:
        return Route.SPLIT
    return Route.TEXT


def column_routes(table: TableSchema) -> list[Route]:
    """``column_route`` of each column of ``table``, in order."""
    return [column_route(c.type) for c in table.columns]


def arrow_schema(table: TableSchema) -> pa.Schema:
    """Schema of the batches ``copy_chunk_binary`` yields.

    Column i is ``c{i}`` (typed for BINARY and SPLIT, else text); a SPLIT column adds ``t{i}``,
    its text where ``c{i}`` is outside the binary range. Positional names, because source column
    names can be anything Arrow or Spark would trip on.
    """
    fields = []
    for i, (col, route) in enumerate(zip(table.columns, column_routes(table), strict=True)):
        if route is Route.BINARY:
            kind = col.type.kind
            fields.append(pa.field(f"c{i}", _BINARY[kind][1] if kind in _BINARY else pa.string()))
        elif route is Route.SPLIT:
            fields += [pa.field(f"c{i}", _SPLIT[col.type.kind][1]), pa.field(f"t{i}", pa.string())]
        else:
            fields.append(pa.field(f"c{i}", pa.string()))
    return pa.schema(fields)


def select_statement(table: TableSchema, start: int, end: int) -> sql.Composed:
    """``SELECT`` of one page range of ``table`` shaped as ``arrow_schema``."""
    items = []
    for col, route in zip(table.columns, column_routes(table), strict=True):
        ident = sql.Identifier(col.name)
        if route is Route.BINARY:
            cast = _BINARY[col.type.kind][0] if col.type.kind in _BINARY else "text"
            items.append(sql.SQL("{}::{}").format(ident, sql.SQL(cast)))
        elif route is Route.SPLIT:
            cast, _, low, high = _SPLIT[col.type.kind]
            inside = sql.SQL("{c}::{t} >= {lo}::{t} AND {c}::{t} < {hi}::{t}").format(
                c=ident, t=sql.SQL(cast), lo=sql.Literal(low), hi=sql.Literal(high))
            items.append(sql.SQL("CASE WHEN {} THEN {}::{} END").format(inside, ident, sql.SQL(cast)))
            # date and timestamps have no cast to text: ::text calls their output function.
            items.append(sql.SQL("CASE WHEN NOT ({}) THEN {}::text END").format(inside, ident))
        elif col.type.kind is TypeKind.DECIMAL:
            # numeric has no cast to text in pg_cast, so ::text is an I/O conversion: numeric_out, the
            # very text format() prints, for ~10% less server CPU a COPY (bench table).
            items.append(sql.SQL("{}::text").format(ident))
        else:
            # format() prints with the type's output function, as COPY's text does (a cast to text
            # need not: boolean::text is 'true', inet::text adds '/32', char(n)::text trims). It
            # prints NULL as '', hence the test; num_nonnulls, because a composite of NULLs IS NULL.
            items.append(sql.SQL("CASE WHEN num_nonnulls({c}) = 1 THEN format('%s', {c}) END").format(c=ident))
    bounds = [sql.SQL("ctid >= {}::tid").format(sql.Literal(f"({start},0)"))]
    if end < OPEN_END:
        bounds.append(sql.SQL("ctid < {}::tid").format(sql.Literal(f"({end},0)")))
    return sql.SQL("SELECT {} FROM {}.{} WHERE {}").format(
        sql.SQL(", ").join(items), sql.Identifier(table.schema), sql.Identifier(table.name),
        sql.SQL(" AND ").join(bounds))


def copy_chunk_binary(dsn: str, snapshot_name: str | None, table: TableSchema, start: int, end: int
                      ) -> Iterator[pa.RecordBatch]:
    """Read one page range of ``table`` as Arrow batches of ``arrow_schema``, by binary COPY.

    With ``snapshot_name`` the read sees the exported snapshot; without it, a fresh REPEATABLE
    READ snapshot. One connection per chunk, as the CSV path.
    """
    session = SnapshotSession(dsn, snapshot_name, table.qualified_name)
    try:
        got = session.read(table, start, end)
    finally:
        session.close()
    yield from got


class SnapshotSession:
    """One connection reading chunk after chunk of any tables, each read in a REPEATABLE READ
    transaction of its own that imports ``snapshot_name`` (None: its own snapshot): for the driver's
    reads of many small tables, which then pay the connection once. Opening one cost ~50 ms wall and
    ~30 ms of this process's CPU through ADBC (the driver loads the server's type catalog), a 1,000-row
    read on an open one ~1 ms (measured on our 2-core machine): per small table, the connection was
    most of its read.

    The read itself: ``COPY (SELECT ...) TO STDOUT (FORMAT binary)`` drained by psycopg2 in C into a
    buffer, decoded by ``headrace._copy_binary`` in C (``decode_batches``). Without that extension (no
    C compiler at install) the ADBC driver runs and decodes the same statement: the same values, but
    its wheels since 1.9 are built unoptimized: 2.5x this read's CPU (module docstring).

    Parked between reads, the session is in no transaction: a transaction holds an ACCESS SHARE lock
    on every table it read until it ends, and a DDL statement queued behind such a lock queues the
    application's writes behind it (issue 35). A read's transaction costs two more round trips.

    A failed read leaves the session ``broken``: it must be closed.
    """

    def __init__(self, dsn: str, snapshot_name: str | None, opened_for: str) -> None:
        self.snapshot_name = snapshot_name
        self.broken = False
        try:
            self._conn: _Native | _Adbc = (_Native if _decode is not None else _Adbc)(dsn, opened_for)
        except _ServerError as exc:
            self._raise(exc, f"the session for {opened_for}")

    def read(self, table: TableSchema, start: int, end: int) -> list[pa.RecordBatch]:
        """Page range ``[start, end)`` of ``table`` as batches of ``arrow_schema(table)``."""
        doing = f"copy of {table.qualified_name} pages {start}..{end}"
        statement = select_statement(table, start, end).as_string()
        try:
            self._conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            if self.snapshot_name is not None:
                doing = f"the snapshot import for {table.qualified_name}"
                self._conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(
                    sql.Literal(self.snapshot_name)).as_string())
                doing = f"copy of {table.qualified_name} pages {start}..{end}"
            got = self._conn.read(statement, arrow_schema(table))
            if held := hold_seconds("snapshot.read"):  # tests: a long read, holding the table's lock
                self._conn.execute(f"SELECT pg_sleep({held})")
            self._conn.execute("ROLLBACK")  # nothing was written: ends the transaction and its locks
        except _ServerError as exc:
            self.broken = True
            self._raise(exc, doing)
        return got

    def close(self) -> None:
        """Close the connection (a read's transaction ended with the read)."""
        self._conn.close()

    def _raise(self, exc: _ServerError, doing: str) -> NoReturn:
        """Raise the driver's error as the CSV path would: same kind, message and fix."""
        if exc.sqlstate == "42704":  # undefined_object: the snapshot is gone for good
            raise SourceError(
                f"snapshot {self.snapshot_name} for {doing} is no longer available: "
                "the exporting transaction ended; restart the table's snapshot"
            ) from exc.__cause__
        if exc.sqlstate:  # the server's answer: the same error, kind and fix as on the CSV path
            raise error_for_sqlstate(exc.sqlstate, exc.message, _state_name(exc.sqlstate)) from exc.__cause__
        if exc.connection:
            raise TransientError(f"{doing} failed: {exc.message}") from exc.__cause__
        raise exc.__cause__ or exc


class _ServerError(Exception):
    """A driver's error, told the same way by both: the server's SQLSTATE and sentence, or a
    connection lost (``connection``) without one."""

    def __init__(self, sqlstate: str | None, message: str, connection: bool) -> None:
        super().__init__(message)
        self.sqlstate, self.message, self.connection = sqlstate, message, connection


BATCH_ROWS = 65_536  # rows of one decoded batch


def decode_batches(data: memoryview | bytes, schema: pa.Schema) -> list[pa.RecordBatch]:
    """A whole binary COPY output of ``schema``'s columns (``select_statement``) as record batches,
    decoded by ``headrace._copy_binary``: values straight into Arrow buffers, no Python per row."""
    assert _decode is not None
    kinds = bytes(_KIND[f.type] for f in schema)
    batches: list[pa.RecordBatch] = []
    pos, done = 0, False
    while not done:
        columns, rows, pos, done = _decode(data, pos, kinds, BATCH_ROWS)
        if rows or not batches:
            arrays = [pa.Array.from_buffers(field.type, rows,
                                            [None if parts[0] is None else pa.py_buffer(parts[0]),
                                             *(pa.py_buffer(b) for b in parts[1:-1])], parts[-1])
                      for field, parts in zip(schema, columns, strict=True)]
            batches.append(pa.RecordBatch.from_arrays(arrays, schema=schema))
    return batches


# Arrow type of a column of ``arrow_schema`` -> its kind in ``headrace._copy_binary``.
_KIND = {pa.bool_(): ord("b"), pa.int32(): ord("i"), pa.int64(): ord("l"), pa.float32(): ord("f"),
         pa.float64(): ord("d"), pa.date32(): ord("D"), pa.timestamp("us"): ord("T"),
         pa.timestamp("us", tz="UTC"): ord("T"), pa.string(): ord("s"), pa.binary(): ord("s")}


class _Native:
    """psycopg2's connection, its COPY drained in C into a buffer (``copy.copy_chunk``'s way), the
    rows decoded by ``headrace._copy_binary``."""

    def __init__(self, dsn: str, opened_for: str) -> None:
        self._conn = copy_connection(dsn, opened_for)

    def execute(self, statement: str) -> None:
        self._run(lambda cur: cur.execute(statement))

    def read(self, select: str, schema: pa.Schema) -> list[pa.RecordBatch]:
        buffer = io.BytesIO()
        self._run(lambda cur: cur.copy_expert(f"COPY ({select}) TO STDOUT (FORMAT binary)", buffer))
        return decode_batches(buffer.getbuffer(), schema)

    def _run(self, call: Callable[[Any], None]) -> None:
        import psycopg2

        try:
            with self._conn.cursor() as cur:
                call(cur)
        except psycopg2.Error as exc:
            text = str(exc).strip()
            message = exc.diag.message_primary or (text.splitlines()[0] if text else type(exc).__name__)
            raise _ServerError(exc.pgcode, message,
                               isinstance(exc, psycopg2.OperationalError | psycopg2.InterfaceError)) from exc

    def close(self) -> None:
        self._conn.close()


class _Adbc:
    """The ADBC PostgreSQL driver's connection, which runs and decodes the SELECT in C."""

    def __init__(self, dsn: str, opened_for: str) -> None:
        import adbc_driver_manager
        import adbc_driver_postgresql.dbapi as adbc

        try:  # autocommit: explicit BEGIN, as SET TRANSACTION SNAPSHOT comes first
            self._conn = adbc.connect(copy_conninfo(dsn), autocommit=True)
        except adbc_driver_manager.Error as exc:
            raise TransientError(f"cannot connect to copy {opened_for}: {exc}") from exc
        self._cur = self._conn.cursor()
        try:
            for setting in SESSION_SETTINGS:
                self.execute(setting)
        except _ServerError:
            self._conn.close()
            raise

    def execute(self, statement: str) -> None:
        self._run(lambda: (self._cur.execute(statement), self._cur.fetchall() if self._cur.description else None))

    def read(self, select: str, schema: pa.Schema) -> list[pa.RecordBatch]:
        got: list[pa.Table] = []

        def fetch() -> None:
            self._cur.execute(select)
            got.append(self._cur.fetch_arrow_table())

        self._run(fetch)
        # Names from our schema (the driver names columns after the expressions); types must already match.
        return got[0].rename_columns(schema.names).cast(schema).to_batches()

    def _run(self, call: Callable[[], object]) -> None:
        import adbc_driver_manager

        try:
            call()
        except adbc_driver_manager.Error as exc:
            connection = isinstance(exc, adbc_driver_manager.OperationalError | adbc_driver_manager.InternalError)
            raise _ServerError(getattr(exc, "sqlstate", None) or None, _server_message(exc), connection) from exc

    def close(self) -> None:
        self._conn.close()


def _state_name(sqlstate: str) -> str:
    """psycopg's class name for ``sqlstate`` (``42501`` -> ``InsufficientPrivilege``), as the CSV path's
    errors are named."""
    import psycopg.errors

    try:
        return psycopg.errors.lookup(sqlstate).__name__
    except KeyError:
        return f"SQLSTATE {sqlstate}"


def _server_message(exc: BaseException) -> str:
    """The server's sentence out of an ADBC error ("UNAUTHORIZED: [libpq] ... ERROR:  permission
    denied for table b" -> "permission denied for table b")."""
    text = str(exc).strip()
    return text.rpartition("ERROR:")[2].strip().splitlines()[0] if "ERROR:" in text else text.splitlines()[0]
