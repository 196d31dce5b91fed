"""Read staged change files into one deduplicated batch in the Target row shape.

Order of changes is (commit LSN, ordinal in transaction, sub-ordinal): an update that changed the
key becomes a delete of the old key (sub 0) followed by the new row (sub 1) at the same position.
Only the last change per key survives, except that a TOAST column the last update left unchanged
takes its value from the latest earlier change in the batch that did send it.

Tables without a key (REPLICA IDENTITY FULL) are not deduplicated: identical rows may exist, so a
change can only be applied as a multiset delta. Their batch holds one row per row image a change
adds or removes (``I``: one more copy of this row; ``D``: one copy fewer; an update is a ``D`` of
the old row and an ``I`` of the new one at the same position). ``net_row_changes`` folds such a
batch into counts per distinct row
(``headrace.engines.spark.keyless``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from pyspark.sql import Column, DataFrame, SparkSession, Window, WindowSpec
from pyspark.sql import functions as F

from headrace.core.batch import ChangeBatch
from headrace.core.errors import TerminalError
from headrace.core.position import Position
from headrace.core.rows import HR_COMMIT_TS, HR_FROM, HR_LSN, HR_OP, HR_SEQ, HR_UNCHANGED, unchanged_token
from headrace.core.schema import TableSchema
from headrace.core.spark_types import ValueRules
from headrace.engines.spark.casts import cast_text, changed_value_counts
from headrace.log.codec import STAGING_SPARK_DDL
from headrace.log.facts import FileFacts, total

_MAP = "map<string,string>"

# A batch of at most this many staged rows is read as one partition (``coalesce(1)``): the window per
# key then needs no shuffle, and the build is one Spark job of one stage and one task instead of a
# scan stage, a shuffle and AQE's second plan (docs/benchmarks.md, the Spark lane).
ONE_TASK_ROWS = 50_000


# The change rules, each one function under the same name in ``engines.driver.batch`` (compared by
# ``tests/engines/test_rules.py``): ``change_order``, ``after_position``, ``key_changes``,
# ``last_change_per_key`` and ``toast_fill``.


def change_order() -> list[str]:
    """The order of a batch's changes: commit position, ordinal in the transaction, then the two
    halves of a key change (the old key's delete, ``_sub`` 0, before the new row, 1)."""
    return ["_lsn", "_seq", "_sub"]


def after_position(pos: Position) -> Column:
    """Changes strictly after ``pos`` (compared as (commit position, ordinal))."""
    lsn, seq = F.col("_lsn"), F.col("_seq")
    return (lsn > F.lit(pos.lsn)) | ((lsn == F.lit(pos.lsn)) & (seq > F.lit(pos.seq)))


def read_change_batch(
    spark: SparkSession, files: list[str], table: TableSchema, skip_through: Position | None,
    rules: ValueRules | None = None, *, facts: Sequence[FileFacts | None] | None = None,
) -> ChangeBatch:
    """Read ``files`` (staged changes of ``table``) into a deduplicated ``ChangeBatch``.

    Changes at or before ``skip_through`` (compared as (lsn, seq)) are dropped: the initial copy
    already holds them. ``facts`` (one per file, as capture registered them) answer the row count,
    the latest truncate and the TOAST flags without reading the files; without them (files
    registered by an older version), or when the answer must look at the rows (values clamped, a
    keyless update that may lack its old row), one small Spark job finds them. ``changes`` itself
    stays lazy.
    """
    if files:
        staged = spark.read.schema(STAGING_SPARK_DDL).parquet(*files)
    else:
        staged = spark.createDataFrame([], STAGING_SPARK_DDL)
    op = F.col("_op")
    after_skip = F.lit(True) if skip_through is None else after_position(skip_through)

    # Every Column built here is a few round trips to the JVM, a fixed cost per batch: the counts'
    # expressions are only built when there is something to count (``changed_value_counts`` has
    # none unless clamping).
    counts: list[tuple[str, str, Column]] = []
    if rules is not None and rules.infinity == "clamp":
        data = F.from_json(F.col("_data"), _MAP)
        counts = changed_value_counts(
            [(c.name, c.type, F.when(after_skip & (op != "D"), data[c.name])) for c in table.columns], rules)
    known = _known_facts(facts, len(files), table, counts)
    if known is not None:
        stats = _Stats(known.rows, known.last_truncate, known.unchanged, False, known.key_toast, {})
        if stats.truncate is not None and skip_through is not None and stats.truncate <= skip_through:
            stats = replace(stats, truncate=None)  # the truncate is in the copy already
    else:
        stats = _scan_stats(staged, table, after_skip, counts)
    truncate_before = stats.truncate
    if stats.no_old_row:
        raise TerminalError(
            f"table {table.qualified_name} has no key and an update arrived without its old row: run "
            f"ALTER TABLE {table.qualified_name} REPLICA IDENTITY FULL (or add a primary key), then resync it"
        )

    # One filter, one coalesce: every DataFrame step is an analysis of the plan so far on the driver.
    kept = staged.coalesce(1) if stats.rows_in <= ONE_TASK_ROWS else staged
    keep = after_skip & (op != "T")
    changes = kept.where(keep if truncate_before is None else keep & after_position(truncate_before))
    if not table.key:
        return ChangeBatch(changes=row_images(changes, table, rules), truncate_before=truncate_before,
                           rows_in=stats.rows_in, values_changed=stats.values_changed)
    changes = key_changes(changes)
    changes = last_change_per_key(changes, table, rules, has_unchanged=stats.toast, key_toast=stats.key_toast)
    return ChangeBatch(changes=changes, truncate_before=truncate_before, rows_in=stats.rows_in,
                       values_changed=stats.values_changed)


@dataclass(frozen=True)
class _Stats:
    """What the batch's plan needs to know of its staged rows."""

    rows_in: int  # staged rows, before skipping
    truncate: Position | None  # the latest TRUNCATE after the skip point
    toast: bool  # a row left TOAST columns unchanged (skip point not considered)
    no_old_row: bool  # a keyless table's update after the skip point lacks its old row
    key_toast: bool  # an update moved the key and left TOAST columns unchanged (skip point not considered)
    values_changed: dict[tuple[str, str], int]


def _known_facts(facts: Sequence[FileFacts | None] | None, files: int, table: TableSchema,
                 counts: list[tuple[str, str, Column]]) -> FileFacts | None:
    """The batch's facts from the log entries, or None when a scan must find them.

    A scan is needed when an entry has no facts, when values clamped must be counted, and when a
    keyless table's update may lack its old row: only the rows tell whether that update is after
    the skip point, and the scan raises the error exactly as before.
    """
    if facts is None or len(facts) != files or counts:
        return None
    present = [f for f in facts if f is not None]
    if len(present) != files:
        return None
    known = total(present)
    if not table.key and known.update_without_old:
        return None
    return known


def _scan_stats(staged: DataFrame, table: TableSchema, after_skip: Column,
                counts: list[tuple[str, str, Column]]) -> _Stats:
    """The batch's facts by one Spark job over everything staged (one scan for all of them)."""
    lsn, seq, op = F.col("_lsn"), F.col("_seq"), F.col("_op")
    # A keyless table's update must carry its whole old row (REPLICA IDENTITY FULL sends it).
    no_old_row = (op == "U") & F.col("_old_key").isNull() & after_skip if not table.key else F.lit(False)
    stats = staged.agg(
        F.count(F.lit(1)).alias("rows_in"),
        F.max(F.when((op == "T") & after_skip, F.struct(lsn, seq))).alias("trunc"),
        F.max(F.col("_unchanged_cols").isNotNull().cast("int")).alias("toast"),
        F.max(no_old_row.cast("int")).alias("no_old_row"),
        F.max(((op == "U") & F.col("_old_key").isNotNull() & F.col("_unchanged_cols").isNotNull()).cast("int"))
        .alias("key_toast"),
        *[n.alias(f"_vc{i}") for i, (_, _, n) in enumerate(counts)],
    ).collect()[0]
    values_changed = {(name, reason): int(stats[f"_vc{i}"] or 0) for i, (name, reason, _) in enumerate(counts)}
    return _Stats(
        rows_in=int(stats.rows_in),
        truncate=Position(stats.trunc[0], stats.trunc[1]) if stats.trunc is not None else None,
        toast=bool(stats.toast),
        no_old_row=bool(stats.no_old_row),
        key_toast=bool(stats.key_toast),
        values_changed={k: n for k, n in values_changed.items() if n},
    )


def key_changes(changes: DataFrame) -> DataFrame:
    """One row per change, with ``_sub`` and ``_values`` (the row's column → text map).

    An update with ``_old_key`` also yields a delete of the old key just before it.
    """
    data = F.from_json(F.col("_data"), _MAP)
    old_key = F.from_json(F.col("_old_key"), _MAP)
    new_row = F.struct(F.lit(1).alias("sub"), F.col("_op").alias("op"), data.alias("values"))
    old_row = F.struct(F.lit(0).alias("sub"), F.lit("D").alias("op"), old_key.alias("values"))
    rows = F.when((F.col("_op") == "U") & F.col("_old_key").isNotNull(), F.array(old_row, new_row)).otherwise(
        F.array(new_row)
    )
    return changes.select("_lsn", "_seq", "_ts", "_unchanged_cols", "_old_key", F.explode(rows).alias("r")).select(
        "_lsn",
        "_seq",
        "_ts",
        F.when(F.col("r.op") == "D", F.lit(None)).otherwise(F.col("_unchanged_cols")).alias("_unchanged"),
        F.col("r.sub").alias("_sub"),
        F.col("r.op").alias("_op"),
        F.col("r.values").alias("_values"),
        # The row came from this old key (an update that changed the key): its TOAST columns left
        # unchanged hold what the old key's row held.
        F.when(F.col("r.sub") == 1, F.col("_old_key")).alias("_from"),
    )


def row_images(changes: DataFrame, table: TableSchema, rules: ValueRules | None) -> DataFrame:
    """A keyless table's changes as row images added (``I``) or removed (``D``), cast, not deduplicated.

    Capture stages a delete with the whole old row in ``_data`` and an update with the whole old
    row in ``_old_key``; an update becomes the removal of its old row and the addition of its new
    one at the change's position.
    """
    data = F.from_json(F.col("_data"), _MAP)
    old_row = F.from_json(F.col("_old_key"), _MAP)
    added = F.struct(F.lit("I").alias("op"), data.alias("values"))
    removed_old = F.struct(F.lit("D").alias("op"), old_row.alias("values"))
    removed = F.struct(F.lit("D").alias("op"), data.alias("values"))
    images = (
        F.when(F.col("_op") == "U", F.array(removed_old, added))
        .when(F.col("_op") == "D", F.array(removed))
        .otherwise(F.array(added))
    )
    exploded = changes.select("_lsn", "_seq", "_ts", F.explode(images).alias("r"))
    return exploded.select(
        *[cast_text(F.col("r.values")[c.name], c.type, rules, c.name).alias(c.name) for c in table.columns],
        F.col("_lsn").alias(HR_LSN),
        F.col("_seq").alias(HR_SEQ),
        F.col("_ts").alias(HR_COMMIT_TS),
        F.col("r.op").alias(HR_OP),
        F.lit(None).cast("string").alias(HR_UNCHANGED),
    )


KEY_CHANGE_HOPS = 2  # key changes of one row within a batch followed to find an unchanged TOAST value


def last_change_per_key(changes: DataFrame, table: TableSchema, rules: ValueRules | None, has_unchanged: bool,
                        key_toast: bool = False) -> DataFrame:
    """Keep the last change per key, cast to the table's types, in the Target row shape.

    With ``has_unchanged``, TOAST columns an update left unchanged are filled first (``toast_fill``).
    """
    keys = [cast_text(F.col("_values")[k], table.column(k).type, rules, k) for k in table.key]
    named = [k.alias(f"_k{i}") for i, k in enumerate(keys)]
    order = F.struct(*[F.col(c) for c in change_order()])
    whole_key = Window.partitionBy(*[F.col(f"_k{i}") for i in range(len(table.key))])
    if has_unchanged:  # TOAST's windows partition by the named key too: one shuffle serves them all
        changes = changes.select("*", *named).withColumn("_last", F.max(order).over(whole_key))
    else:  # the one window, in the select naming the key: each DataFrame step is an analysis on the driver
        changes = changes.select("*", *named, F.max(order).over(Window.partitionBy(*keys)).alias("_last"))

    filled = _Filled({c.name: F.col("_values")[c.name] for c in table.columns}, [], [])
    if has_unchanged:
        changes, filled = toast_fill(changes, table, whole_key, key_toast)

    changes = changes.where(order == F.col("_last"))
    is_delete = F.col("_op") == "D"
    columns = []
    for c in table.columns:
        if c.name in table.key:
            columns.append(F.col(f"_k{table.key.index(c.name)}").alias(c.name))
            continue
        typed = cast_text(filled.values[c.name], c.type, rules, c.name)
        typed = F.when(is_delete, F.lit(None)).otherwise(typed)  # deletes carry the key only
        columns.append(typed.alias(c.name))
    remaining = F.concat_ws(",", *filled.still_unchanged) if filled.still_unchanged else F.lit("")
    extra = []
    if key_toast and filled.froms:
        old_key = F.from_json(F.coalesce(*filled.froms), _MAP)
        from_key = F.struct(*[cast_text(old_key[k], table.column(k).type, rules, k).alias(k) for k in table.key])
        extra.append(F.when(~is_delete & old_key.isNotNull(), from_key).alias(HR_FROM))
    return changes.select(
        *columns,
        F.col("_lsn").alias(HR_LSN),
        F.col("_seq").alias(HR_SEQ),
        F.col("_ts").alias(HR_COMMIT_TS),
        F.col("_op").alias(HR_OP),
        F.when(is_delete | (remaining == ""), F.lit(None).cast("string"))
        .otherwise(remaining)
        .alias(HR_UNCHANGED),
        *extra,
    )


@dataclass(frozen=True)
class _Filled:
    """Each column's value text after ``toast_fill``, the TOAST tokens still unchanged after it, and
    where a key change's unchanged values are to be looked up (the old key, ``_hr_from``)."""

    values: dict[str, Column]
    still_unchanged: list[Column]
    froms: list[Column]


def toast_fill(changes: DataFrame, table: TableSchema, whole_key: WindowSpec, key_toast: bool
               ) -> tuple[DataFrame, _Filled]:
    """A TOAST column an update left unchanged takes its value from the latest earlier change of the
    same key in the batch that sent it; what the batch does not hold stays unchanged (the target
    keeps its row's value).

    With ``key_toast`` (an update changed the key and left a TOAST column unchanged), each such
    update first takes the column's value from the old key's history in the batch; what the batch
    does not hold comes from the old key's target row, named in ``_hr_from`` (a struct of the key
    columns; NULL when the unchanged values are the key's own target row's).
    """
    values = {c.name: F.col("_values")[c.name] for c in table.columns}
    still: list[Column] = []
    froms: list[Column] = []
    ordered = whole_key.orderBy(*change_order())
    unchanged = F.split(F.coalesce(F.col("_unchanged"), F.lit("")), ",")
    others = [(i, c.name) for i, c in enumerate(table.columns) if c.name not in table.key]
    none = F.lit(None)
    for i, name in others:
        # What this change says about the column: a value (a struct, so a sent NULL counts), or,
        # for an update that moved the row from another key leaving the column unchanged, where
        # to look: the old key's value just before this change's position.
        sent = F.when(~F.array_contains(unchanged, unchanged_token(name)),
                      F.struct(F.col("_values")[name].alias("v"), none.cast("string").alias("from"),
                               none.cast("bigint").alias("lsn"), none.cast("bigint").alias("seq")))
        if key_toast:
            sent = sent.when(F.col("_from").isNotNull(),
                             F.struct(none.cast("string").alias("v"), F.col("_from").alias("from"),
                                      F.col("_lsn").alias("lsn"), F.col("_seq").alias("seq")))
        changes = changes.withColumn(f"_x{i}", sent)
    if key_toast:
        for _ in range(KEY_CHANGE_HOPS):
            changes = _follow_key_changes(changes, ordered, [i for i, _ in others])
    upto_here = ordered.rowsBetween(Window.unboundedPreceding, 0)
    for i, name in others:
        is_unchanged = F.array_contains(unchanged, unchanged_token(name))
        changes = changes.withColumn(f"_s{i}", F.last(f"_x{i}", ignorenulls=True).over(upto_here))
        values[name] = F.when(is_unchanged, F.col(f"_s{i}.v")).otherwise(values[name])
        left = is_unchanged & (F.col(f"_s{i}").isNull() | F.col(f"_s{i}.from").isNotNull())
        still.append(F.when(left, F.lit(unchanged_token(name))))
        froms.append(F.when(is_unchanged, F.col(f"_s{i}.from")))
    return changes, _Filled(values, still, froms)


def _follow_key_changes(changes: DataFrame, ordered: WindowSpec, columns: list[int]) -> DataFrame:
    """One hop: a column pointing at (old key, position) takes what the old key held just before
    that position in the batch (a value, or a pointer further back); with nothing there it stays,
    and the target looks the old key up."""
    before = ordered.rowsBetween(Window.unboundedPreceding, -1)
    # The delete half of a key change (sub 0) sits on the old key at the change's position.
    held = changes.select(
        "_lsn", "_seq", "_sub", *[F.last(f"_x{i}", ignorenulls=True).over(before).alias(f"_b{i}") for i in columns]
    ).where(F.col("_sub") == 0).drop("_sub")
    pointer = F.coalesce(*[F.when(F.col(f"_x{i}.from").isNotNull(), F.col(f"_x{i}")) for i in columns])
    hop = changes.withColumn("_hop_lsn", pointer["lsn"]).withColumn("_hop_seq", pointer["seq"])
    held = held.select(F.col("_lsn").alias("_at_lsn"), F.col("_seq").alias("_at_seq"), *[f"_b{i}" for i in columns])
    at = (F.col("_hop_lsn") == F.col("_at_lsn")) & (F.col("_hop_seq") == F.col("_at_seq"))
    joined = hop.join(held, at, "left")
    for i in columns:
        points = F.col(f"_x{i}.from").isNotNull()
        joined = joined.withColumn(f"_x{i}", F.when(points, F.coalesce(F.col(f"_b{i}"), F.col(f"_x{i}")))
                                   .otherwise(F.col(f"_x{i}")))
    return joined.drop("_hop_lsn", "_hop_seq", "_at_lsn", "_at_seq", *[f"_b{i}" for i in columns])
