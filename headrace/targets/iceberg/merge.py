"""The keyed MERGE of one batch into an Iceberg table, bounded by the batch so its cost follows the
batch, not the table.

Spark plans a merge-on-read MERGE as a join of the batch with a scan of the target. Unbounded, that
scan is the whole table, every column a SET clause names, shuffled for a sort-merge join: at 10M
rows a 25K-change burst took 3.7x as long as at 1M, and a one-row change 28 s at 50M. Two things
bound it, both found by one small aggregate over the (persisted) batch (``BatchBounds``):

- Only the columns a SET needs: ``t.col`` is referenced only for a column the batch left TOAST-
  unchanged somewhere; otherwise the scan reads the key, the positions and Iceberg's row position
  columns (Parquet is columnar, so the other columns are never read).
- Only the rows the batch can match: target-only conditions in the ON clause filter the scan. A
  range on the key's first column (``>= min AND <= max``) lets Iceberg skip data files by their
  column statistics; the list of the batch's keys drops every other row before the join, so the
  shuffle carries the batch's rows instead of the table's. Neither changes the result: a source
  row's key always satisfies both, and a target row that fails them had no source row to match.

The list is SQL text Spark parses and plans, which costs more than it saves on a small table: it is
written only where Iceberg prunes files by it (at most ``PRUNED_LIST_LIMIT`` values) or where the
table is large (``LARGE_TABLE_RECORDS``, from the snapshot summary: metadata, no job). A batch built
on the driver (``BatchBounds.of_arrow``) has its bounds for free, with no Spark job at all.
"""

from __future__ import annotations

import datetime as dt
import functools
import operator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from headrace.core.names import quote_spark
from headrace.core.rows import HR_COMMIT_TS, HR_FROM, HR_LSN, HR_OP, HR_SEQ, HR_UNCHANGED, unchanged_token
from headrace.core.schema import TableSchema

# Keys listed in the ON clause at most (beyond it, the range alone). The list is SQL text Spark parses
# and plans: on our loaded 2-core machine planning took 1.9 s with 1,000 keys, 1.6-2.1 s with 5,000,
# 3.3-4.4 s with 20,000. Iceberg prunes files by an IN of at most 200 values; past that the list
# filters rows ahead of the join, which saves shuffling the table's key columns: a 25K-key batch into
# 10M rows took 14.3-14.6 s of JVM CPU with the list, 18.3-19.5 s without.
KEY_LIST_LIMIT = 50_000
# Iceberg's file pruning (``InclusiveMetricsEvaluator``) reads an IN of at most 200 values; a longer
# list prunes no file, and only pays back its planning (and, on the Spark path, the job collecting the
# keys) on a large table, where it keeps the table's keys out of the shuffle.
PRUNED_LIST_LIMIT = 200
# A table at least this large (total-records of its current snapshot) gets the list up to
# KEY_LIST_LIMIT: the 10M-row table-size bench is where it saved the shuffle.
LARGE_TABLE_RECORDS = 1_000_000


def string_literal(text: str) -> str:
    """A Spark SQL string literal (backslash escapes are on by default)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _literal(value: Any, kind: T.DataType) -> str | None:
    """``value`` (as collected from a column of type ``kind``) as Spark SQL of that type, or None for a
    type whose literal we do not write (the MERGE then goes without that bound)."""
    suffixes: dict[type[T.DataType], str] = {T.ByteType: "Y", T.ShortType: "S", T.IntegerType: "", T.LongType: "L"}
    suffix = suffixes.get(type(kind))
    if suffix is not None and isinstance(value, int):
        return f"{value}{suffix}"  # the sign belongs to the literal: -9223372036854775808L parses
    if isinstance(kind, T.StringType) and isinstance(value, str):
        return string_literal(value)
    if isinstance(kind, T.DateType) and isinstance(value, dt.date):
        return f"DATE '{value.isoformat()}'"
    if isinstance(kind, T.DecimalType) and isinstance(value, Decimal):
        return f"CAST('{value}' AS {kind.simpleString()})"
    return None


@dataclass(frozen=True)
class BatchBounds:
    """What the MERGE needs to know of a batch, found before it runs."""

    rows: int
    unchanged: frozenset[str] | None  # columns some row left TOAST-unchanged; None: cannot tell, assume any
    key_range: tuple[str, str] | None  # SQL literals of the first key column's least and greatest value
    key_list: tuple[str, ...] | None  # SQL literals of every first-key-column value, when few

    @classmethod
    def of(cls, table: TableSchema, batch: DataFrame, large: bool) -> BatchBounds:
        """One aggregate over ``batch`` (persist it first: the MERGE reads it again), and one narrow
        read of its keys when the list is worth writing (``list_limit``). ``large``: the target table
        holds at least ``LARGE_TABLE_RECORDS``."""
        first = table.key[0]
        key = F.col(quote_spark(first))
        kind = batch.schema[first].dataType
        pieces = F.flatten(F.collect_list(F.split(F.col(HR_UNCHANGED), ",")))
        row = batch.agg(F.count(F.lit(1)), F.min(key), F.max(key), F.array_distinct(pieces)).first()
        assert row is not None  # an aggregate without grouping has one row
        rows, least, greatest = int(row[0]), row[1], row[2]
        unchanged = _unchanged_columns(table, set(row[3] or ()))
        low, high = _literal(least, kind), _literal(greatest, kind)
        if low is None or high is None:
            return cls(rows, unchanged, None, None)
        key_list: tuple[str, ...] | None = None
        if low == high:
            key_list = (low,)  # one value (a one-row change): no need to read the keys
        elif rows <= list_limit(large):
            # One row per key after deduplication: a plain narrow read of the persisted batch.
            key_list = _literals([r[0] for r in batch.select(key).collect()], kind)
        return cls(rows, unchanged, (low, high), key_list)

    @classmethod
    def of_arrow(cls, table: TableSchema, batch: pa.Table, kind: T.DataType, large: bool) -> BatchBounds:
        """The bounds of a batch already on the driver (``kind``: the first key column's Spark type),
        computed by pyarrow: no Spark job."""
        tokens = {t for text in pc.unique(batch.column(HR_UNCHANGED)).to_pylist() if text for t in text.split(",")}
        unchanged = _unchanged_columns(table, tokens)
        # Least and greatest by Python's order, which is Spark's for the types we write literals of
        # (ints, dates, decimals; strings by code point = by UTF-8 byte, as Spark compares them).
        keys = pc.unique(batch.column(table.key[0])).to_pylist()
        if not keys:
            return cls(batch.num_rows, unchanged, None, None)
        low, high = _literal(min(keys), kind), _literal(max(keys), kind)
        if low is None or high is None:
            return cls(batch.num_rows, unchanged, None, None)
        key_list: tuple[str, ...] | None = (low,) if low == high else None
        if key_list is None and len(keys) <= list_limit(large):
            key_list = _literals(keys, kind)
        return cls(batch.num_rows, unchanged, (low, high), key_list)


def list_limit(large: bool) -> int:
    """The most keys worth listing in the MERGE's ON clause for a batch into a ``large`` table or not."""
    return KEY_LIST_LIMIT if large else PRUNED_LIST_LIMIT


def _literals(values: list[Any], kind: T.DataType) -> tuple[str, ...] | None:
    """SQL literals of the distinct ``values`` in their order, or None if one has none."""
    literals = [_literal(v, kind) for v in dict.fromkeys(values)]
    return tuple(lit for lit in literals if lit is not None) if all(lit is not None for lit in literals) else None


def _unchanged_columns(table: TableSchema, tokens: set[str]) -> frozenset[str] | None:
    """The columns named by the batch's unchanged-TOAST ``tokens``. The list holds each column's token
    (names escaped: ``unchanged_token``); a token no column has (staged by an older version, which did
    not escape): None, assume any column is unchanged."""
    by_token = {unchanged_token(c.name): c.name for c in table.columns}
    return frozenset(by_token[t] for t in tokens) if tokens <= by_token.keys() else None


def merge_statement(table: TableSchema, name: str, view: str, bounds: BatchBounds) -> str:
    """MERGE the batch in ``view`` into ``name``: a change replaces or deletes the row of its key only
    when it is newer than the change that wrote the row (so a replay changes nothing)."""
    on = [f"t.{quote_spark(k)} = s.{quote_spark(k)}" for k in table.key]
    first = f"t.{quote_spark(table.key[0])}"
    if bounds.key_range is not None:
        on.append(f"{first} >= {bounds.key_range[0]} AND {first} <= {bounds.key_range[1]}")
    if bounds.key_list is not None:
        on.append(f"{first} IN ({', '.join(bounds.key_list)})")
    newer = f"(t.{HR_LSN} < s.{HR_LSN} OR (t.{HR_LSN} = s.{HR_LSN} AND t.{HR_SEQ} < s.{HR_SEQ}))"
    sets = []
    for c in table.columns:
        col = quote_spark(c.name)
        if c.name in table.key or (bounds.unchanged is not None and c.name not in bounds.unchanged):
            sets.append(f"t.{col} = s.{col}")
            continue
        # A TOAST column the update did not send keeps the value already in the target.
        untouched = (
            f"s.{HR_UNCHANGED} IS NOT NULL AND "
            f"array_contains(split(s.{HR_UNCHANGED}, ','), {string_literal(unchanged_token(c.name))})"
        )
        sets.append(f"t.{col} = CASE WHEN {untouched} THEN t.{col} ELSE s.{col} END")
    sets += [f"t.{m} = s.{m}" for m in (HR_LSN, HR_SEQ, HR_COMMIT_TS)]
    targets = [quote_spark(c.name) for c in table.columns] + [HR_LSN, HR_SEQ, HR_COMMIT_TS]
    return (
        f"MERGE INTO {name} t USING {view} s ON {' AND '.join(on)} "
        f"WHEN MATCHED AND s.{HR_OP} = 'D' AND {newer} THEN DELETE "
        f"WHEN MATCHED AND s.{HR_OP} <> 'D' AND {newer} THEN UPDATE SET {', '.join(sets)} "
        f"WHEN NOT MATCHED AND s.{HR_OP} <> 'D' THEN INSERT ({', '.join(targets)}) "
        f"VALUES ({', '.join('s.' + t for t in targets)})"
    )


def take_from_old_keys(spark: SparkSession, table: TableSchema, name: str, changes: DataFrame) -> DataFrame:
    """Rows whose key changed leaving TOAST columns unchanged (``_hr_from``: the old key) take
    those columns from the old key's row in the target, read before the MERGE changes it."""
    old = spark.table(name).select(
        *[F.col(quote_spark(c.name)).alias(f"_hr_old{i}") for i, c in enumerate(table.columns)]
    )
    index = {c.name: i for i, c in enumerate(table.columns)}
    same = [F.col(HR_FROM).getField(k) == F.col(f"_hr_old{index[k]}") for k in table.key]
    joined = changes.join(old, functools.reduce(operator.and_, same), "left")
    moved = F.col(HR_FROM).isNotNull()
    unchanged = F.split(F.coalesce(F.col(HR_UNCHANGED), F.lit("")), ",")
    columns = []
    for i, c in enumerate(table.columns):
        value = F.col(quote_spark(c.name))
        if c.name not in table.key:
            value = F.when(moved & F.array_contains(unchanged, unchanged_token(c.name)), F.col(f"_hr_old{i}")).otherwise(value)
        columns.append(value.alias(c.name))
    return joined.select(
        *columns, HR_LSN, HR_SEQ, HR_COMMIT_TS, HR_OP,
        F.when(moved, F.lit(None).cast("string")).otherwise(F.col(HR_UNCHANGED)).alias(HR_UNCHANGED),
    )
