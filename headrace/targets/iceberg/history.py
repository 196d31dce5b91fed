"""History tables in Iceberg (``headrace.history``), written by Spark SQL.

Iceberg commits one statement at a time, so a history batch is several commits; each is idempotent
by position on its own, which makes the batch exactly-once however a crash cuts it:
- changelog: one append whose snapshot carries the batch's offset (``snapshot-property``; committed on
  the driver, ``history_append``, unless Spark must), then the
  offset in the table's properties too (read back as the larger of the two: a snapshot expired by
  maintenance still leaves the property). A replay finds the offset and appends nothing.
- scd2: closes (a MERGE updating only the open version of a key written before the change), the
  truncate's closes (likewise), then a MERGE inserting each new version unless the same version
  (key and opening position) is there.
- soft_delete: a MERGE replacing a key's row only when written before the batch's, in-place
  deletions likewise, the truncate's marks last.
A history table is created (``CREATE TABLE AS SELECT`` from the mirror) with the property
``headrace.history.started``; one without it (a crash inside the create) is created again.

A table in one mode under its own name (no mirror, ``own``) is the copy turned into the mode's table
at its first batch: columns added (scd2: ``_hr_commit_ts`` renamed ``_hr_valid_from``), the copy's
rows marked, then ``headrace.history.started``; each step skips what is done, so a crash inside it
starts it again. Its batches are written as above, with the same offset; its cursor (in the state
store) moves after them, so a batch replayed before the cursor moved finds its offset and is skipped.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.types import DataType, StructField, StructType

from headrace.core.errors import TerminalError
from headrace.core.names import quote_spark
from headrace.core.schema import TableSchema
from headrace.core.spark_types import spark_type
from headrace.history import build as b
from headrace.history.changes import Key
from headrace.history.config import Mode, history_table
from headrace.history.queries import rows_now, written_before
from headrace.history.tables import (
    EXTRA,
    arrow_schema,
    in_place_mode,
    key_table,
    refuse_other_mode,
    to_arrow,
)
from headrace.history.writer import Built, HistoryWriter
from headrace.targets.iceberg.arrow_frame import arrow_frame
from headrace.targets.iceberg.catalog import java_table
from headrace.targets.iceberg.history_append import append_on_driver

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from headrace.targets.iceberg.target import IcebergTarget

OFFSET = "headrace.history.offset"
STARTED = "headrace.history.started"


def _type(spark_sql: str) -> DataType:
    from pyspark.sql.types import _parse_datatype_string

    return _parse_datatype_string(spark_sql.lower())


class IcebergHistory(HistoryWriter):
    """The history tables of one Iceberg target (its Spark session and catalog)."""

    writes_in_place = True

    def __init__(self, target: IcebergTarget) -> None:
        self.target = target
        self.spark = target.spark

    def name(self, table: TableSchema, mode: Mode, own: bool = False) -> str:
        """The history table's Spark name (``own``: the table's own name)."""
        mirror = self.target.table_name(table)
        if own:
            return mirror
        return mirror.rsplit(".", 1)[0] + "." + quote_spark(history_table(table.target_table, mode))

    def _struct(self, table: TableSchema, mode: Mode) -> StructType:
        fields = [StructField(c.name, spark_type(c.type)) for c in table.columns]
        return StructType(fields + [StructField(n, _type(sql)) for n, _, _, sql in EXTRA[mode]])

    def _properties(self, name: str, appends: bool) -> dict[str, str] | None:
        """The table's properties (None: no table), with ``appends`` the offset of its last append when
        newer (a crash between the append and the property's commit)."""
        if not self.spark.catalog.tableExists(name):
            return None
        jtable = java_table(self.spark, name)
        jtable.refresh()
        props = dict(jtable.properties())
        snap = jtable.currentSnapshot() if appends else None
        while snap is not None:  # back over maintenance's snapshots to the last append
            summary = snap.summary()
            if summary.containsKey(OFFSET):
                found = int(summary.get(OFFSET))
                if found > int(props.get(OFFSET, -1)):
                    props[OFFSET] = str(found)
                break
            parent = snap.parentId()
            snap = jtable.snapshot(parent) if parent is not None else None
        return props

    def applied_offset(self, table: TableSchema, mode: Mode, own: bool = False) -> int | None:
        props = self._properties(self.name(table, mode, own), appends=mode == "changelog")
        if props is None or STARTED not in props:
            return None
        return int(props.get(OFFSET, props[STARTED]))

    def start(self, table: TableSchema, mode: Mode, log_offset: int, own: bool = False) -> None:
        if own:
            self._start_in_place(table, mode, log_offset)
            return
        name, mirror = self.name(table, mode), self.target.table_name(table)
        source = ", ".join(quote_spark(c.name) for c in table.columns)
        seeded = {
            "changelog": f"CAST('I' AS STRING) AS {b.OP}, {b.COMMIT_TS}, {b.LSN}, {b.SEQ}, CAST(NULL AS BIGINT) AS {b.XID}",
            "scd2": (f"{b.COMMIT_TS} AS {b.VALID_FROM}, CAST(NULL AS TIMESTAMP) AS {b.VALID_TO}, true AS {b.CURRENT},"
                     f" {b.LSN}, {b.SEQ}, CAST(NULL AS BIGINT) AS {b.END_LSN}, CAST(NULL AS BIGINT) AS {b.END_SEQ}"),
            "soft_delete": f"CAST(NULL AS TIMESTAMP) AS {b.DELETED_AT}, {b.COMMIT_TS}, {b.LSN}, {b.SEQ}",
        }[mode]
        self.spark.sql(f"DROP TABLE IF EXISTS {name}")  # a create a crash cut short
        self.spark.sql(f"CREATE TABLE {name} USING iceberg TBLPROPERTIES ('format-version'='2') AS "
                       f"SELECT {source}, {seeded} FROM {mirror}")
        self._set(name, {OFFSET: str(log_offset), STARTED: str(log_offset)})

    def _start_in_place(self, table: TableSchema, mode: Mode, log_offset: int) -> None:
        """The copy (the mirror's shape, under the table's own name) becomes the ``mode`` table: its rows
        ``I`` rows, open versions or live rows with no commit time, as a table beside the mirror starts.
        Several commits, each skipping what is done; ``headrace.history.started`` last."""
        name = self.name(table, mode, own=True)
        have = set(self.spark.table(name).columns)
        refuse_other_mode(table, name, have, mode, "that Iceberg table")
        if mode == "scd2" and b.COMMIT_TS in have and b.VALID_FROM not in have:
            self.spark.sql(f"ALTER TABLE {name} RENAME COLUMN {b.COMMIT_TS} TO {b.VALID_FROM}")
            have = (have - {b.COMMIT_TS}) | {b.VALID_FROM}
        if added := [f"{column} {sql.lower()}" for column, _, _, sql in EXTRA[mode] if column not in have]:
            self.spark.sql(f"ALTER TABLE {name} ADD COLUMNS ({', '.join(added)})")
        if mode == "changelog":
            self.spark.sql(f"UPDATE {name} SET {b.OP} = 'I' WHERE {b.OP} IS NULL")
        elif mode == "scd2":
            self.spark.sql(f"UPDATE {name} SET {b.CURRENT} = true WHERE {b.CURRENT} IS NULL")
        self._set(name, {OFFSET: str(log_offset), STARTED: str(log_offset)})

    def refuse_copy(self, table: TableSchema, columns: set[str]) -> None:
        """Before a copy replaces ``table``'s rows (its Iceberg table has ``columns``): refused when the
        table is a history table under its own name (the copy would throw its history away)."""
        if (mode := in_place_mode(columns)) is not None:
            raise TerminalError(
                f"table {table.qualified_name}: {self.target.table_name(table)} is its {mode} table, holding its"
                f" history, and a copy (a resync) would replace it: refused. To keep streaming, resume the table;"
                f" to start its history again, drop that Iceberg table (its history is lost) and resync")

    def _set(self, name: str, props: dict[str, str]) -> None:
        update = java_table(self.spark, name).updateProperties()
        for key, value in props.items():
            update = update.set(key, value)
        update.commit()

    def previous(self, table: TableSchema, keys: list[Key], own: Mode | None = None) -> dict[Key, b.Row]:
        from headrace.targets.ducklake.files import to_arrow as collect

        struct = StructType([StructField(k, spark_type(table.column(k).type)) for k in table.key])
        wanted = arrow_frame(self.spark, key_table(table, keys), struct)
        name = self.target.table_name(table)
        mirror = self.spark.table(name) if own is None else self.spark.sql(rows_now(table, own, name, quote_spark))
        rows = collect(mirror.join(wanted, list(table.key), "left_semi").select(*[quote_spark(c) for c in
                                                                                 table.column_names]))
        out = {}
        for row in rows.to_pylist():
            out[tuple(row[k] for k in table.key)] = row
        return out

    def _follow_columns(self, table: TableSchema, name: str) -> None:
        have = set(self.spark.table(name).columns)
        for c in table.columns:
            if c.name not in have:
                self.spark.sql(f"ALTER TABLE {name} ADD COLUMN {quote_spark(c.name)} {spark_type(c.type).simpleString()}")

    def write(self, table: TableSchema, mode: Mode, built: Built, log_offset: int, own: bool = False) -> None:
        name = self.name(table, mode, own)
        self._follow_columns(table, name)
        if isinstance(built, (list, pa.Table)):
            if len(built) and not append_on_driver(self.spark, name, self._arrow(table, mode, built),
                                                   {OFFSET: str(log_offset)}):
                (self._kept_columns(self._frame(table, mode, built), name).writeTo(name)
                 .option(f"snapshot-property.{OFFSET}", str(log_offset)).append())
        elif isinstance(built, b.Scd2Batch):
            self._scd2(table, name, built)
        else:
            self._soft_delete(table, name, built)
        self._set(name, {OFFSET: str(log_offset)})

    def _kept_columns(self, frame: DataFrame, name: str) -> DataFrame:
        """``frame`` with the columns table ``name`` keeps and the batch has not (a dropped source column,
        kept by policy), NULL: an append names every column of the table."""
        from pyspark.sql import functions as F

        kept = [f for f in self.spark.table(name).schema.fields if f.name not in set(frame.columns)]
        return frame.select("*", *[F.lit(None).cast(f.dataType).alias(f.name) for f in kept]) if kept else frame

    @staticmethod
    def _arrow(table: TableSchema, mode: Mode, rows: list[b.Row] | pa.Table) -> pa.Table:
        return rows.cast(arrow_schema(table, mode)) if isinstance(rows, pa.Table) else to_arrow(table, mode, rows)

    def _frame(self, table: TableSchema, mode: Mode, rows: list[b.Row] | pa.Table) -> DataFrame:
        return arrow_frame(self.spark, self._arrow(table, mode, rows), self._struct(table, mode))

    def _events(self, table: TableSchema, events: dict[Key, b.Event] | pa.Table) -> DataFrame:
        struct = StructType([StructField(k, spark_type(table.column(k).type)) for k in table.key]
                            + [StructField(b.LSN, _type("bigint")), StructField(b.SEQ, _type("bigint")),
                               StructField(b.COMMIT_TS, _type("timestamp"))])
        if isinstance(events, pa.Table):
            fields = [pa.field(k, key_table(table, []).schema.field(k).type) for k in table.key]
            fields += [pa.field(b.LSN, pa.int64()), pa.field(b.SEQ, pa.int64()),
                       pa.field(b.COMMIT_TS, pa.timestamp("us", tz="UTC"))]
            return arrow_frame(self.spark, events.cast(pa.schema(fields)), struct)
        keys = key_table(table, list(events))
        at = list(events.values())
        rows = (keys.append_column(b.LSN, pa.array([e.lsn for e in at], pa.int64()))
                .append_column(b.SEQ, pa.array([e.seq for e in at], pa.int64()))
                .append_column(b.COMMIT_TS, pa.array([e.ts for e in at], pa.timestamp("us", tz="UTC"))))
        return arrow_frame(self.spark, rows, struct)

    def _merge(self, frame: DataFrame, statement: str) -> None:
        view = f"hr_history_{uuid.uuid4().hex}"
        frame.createOrReplaceTempView(view)
        try:
            self.spark.sql(statement.format(source=view))
        finally:
            self.spark.catalog.dropTempView(view)

    @staticmethod
    def _on_key(table: TableSchema) -> str:
        return " AND ".join(f"t.{quote_spark(k)} = s.{quote_spark(k)}" for k in table.key)

    def _scd2(self, table: TableSchema, name: str, batch: b.Scd2Batch) -> None:
        close = (f"{b.VALID_TO} = s.{b.COMMIT_TS}, {b.CURRENT} = false, {b.END_LSN} = s.{b.LSN},"
                 f" {b.END_SEQ} = s.{b.SEQ}")
        if len(batch.closes):
            self._merge(self._events(table, batch.closes),
                        f"MERGE INTO {name} t USING {{source}} s ON {self._on_key(table)} AND t.{b.CURRENT}"
                        f" AND {written_before('t', 's')} WHEN MATCHED THEN UPDATE SET {close}")
        if (t := batch.truncate) is not None:
            self._truncate(name, t, f"{b.CURRENT}", f"{b.VALID_TO} = {{ts}}, {b.CURRENT} = false,"
                           f" {b.END_LSN} = {t.lsn}, {b.END_SEQ} = {t.seq}")
        if len(batch.versions):
            self._merge(self._frame(table, "scd2", batch.versions),
                        f"MERGE INTO {name} t USING {{source}} s ON {self._on_key(table)} AND t.{b.LSN} = s.{b.LSN}"
                        f" AND t.{b.SEQ} = s.{b.SEQ} WHEN NOT MATCHED THEN {self._insert(table, 'scd2')}")

    def _insert(self, table: TableSchema, mode: Mode) -> str:
        """``INSERT`` of the batch's columns only (a history table keeps columns the source dropped)."""
        cols = [quote_spark(f.name) for f in self._struct(table, mode).fields]
        return f"INSERT ({', '.join(cols)}) VALUES ({', '.join('s.' + c for c in cols)})"

    def _update(self, table: TableSchema, mode: Mode) -> str:
        cols = [quote_spark(f.name) for f in self._struct(table, mode).fields]
        return ", ".join(f"{c} = s.{c}" for c in cols)

    def _truncate(self, name: str, t: b.Event, live: str, assignments: str) -> None:
        at = f"TIMESTAMP '{t.ts.isoformat()}'"
        self.spark.sql(f"UPDATE {name} SET {assignments.format(ts=at)} WHERE {live} AND "
                       f"({b.LSN} < {t.lsn} OR ({b.LSN} = {t.lsn} AND {b.SEQ} < {t.seq}))")

    def _soft_delete(self, table: TableSchema, name: str, batch: b.SoftDeleteBatch) -> None:
        mark = f"{b.DELETED_AT} = s.{b.COMMIT_TS}, {b.COMMIT_TS} = s.{b.COMMIT_TS}, {b.LSN} = s.{b.LSN}, {b.SEQ} = s.{b.SEQ}"
        if len(batch.deletes):
            self._merge(self._events(table, batch.deletes),
                        f"MERGE INTO {name} t USING {{source}} s ON {self._on_key(table)} AND t.{b.DELETED_AT} IS NULL"
                        f" AND {written_before('t', 's')} WHEN MATCHED THEN UPDATE SET {mark}")
        if len(batch.rows):
            rows = batch.rows if isinstance(batch.rows, pa.Table) else list(batch.rows.values())
            self._merge(self._frame(table, "soft_delete", rows),
                        f"MERGE INTO {name} t USING {{source}} s ON {self._on_key(table)}"
                        f" WHEN MATCHED AND {written_before('t', 's')} THEN UPDATE SET {self._update(table, 'soft_delete')}"
                        f" WHEN NOT MATCHED THEN {self._insert(table, 'soft_delete')}")
        if (t := batch.truncate) is not None:
            self._truncate(name, t, f"{b.DELETED_AT} IS NULL", f"{b.DELETED_AT} = {{ts}}, {b.COMMIT_TS} = {{ts}},"
                           f" {b.LSN} = {t.lsn}, {b.SEQ} = {t.seq}")


def writer(target: Any) -> IcebergHistory:
    """The target's history writer (one per target, kept on it)."""
    found: IcebergHistory | None = getattr(target, "_history", None)
    if found is None:
        found = IcebergHistory(target)
        target._history = found
    return found
