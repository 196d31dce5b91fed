"""Tables without a key in Iceberg: a batch applied as a multiset delta, exactly once.

Identical rows may exist, so a change cannot be keyed and replaying it is not harmless: removing
"one copy of row r" twice removes two. The staged-log cursor lives in the state store and advances
after the Iceberg commit, so a crash in between replays the batch. Every keyless batch therefore
records an *intent* in the table's properties before its data commit (a properties change writes
new metadata but no snapshot):

- ``headrace.intent.snapshot``: the current snapshot id when the intent was written (-1: none);
- ``headrace.intent.position``: the position (lsn/seq) of the batch's last change;
- ``headrace.applied.position``: the position of the last change known to be committed before.

The batch's data then commits in ONE MERGE (an append when the batch only adds rows). Before applying, the target resolves the position the
table holds: if a snapshot other than a compaction (operation ``replace``) descends from the
intent's snapshot, the intent's MERGE committed and the table holds ``intent.position``; otherwise
it holds ``applied.position``. Changes at or before that position are dropped from the batch, so a
replay (however the log is cut into batches the second time) applies each change once.

A TRUNCATE's delete is its own commit before the intent: redoing it is harmless (it deletes rows
written before the truncate's position, and every row the batch writes is after it); a pending
intent is first settled into ``applied.position`` so the delete cannot pass for the intent's MERGE.
"""

from __future__ import annotations

import functools
import operator
import uuid
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from headrace.core.names import quote_spark
from headrace.core.position import Position
from headrace.core.rows import HR_COMMIT_TS, HR_DELTA, HR_LSN, HR_OP, HR_SEQ
from headrace.core.schema import TableSchema
from headrace.engines.spark.keyless import net_row_changes
from headrace.targets.iceberg.catalog import java_table

INTENT_SNAPSHOT = "headrace.intent.snapshot"
INTENT_POSITION = "headrace.intent.position"
APPLIED_POSITION = "headrace.applied.position"
_ACTION = "_hr_action"  # in the MERGE source: 'del' (matches target rows to delete) or 'ins'
_META = (HR_LSN, HR_SEQ, HR_COMMIT_TS)


def _format(pos: Position | None) -> str:
    return "" if pos is None else f"{pos.lsn}/{pos.seq}"


def _parse(text: str | None) -> Position | None:
    if not text:
        return None
    lsn, _, seq = text.partition("/")
    return Position(int(lsn), int(seq))


class KeylessApply:
    """Applies keyless batches to one Iceberg catalog; see the module docstring."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark

    def iceberg_table(self, name: str) -> Any:
        """The Java ``org.apache.iceberg.Table`` behind Spark name ``name``, refreshed."""
        table = java_table(self.spark, name)
        table.refresh()
        return table

    def applied_position(self, jtable: Any) -> Position | None:
        """The position of the last change the table holds (None: no keyless batch yet)."""
        props = jtable.properties()
        intent = props.get(INTENT_SNAPSHOT)
        applied = _parse(props.get(APPLIED_POSITION))
        if intent and _committed_since(jtable, int(intent)):
            return _parse(props.get(INTENT_POSITION))
        return applied

    def apply(self, table: TableSchema, name: str, changes: DataFrame, truncate_before: Position | None) -> None:
        """Apply one keyless batch (row images, see ``headrace.engines.spark.batch``) exactly once."""
        jtable = self.iceberg_table(name)
        applied = self.applied_position(jtable)
        if truncate_before is not None:
            if jtable.properties().get(INTENT_SNAPSHOT):
                _set(jtable, {APPLIED_POSITION: _format(applied), INTENT_SNAPSHOT: ""})
            lsn, seq = truncate_before.lsn, truncate_before.seq
            self.spark.sql(f"DELETE FROM {name} WHERE {HR_LSN} < {lsn} OR ({HR_LSN} = {lsn} AND {HR_SEQ} < {seq})")
            jtable.refresh()
        if applied is not None:
            at_lsn, at_seq = F.col(HR_LSN), F.col(HR_SEQ)
            changes = changes.where(
                (at_lsn > applied.lsn) | ((at_lsn == applied.lsn) & (at_seq > applied.seq))
            )
        facts = changes.agg(F.max(F.struct(F.col(HR_LSN), F.col(HR_SEQ))).alias("p"),
                            F.max(F.when(F.col(HR_OP) != "I", F.lit(True))).alias("removes")).collect()[0]
        last = facts.p
        if last is None:
            return  # nothing after what the table holds: a replay of a committed batch
        current = jtable.currentSnapshot()
        _set(jtable, {
            INTENT_SNAPSHOT: str(current.snapshotId() if current is not None else -1),
            INTENT_POSITION: _format(Position(last[0], last[1])),
            APPLIED_POSITION: _format(applied),
        })
        net = net_row_changes(changes, table)
        if not facts.removes:
            # Only rows added (an append-only table: logs, events): the MERGE would match nothing, yet
            # it joins the batch with a scan of the whole table, so its cost grew with the table
            # (pgbench_history: 96 s a batch after 5 minutes). An append writes the same rows.
            net.select(*[F.col(quote_spark(c.name)) for c in table.columns], *_META).writeTo(name).append()
            return
        source = self._merge_source(table, name, net)
        view = f"hr_keyless_{uuid.uuid4().hex}"
        source.createOrReplaceTempView(view)
        try:
            self.spark.sql(_merge_statement(table, name, view))
        finally:
            self.spark.catalog.dropTempView(view)

    def _merge_source(self, table: TableSchema, name: str, net: DataFrame) -> DataFrame:
        """Rows for one MERGE: 'del' rows that each match a group of identical target rows (same
        columns and position), 'ins' rows for the group's copies that survive, and 'ins' rows
        for the copies the batch adds."""
        cols = [quote_spark(c.name) for c in table.columns]
        meta = [*cols, *_META]
        removes = net.where(F.col(HR_DELTA) < 0).alias("r")
        target = self.spark.table(name).alias("t")
        same = functools.reduce(
            operator.and_, [F.col(f"t.{c}").eqNullSafe(F.col(f"r.{c}")) for c in cols], F.lit(True)
        )
        groups = (
            target.join(removes, same)
            .groupBy(*[F.col(f"t.{c}") for c in meta], F.col(f"r.{HR_DELTA}"))
            .agg(F.count(F.lit(1)).alias("_n"))
        )
        # Remove the oldest copies first: groups of one row in position order, n copies each.
        earlier = Window.partitionBy(*[F.col(c) for c in cols]).orderBy(*[F.col(c) for c in _META])
        before = F.coalesce(F.sum("_n").over(earlier.rowsBetween(Window.unboundedPreceding, -1)), F.lit(0))
        groups = groups.withColumn(
            "_k", F.least(F.col("_n"), F.greatest(F.lit(0), -F.col(HR_DELTA) - before))
        ).where(F.col("_k") > 0)
        out = [F.col(c) for c in meta]
        deletes = groups.select(*out, F.lit("del").alias(_ACTION))
        survivors = groups.where(F.col("_n") > F.col("_k")).select(
            *out, F.lit("ins").alias(_ACTION), F.explode(F.sequence(F.lit(1), F.col("_n") - F.col("_k")))
        ).drop("col")
        adds = net.where(F.col(HR_DELTA) > 0).select(*out, F.lit("ins").alias(_ACTION))
        return deletes.unionByName(survivors).unionByName(adds)


def _committed_since(jtable: Any, snapshot_id: int) -> bool:
    """Whether a snapshot other than a compaction descends from ``snapshot_id`` (-1: from none)."""
    snap = jtable.currentSnapshot()
    while snap is not None and snap.snapshotId() != snapshot_id:
        if snap.operation() != "replace":
            return True
        parent = snap.parentId()
        snap = jtable.snapshot(parent) if parent is not None else None
    return False


def _set(jtable: Any, props: dict[str, str]) -> None:
    """Commit table properties (new metadata, no snapshot)."""
    update = jtable.updateProperties()
    for key, value in props.items():
        update = update.set(key, value)
    update.commit()


def _merge_statement(table: TableSchema, name: str, view: str) -> str:
    """'del' rows delete the target rows equal to them in every column (NULLs equal, position
    included); 'ins' rows never match and are inserted."""
    names = [quote_spark(c.name) for c in table.columns] + list(_META)
    on = " AND ".join([f"s.{_ACTION} = 'del'", *[f"t.{n} <=> s.{n}" for n in names]])
    return (
        f"MERGE INTO {name} t USING {view} s ON {on} "
        f"WHEN MATCHED THEN DELETE "
        f"WHEN NOT MATCHED AND s.{_ACTION} = 'ins' THEN INSERT ({', '.join(names)}) "
        f"VALUES ({', '.join('s.' + n for n in names)})"
    )
