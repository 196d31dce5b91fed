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
  column statistics; the list of the batch's keys (up to ``KEY_LIST_LIMIT``) drops every other row
  before the join, so the shuffle carries the batch's rows instead of the table's. Neither changes
  the result: a source row's key always satisfies both, and a target row that fails them had no
  source row to match.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from headrace.core.names import quote_spark
from headrace.core.rows import HR_COMMIT_TS, HR_LSN, HR_OP, HR_SEQ, HR_UNCHANGED, unchanged_token
from headrace.core.schema import TableSchema

# Keys listed in the ON clause at most (beyond it, the range alone). The list is SQL text Spark parses
# and plans: on our loaded 2-core machine planning took 1.9 s with 1,000 keys, 1.6-2.1 s with 5,000,
# 3.3-4.4 s with 20,000. Iceberg prunes files by an IN of at most 200 values; past that the list
# filters rows ahead of the join, which saves shuffling the table's key columns: a 25K-key batch into
# 10M rows took 14.3-14.6 s of JVM CPU with the list, 18.3-19.5 s without.
KEY_LIST_LIMIT = 50_000


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
    def of(cls, table: TableSchema, batch: DataFrame) -> BatchBounds:
        """One aggregate over ``batch`` (persist it first: the MERGE reads it again), and one narrow
        read of its keys when there are several and at most ``KEY_LIST_LIMIT``."""
        first = table.key[0]
        key = F.col(quote_spark(first))
        kind = batch.schema[first].dataType
        pieces = F.flatten(F.collect_list(F.split(F.col(HR_UNCHANGED), ",")))
        row = batch.agg(F.count(F.lit(1)), F.min(key), F.max(key), F.array_distinct(pieces)).first()
        assert row is not None  # an aggregate without grouping has one row
        rows, least, greatest, named = int(row[0]), row[1], row[2], set(row[3] or ())
        # The list holds each column's token (names escaped: ``unchanged_token``); a token no column
        # has (staged by an older version, which did not escape): assume any column is unchanged.
        by_token = {unchanged_token(c.name): c.name for c in table.columns}
        unchanged = frozenset(by_token[t] for t in named) if named <= by_token.keys() else None
        low, high = _literal(least, kind), _literal(greatest, kind)
        if low is None or high is None:
            return cls(rows, unchanged, None, None)
        key_list: tuple[str, ...] | None = None
        if low == high:
            key_list = (low,)  # one value (a one-row change): no need to read the keys
        elif rows <= KEY_LIST_LIMIT:
            # One row per key after deduplication: a plain narrow read of the persisted batch.
            literals = [_literal(v, kind) for v in dict.fromkeys(r[0] for r in batch.select(key).collect())]
            if all(lit is not None for lit in literals):
                key_list = tuple(lit for lit in literals if lit is not None)
        key_range = (low, high)
        return cls(rows, unchanged, key_range, key_list)


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
