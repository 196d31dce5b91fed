"""The initial copy as a Spark job: one task per ctid chunk, each COPYing from the exported snapshot.

The driver only plans chunks; rows never pass through it. With ``binary`` (the default) tasks read
binary COPY into typed Arrow (``headrace.source.postgres.binary_copy``) and only the columns that
come as text are cast by Spark; otherwise every column comes as CSV text
(``headrace.source.postgres.copy``). Text is cast with the same expressions as the change stream,
so a value looks the same in the target whichever path wrote it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator

import pyarrow as pa
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from headrace.core.position import Position
from headrace.core.schema import HR_COMMIT_TS, HR_LSN, HR_SEQ, TableSchema
from headrace.core.spark_types import ValueRules, cast_text, changed_value_counts, spark_type
from headrace.source.postgres import binary_copy
from headrace.source.postgres.binary_copy import Route, copy_chunk_binary
from headrace.source.postgres.copy import copy_chunk

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
    """Rows of ``table`` in ``chunks`` as of the exported snapshot, in the Target row shape.

    Lazy: the copy runs when the DataFrame is written. ``snapshot_name`` must stay valid (its
    exporting transaction open) until then; ``None`` gives each task its own REPEATABLE READ view.
    Every row carries ``position`` (seq 0) and a NULL commit time. ``on_changed`` receives a
    function giving the values the casts changed (``values.infinity: clamp``), to be called only
    after an action on the DataFrame completed: counted by the same scan (a Spark ``Observation``).
    ``binary`` reads binary COPY into typed Arrow; else CSV text (``snapshot.binary_copy``).
    """
    if not chunks:
        raise ValueError(f"no chunks to copy for {table.qualified_name}; plan_chunks gives at least one")
    ncols = len(table.columns)
    if binary:
        routes = binary_copy.column_routes(table)
        read_schema = _read_schema(table, routes)
        read = copy_chunk_binary
    else:
        routes = [Route.TEXT] * ncols
        read_schema = StructType([StructField(f"c{i}", StringType(), True) for i in range(ncols)])
        read = copy_chunk
    plan = list(chunks)

    def copy_partition(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # Runs on an executor; the input holds the index of the chunk this partition copies.
        for batch in batches:
            for index in batch.column(0).to_pylist():
                start, end = plan[index]
                yield from read(dsn, snapshot_name, table, start, end)

    # spark.range with one partition per chunk puts exactly one chunk index in each task.
    descriptors = spark.range(0, len(plan), 1, numPartitions=len(plan))
    text = descriptors.mapInArrow(copy_partition, read_schema)
    # The text each column's casts see: a SPLIT column's text holds only the values outside the
    # binary range (infinities, BC, beyond 9999), the only ones the range rules change.
    texts = {i: F.col(f"t{i}" if route is Route.SPLIT else f"c{i}")
             for i, route in enumerate(routes) if route is not Route.BINARY}
    if on_changed is not None:
        text = _observe_changed_values(text, table, texts, rules or ValueRules(), on_changed)
    columns = []
    for i, (col, route) in enumerate(zip(table.columns, routes, strict=True)):
        if route is Route.BINARY:
            value = F.col(f"c{i}")
        elif route is Route.SPLIT:
            value = F.coalesce(F.col(f"c{i}"), cast_text(texts[i], col.type, rules, col.name))
        else:
            value = cast_text(texts[i], col.type, rules, col.name)
        columns.append(value.alias(col.name))
    return text.select(
        *columns,
        F.lit(position.lsn).cast("bigint").alias(HR_LSN),
        F.lit(0).cast("bigint").alias(HR_SEQ),
        F.lit(None).cast("timestamp").alias(HR_COMMIT_TS),
    )


def _read_schema(table: TableSchema, routes: list[Route]) -> StructType:
    """The Spark form of ``binary_copy.arrow_schema``: the target's type where a column comes typed."""
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
