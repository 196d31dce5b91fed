"""The initial copy as a Spark job: one task per chunk, each read by the source's chunk reader.

The driver only plans chunks; rows never pass through it. A copy written as Parquet by its tasks
themselves (no Spark rows) is ``chunk_files``. The source says how each column comes
(``source.base.ChunkRead``): typed (PostgreSQL's binary COPY into Arrow) or as PostgreSQL text,
cast by Spark with the same expressions as the change stream, so a value looks the same in the
target whichever path wrote it. A source whose chunks each have their own snapshot (MySQL) adds a
``_pos`` column: each row's position, instead of the round's.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from headrace.core.lanes import NotOnLane
from headrace.core.position import Position
from headrace.core.schema import HR_COMMIT_TS, HR_LSN, HR_SEQ, ColumnType, TableSchema, TypeKind
from headrace.core.spark_types import ValueRules, cast_text, changed_value_counts, spark_type
from headrace.materialize.driver_casts import cast_texts
from headrace.source.base import POSITION_COLUMN, ChunkRead, ChunkSession, Route

# (column, reason) -> values the casts changed (see ``changed_value_counts``)
ValueCounts = dict[tuple[str, str], int]
_observations = itertools.count()


def snapshot_dataframe(
    spark: SparkSession,
    dsn: str,
    snapshot_name: str | None,
    table: TableSchema,
    chunks: list[tuple[int, int]],
    position: Position,
    rules: ValueRules | None = None,
    on_changed: Callable[[Callable[[], ValueCounts]], None] | None = None,
    binary: bool = True,
) -> DataFrame:
    """``chunk_dataframe`` for a PostgreSQL table at ``dsn`` under exported snapshot ``snapshot_name``
    (``None``: each task its own REPEATABLE READ view); ``binary``: binary COPY, else CSV text."""
    from headrace.source.postgres.source import chunk_reader

    reader = chunk_reader(dsn, snapshot_name, table, binary)
    return chunk_dataframe(spark, table, reader, chunks, position, rules, on_changed)


def chunk_dataframe(
    spark: SparkSession,
    table: TableSchema,
    reader: ChunkRead,
    chunks: list[tuple[int, int]],
    position: Position,
    rules: ValueRules | None = None,
    on_changed: Callable[[Callable[[], ValueCounts]], None] | None = None,
    on_position: Callable[[Callable[[], int | None]], None] | None = None,
    tasks: int | None = None,
) -> DataFrame:
    """Rows of ``table`` in ``chunks`` as ``reader`` reads them, in the Target row shape, read by
    ``tasks`` Spark tasks (``chunk_tasks``).

    Lazy: the copy runs when the DataFrame is written (a snapshot the reader imports must stay
    valid until then). Every row carries ``position`` (seq 0), or its chunk's own position when the
    reader gives one per row, and a NULL commit time. ``on_changed`` receives a function giving the
    values the casts changed (``values.infinity: clamp``), to be called only after an action on the
    DataFrame completed: counted by the same scan (a Spark ``Observation``). ``on_position`` likewise
    receives a function giving the smallest per-row position read (None: no rows, or none per row).
    """
    if not chunks:
        raise ValueError(f"no chunks to copy for {table.qualified_name}; plan_chunks gives at least one")
    routes = reader.routes
    read_schema = _read_schema(table, routes)
    if reader.per_row_position:
        read_schema = StructType([*read_schema.fields, StructField(POSITION_COLUMN, LongType(), False)])
    read = reader.read
    plan = list(chunks)

    def copy_partition(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for index in chunk_indexes(batches):
            yield from read(*plan[index])

    text = chunk_tasks(spark, len(plan), tasks).mapInArrow(copy_partition, read_schema)
    # The text each column's casts see: a SPLIT column's text holds only the values outside the
    # binary range (infinities, BC, beyond 9999), the only ones the range rules change.
    texts = {i: F.col(f"t{i}" if route is Route.SPLIT else f"c{i}")
             for i, route in enumerate(routes) if route is not Route.BINARY}
    if on_changed is not None:
        text = _observe_changed_values(text, table, texts, rules or ValueRules(), on_changed)
    if on_position is not None and reader.per_row_position:
        seen = Observation(f"copy_position_{table.oid}_{next(_observations)}")
        text = text.observe(seen, F.min(F.col(POSITION_COLUMN)).alias("_minpos"))
        on_position(lambda: seen.get.get("_minpos"))
    columns = []
    for i, (col, route) in enumerate(zip(table.columns, routes, strict=True)):
        if route is Route.BINARY:
            value = F.col(f"c{i}")
        elif route is Route.SPLIT:
            value = F.coalesce(F.col(f"c{i}"), cast_text(texts[i], col.type, rules, col.name))
        else:
            value = cast_text(texts[i], col.type, rules, col.name)
        columns.append(value.alias(col.name))
    lsn = F.col(POSITION_COLUMN) if reader.per_row_position else F.lit(position.lsn).cast("bigint")
    return text.select(
        *columns,
        lsn.alias(HR_LSN),
        F.lit(0).cast("bigint").alias(HR_SEQ),
        F.lit(None).cast("timestamp").alias(HR_COMMIT_TS),
    )


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


# Text the driver's casts (``driver_casts``) give exactly Spark's values for (numeric: Arrow's exact read).
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
      MySQL's chunks, PostgreSQL's CSV copy): cast by the driver's casts (``driver_casts``), which
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

        data = to_arrow_schema(_read_schema(table, routes)).empty_table()
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


def chunk_tasks(spark: SparkSession, count: int, tasks: int | None) -> DataFrame:
    """The indexes ``0..count-1`` of a job's chunks spread over ``tasks`` Spark tasks (None: one task
    a chunk), for a ``mapInArrow`` that copies each index it gets (``chunk_indexes``).

    ``spark.range`` gives each partition a contiguous run of indexes. Fewer tasks than chunks bound
    the source connections a job holds at once to ``tasks`` however many cores run it (a task reads
    its chunks one after another), and keep those cores evenly busy.
    """
    return spark.range(0, count, 1, numPartitions=max(1, min(count, tasks or count)))


def chunk_indexes(batches: Iterable[pa.RecordBatch]) -> Iterator[int]:
    """On an executor: the chunk indexes of a ``chunk_tasks`` partition."""
    for batch in batches:
        yield from batch.column(0).to_pylist()


def _exact_decimal(text: pa.ChunkedArray, precision: int | None, scale: int | None) -> pa.ChunkedArray | None:
    """numeric(p,s) text as decimal128(p, s), or None where any value is not exactly one."""
    if precision is None or scale is None or not 0 <= scale <= precision <= 38:
        return None
    try:
        return pc.cast(text, pa.decimal128(precision, scale))  # safe: refuses to round or overflow
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def _read_schema(table: TableSchema, routes: list[Route]) -> StructType:
    """The Spark form of the reader's Arrow schema: the target's type where a column comes typed."""
    fields = []
    for i, (col, route) in enumerate(zip(table.columns, routes, strict=True)):
        fields.append(StructField(f"c{i}", StringType() if route is Route.TEXT else spark_type(col.type), True))
        if route is Route.SPLIT:
            fields.append(StructField(f"t{i}", StringType(), True))
    return StructType(fields)


def _observe_changed_values(text: DataFrame, table: TableSchema, texts: dict[int, Column], rules: ValueRules,
                            on_changed: Callable[[Callable[[], ValueCounts]], None]) -> DataFrame:
    """``text`` counting the values the casts will change (of columns with ``texts``), via ``on_changed``."""
    counts = changed_value_counts(
        [(col.name, col.type, texts[i]) for i, col in enumerate(table.columns) if i in texts], rules)
    if not counts:
        return text
    # A name per DataFrame: an observation whose write failed stays registered under its name.
    observation = Observation(f"values_changed_{table.oid}_{next(_observations)}")
    text = text.observe(observation, *[total.alias(f"_vc{i}") for i, (_, _, total) in enumerate(counts)])

    def read() -> ValueCounts:
        got = observation.get  # blocks until the first action on the DataFrame finished
        found = {(name, reason): int(got.get(f"_vc{i}") or 0) for i, (name, reason, _) in enumerate(counts)}
        return {k: n for k, n in found.items() if n}

    on_changed(read)
    return text


def takes_files(schema: TableSchema, reader: ChunkRead) -> bool:
    """A copy's tasks may write ``schema``'s chunks as Parquet themselves (into a ``FileSink``), where the
    target has one: not for column types only Spark casts. A reader's per-row position (``_pos``) is
    written as each row's ``_hr_lsn``, as ``chunk_dataframe`` does."""
    return takes_chunk_rows(schema, reader.routes)
