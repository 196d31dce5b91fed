"""The initial copy as a Spark job: one task per ctid chunk, each COPYing from the exported snapshot.

The driver only plans chunks; rows never pass through it. Tasks yield Arrow batches of text (see
``headrace.source.postgres.copy``) and Spark casts them with the same expressions as the change
stream, so a value looks the same in the target whichever path wrote it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator

import pyarrow as pa
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from headrace.core.position import Position
from headrace.core.schema import HR_COMMIT_TS, HR_LSN, HR_SEQ, TableSchema
from headrace.core.spark_types import ValueRules, cast_text, changed_value_counts
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
) -> DataFrame:
    """Rows of ``table`` in ``chunks`` as of the exported snapshot, in the Target row shape.

    Lazy: the copy runs when the DataFrame is written. ``snapshot_name`` must stay valid (its
    exporting transaction open) until then; ``None`` gives each task its own REPEATABLE READ view.
    Every row carries ``position`` (seq 0) and a NULL commit time. ``on_changed`` receives a
    function giving the values the casts changed (``values.infinity: clamp``), to be called only
    after an action on the DataFrame completed: counted by the same scan (a Spark ``Observation``).
    """
    if not chunks:
        raise ValueError(f"no chunks to copy for {table.qualified_name}; plan_chunks gives at least one")
    ncols = len(table.columns)
    text_schema = StructType([StructField(f"c{i}", StringType(), True) for i in range(ncols)])
    plan = list(chunks)

    def copy_partition(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # Runs on an executor; the input holds the index of the chunk this partition copies.
        for batch in batches:
            for index in batch.column(0).to_pylist():
                start, end = plan[index]
                yield from copy_chunk(dsn, snapshot_name, table, start, end)

    # spark.range with one partition per chunk puts exactly one chunk index in each task.
    descriptors = spark.range(0, len(plan), 1, numPartitions=len(plan))
    text = descriptors.mapInArrow(copy_partition, text_schema)
    if on_changed is not None:
        text = _observe_changed_values(text, table, rules or ValueRules(), on_changed)
    columns = [cast_text(F.col(f"c{i}"), col.type, rules, col.name).alias(col.name)
               for i, col in enumerate(table.columns)]
    return text.select(
        *columns,
        F.lit(position.lsn).cast("bigint").alias(HR_LSN),
        F.lit(0).cast("bigint").alias(HR_SEQ),
        F.lit(None).cast("timestamp").alias(HR_COMMIT_TS),
    )


def _observe_changed_values(text: DataFrame, table: TableSchema, rules: ValueRules,
                            on_changed: Callable[[Callable[[], ValueCounts]], None]) -> DataFrame:
    """``text`` counting the values the casts will change, reported through ``on_changed``."""
    counts = changed_value_counts(
        [(col.name, col.type, F.col(f"c{i}")) for i, col in enumerate(table.columns)], rules)
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
