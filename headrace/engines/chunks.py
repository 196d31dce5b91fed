"""A copy chunk in the row shape, built by pyarrow from the reader's Arrow and written as Parquet into
the target's ``FileSink``: the work of one chunk, which a Spark task (``engines.spark.copy``) and a
driver thread (``engines.driver.copy``) both do, so a target cannot tell who copied it.

``chunk_rows`` builds a chunk's rows only where they are the very values Spark's casts give
(``engines.spark.copy.chunk_dataframe``); anything else goes through Spark.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import StringType, StructField, StructType

from headrace.core.filesink import FileSink, WrittenFile
from headrace.core.lanes import NotOnLane
from headrace.core.position import Position
from headrace.core.schema import HR_COMMIT_TS, HR_LSN, HR_SEQ, ColumnType, TableSchema, TypeKind
from headrace.core.spark_types import spark_type
from headrace.engines.driver.casts import cast_texts
from headrace.source.base import POSITION_COLUMN, ChunkRead, ChunkSession, Route


class _Batches:
    """A chunk already read (on the driver), handed to its task: picklable, like a reader."""

    def __init__(self, batches: list[pa.RecordBatch]) -> None:
        self.batches = batches

    def __call__(self, start: int, end: int) -> Iterator[pa.RecordBatch]:
        return iter(self.batches)


def prefetched(reader: ChunkRead, start: int, end: int) -> ChunkRead:
    """``reader`` with chunk ``[start, end)`` read now, in this process: the Spark task that copies it
    then opens no source connection, and the DataFrame goes through the same casts as any chunk's.

    For a one-chunk table (at most ``snapshot.chunk_pages`` pages): the rows travel to the task
    inside it, so the source connection is held for the read only, not for the whole write.
    """
    return replace(reader, read=_Batches(list(reader.read(start, end))))


def read_by(session: ChunkSession, table: TableSchema, reader: ChunkRead, start: int, end: int) -> ChunkRead:
    """``prefetched``, the chunk read through ``session`` (a driver connection shared by a round's
    small tables, ``Source.chunk_session``) instead of a connection of its own."""
    return replace(reader, read=_Batches(session.read(table, start, end)))


def driver_rows(table: TableSchema, reader: ChunkRead, position: Position) -> pa.Table | None:
    """A ``prefetched`` chunk in the Target row shape, built here without Spark (``chunk_rows``), or
    None when only ``chunk_dataframe``'s casts give the right values (the caller runs the Spark job),
    or the reader gives per-row positions (a keyless table's copy records its chunk's position from
    ``chunk_dataframe``'s ``on_position``)."""
    batches = getattr(reader.read, "batches", None)
    if batches is None or reader.per_row_position:
        return None
    return chunk_rows(table, reader.routes, batches, position.lsn)


def takes_chunk_rows(table: TableSchema, routes: list[Route]) -> bool:
    """Whether ``chunk_rows`` can take any chunk of ``table`` at all (its column types); a False
    table goes to Spark whatever its values (arrays, CSV-read typed columns)."""
    return all(route is not Route.TEXT or col.type.kind in _TEXT_CASTS or isinstance(spark_type(col.type), StringType)
               for col, route in zip(table.columns, routes, strict=True))


# Text the driver's casts (``engines.driver.casts``) give exactly Spark's values for (numeric: Arrow's exact read).
_TEXT_CASTS = frozenset({TypeKind.DECIMAL, TypeKind.INT, TypeKind.LONG, TypeKind.FLOAT, TypeKind.DOUBLE,
                         TypeKind.BOOLEAN, TypeKind.DATE, TypeKind.TIMESTAMP, TypeKind.TIMESTAMPTZ,
                         TypeKind.BINARY})


def chunk_rows(table: TableSchema, routes: list[Route], batches: list[pa.RecordBatch], lsn: int
               ) -> pa.Table | None:
    """One chunk's reader batches in the Target row shape, built without Spark (on the driver or in a
    copy task), or None when only ``chunk_dataframe``'s casts give the right values.

    Rows are built here only where the result is the very value ``chunk_dataframe`` gives, so a
    target cannot tell the paths apart:

    - BINARY columns: the reader's typed value, which ``chunk_dataframe`` passes through untouched;
    - TEXT columns Spark keeps as text (text kinds: char(n), enum, uuid, json, time, interval...):
      ``cast_text`` returns the text itself, so it is passed through here too;
    - SPLIT columns (date, timestamps) whose values all came binary (years 1..9999): their text
      half, the only values the range rules and ``values.infinity`` act on, is empty;
    - numeric(p,s): PostgreSQL prints such a value with exactly ``s`` fractional digits and at most
      ``p - s`` integral ones, which Spark's cast and Arrow's (exact, refusing to round) both read
      as that decimal. Anything Arrow refuses (NaN, Infinity) goes to Spark, whose cast stops the
      table with the usual message;
    - other TEXT columns Spark types (integers, floating point, boolean, dates, timestamps, bytes:
      MySQL's chunks, PostgreSQL's CSV copy): cast by the driver's casts (``engines.driver.casts``), which
      take only the text forms where DuckDB's cast and Spark's agree;
    - a reader's ``_pos`` (a source whose chunks each have their own snapshot): the rows' position.

    Anything else (arrays, a date or timestamp past the binary range or infinite, a MySQL zero date)
    goes through Spark.
    """
    if not takes_chunk_rows(table, routes):
        return None
    if batches:
        data = pa.Table.from_batches(batches)
    else:
        from pyspark.sql.pandas.types import to_arrow_schema

        data = to_arrow_schema(read_schema(table, routes)).empty_table()
    arrays: list[pa.ChunkedArray | pa.Array] = []
    texts: dict[int, tuple[str, pa.ChunkedArray, ColumnType]] = {}
    for i, (col, route) in enumerate(zip(table.columns, routes, strict=True)):
        value = data.column(f"c{i}")
        if route is Route.SPLIT and data.column(f"t{i}").null_count != data.num_rows:
            return None  # infinity, BC or beyond 9999: the range rules decide
        if route is Route.TEXT and col.type.kind is TypeKind.DECIMAL:
            decimal = _exact_decimal(value, col.type.precision, col.type.scale)
            if decimal is None:
                return None
            value = decimal
        elif route is Route.TEXT and not isinstance(spark_type(col.type), StringType):
            texts[i] = (col.name, value, col.type)
        arrays.append(value)
    try:
        for i, cast in zip(texts, cast_texts(list(texts.values())), strict=True):
            arrays[i] = cast
    except NotOnLane:
        return None
    fields = [pa.field(col.name, value.type) for col, value in zip(table.columns, arrays, strict=True)]
    n = data.num_rows
    positions = (data.column(POSITION_COLUMN) if POSITION_COLUMN in data.column_names
                 else pa.nulls(n, pa.int64()).fill_null(lsn))
    arrays += [positions, pa.nulls(n, pa.int64()).fill_null(0), pa.nulls(n, pa.timestamp("us", tz="UTC"))]
    fields += [pa.field(HR_LSN, pa.int64()), pa.field(HR_SEQ, pa.int64()),
               pa.field(HR_COMMIT_TS, pa.timestamp("us", tz="UTC"))]
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def _exact_decimal(text: pa.ChunkedArray, precision: int | None, scale: int | None) -> pa.ChunkedArray | None:
    """numeric(p,s) text as decimal128(p, s), or None where any value is not exactly one."""
    if precision is None or scale is None or not 0 <= scale <= precision <= 38:
        return None
    try:
        return pc.cast(text, pa.decimal128(precision, scale))  # safe: refuses to round or overflow
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def takes_files(schema: TableSchema, reader: ChunkRead) -> bool:
    """A copy's tasks may write ``schema``'s chunks as Parquet themselves (into a ``FileSink``), where the
    target has one: not for column types only Spark casts. A reader's per-row position (``_pos``) is
    written as each row's ``_hr_lsn``, as ``chunk_dataframe`` does."""
    return takes_chunk_rows(schema, reader.routes)



@dataclass(frozen=True)
class ChunkFile:
    """What a copy task did with chunk ``chunk`` (an index into the job's ranges): wrote ``file``
    (None: an empty chunk), or left it to Spark's casts (``needs_spark``)."""

    chunk: int
    file: WrittenFile | None
    needs_spark: bool = False


def copy_chunk_file(table: TableSchema, reader: ChunkRead, chunk: tuple[int, int], lsn: int, sink: FileSink,
                    stem: str, index: int) -> ChunkFile:
    """Copy one chunk into ``<stem>.parquet`` of ``sink`` (wherever this runs: a Spark task, a driver
    thread); a chunk holding a value ``chunk_rows`` refuses writes nothing and comes back ``needs_spark``."""

    def parts() -> Iterator[pa.Table]:
        for batch in reader.read(*chunk):  # batch by batch: the file is written as the chunk comes
            rows = chunk_rows(table, reader.routes, [batch], lsn)
            if rows is None:
                raise NotOnLane("a value only Spark's casts decide")
            yield rows

    try:
        written = sink.write_parts(parts(), stem, empty=False)
    except NotOnLane:
        return ChunkFile(index, None, needs_spark=True)  # the partial file is gone
    return ChunkFile(index, written)

def read_schema(table: TableSchema, routes: list[Route]) -> StructType:
    """The Spark form of the reader's Arrow schema: the target's type where a column comes typed."""
    fields = []
    for i, (col, route) in enumerate(zip(table.columns, routes, strict=True)):
        fields.append(StructField(f"c{i}", StringType() if route is Route.TEXT else spark_type(col.type), True))
        if route is Route.SPLIT:
            fields.append(StructField(f"t{i}", StringType(), True))
    return StructType(fields)
