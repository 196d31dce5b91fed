"""Small keyed batches applied to a copy-on-write Iceberg table on the driver: no Spark job.

A Spark MERGE costs about half a second of CPU whatever the batch's size (planning, a job of a few
stages, the JIT warming to it), and ten busy tables each wanting a batch a second are more than two
cores can give. A table small enough for copy-on-write (``write_mode``) is rewritten whole by
every MERGE of random keys anyway, so the driver does the same without Spark:

1. The current snapshot's data files (and position-delete files) from the Spark catalog's cached
   Java table (``planFiles``: py4j calls, no job), read with ``pyarrow.parquet``, columns taken by
   Iceberg field id (so a renamed column, or one added after a file was written, reads as Iceberg
   reads it), position deletes applied. The file this process wrote for the table's last batch is
   not read: its contents are kept (``WRITTEN``) and taken when the snapshot still names it.
2. The batch's rules, exactly ``merge.merge_statement``'s: a change replaces or deletes the row of
   its key only when written after it; a delete removes; a change of a key the table lacks inserts
   unless it deletes; a TOAST column the change left unchanged keeps the row's value; a TRUNCATE
   before the batch first removes the rows written before it. DuckDB joins the batch's keys to the
   rows' keys and evaluates the rules (``ducklake.plan``'s ``written_before_sql`` and
   ``left_unchanged_sql``) over keys, positions and row numbers only; every value is then taken
   (``take``) from the Arrow arrays it came in, so no value is converted on the way.
3. The new contents written as one Parquet file into the table's data folder (``files.copy_sink``'s
   ``FileSink``: Iceberg field ids, nested ones too), and one Iceberg commit through the Java API:
   an overwrite deleting every data file the read used and adding the new one, validated from the
   snapshot read (a concurrent commit adding or deleting rows fails it, and the batch is retried).
   Metrics come from the file's footer (``ParquetUtil.fileMetrics``, as ``files.register``).
   Position-delete files stay, as after Spark's copy-on-write MERGE (Iceberg 1.9's overwrite cannot
   remove them): they apply to no data file left (the new file's sequence number is higher), and
   maintenance removes them. A crash before the commit leaves an orphan file, which
   maintenance's ``remove_orphan_files`` deletes; after it, the replayed batch changes nothing, and
   a batch that changes nothing commits nothing.

Anything else keeps Spark's MERGE (``NotOnLane`` says why): merge-on-read, a partitioned table,
columns or types other than the row shape's, a floating-point key, a key change that left TOAST
columns unchanged (``_hr_from``), equality deletes or deletion vectors, a data file without field
ids, a location ``pyarrow.fs`` does not reach.

Measured on our shared 2-core machine (load 7-16 from other work), 100-change driver batches (60%
updates, 25% inserts, 15% deletes, random keys) into a 2,000-row table (``bench/iceberg_batch_cpu.py
--batches 100 --from 50``, then ``--spark-merge``): CPU a batch (driver + JVM, median by 20 batches)
1.13, 0.84, 0.64, 0.54, 0.51 s with Spark's MERGE (6 jobs a batch), 0.20, 0.16, 0.11, 0.08, 0.09 s
here (no job); batches 50-99 0.56 s and 0.66 s wall against 0.087 s and 0.17 s. Steps timed one by
one (batches 50-99 of another run): 19 ms of Python CPU (read
2 ms, rules 5 ms, write 3 ms) and ~90 ms of JVM CPU, of which the commit ~70 ms (manifests,
metadata file, footer metrics) and ``planFiles`` ~15 ms; 190 ms wall. At 69,000 rows: 44 ms Python,
~135 ms JVM, 236 ms wall. ``bench/freshness.py`` (10 busy tables, 874 changes/s, flush 1 s, 45 s,
warm-up 10 s), minutes apart on the same loaded machine (load 5-9): p99 2.46 and 2.15 s (p50 1.41,
1.29 s) against 16.3 s (p50 9.0 s) for the code before; with 200 idle tables 3.43 s (p50 2.05 s)
against 14.3 s (p50 8.0 s). (The code before: 5.5-6.5 s on a quiet machine, ``docs/benchmarks-history.md``.)

Reading the rows with pyiceberg (``StaticTable.from_metadata(...).scan().to_arrow()``) costs 9.5 ms
of CPU at 2,000 rows and 11.4 ms at 69,000 (100 and 30 snapshots), against 2-8 ms for pyarrow on the
files ``planFiles`` lists. But the commit needs the Java ``DataFile`` objects of the snapshot read, so
``planFiles`` runs either way, and pyiceberg would come on top; it also parses the metadata file
again each batch, which grows by a snapshot a batch until maintenance expires them.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from headrace.core.filesink import FIELD_ID, FileSink, WrittenFile
from headrace.core.lanes import NotOnLane
from headrace.core.names import quote_ident
from headrace.core.position import Position
from headrace.core.rows import HR_FROM, HR_LSN, HR_OP, HR_SEQ, HR_UNCHANGED, POSITION_COLUMNS, unchanged_token
from headrace.core.schema import TableSchema
from headrace.engines.driver.key_rows import KeyCache
from headrace.logs import event
from headrace.targets.ducklake.plan import left_unchanged_sql, written_before_sql
from headrace.targets.iceberg import files
from headrace.targets.iceberg.data_files import live_rows_mask, local_file, planned_files, same_values

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("headrace.targets.iceberg")

SUMMARY_PROPERTY = "headrace.apply"  # set to "driver" in the summary of every snapshot committed here
ROW_NUMBER = "_hr_row_number"  # the plan's row numbers (of the batch, of the table's rows)
_PRIMITIVES: dict[str, pa.DataType] = {
    "boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(), "float": pa.float32(), "double": pa.float64(),
    "date": pa.date32(), "string": pa.string(), "binary": pa.binary(),
}


@dataclass(frozen=True)
class DriverApplied:
    """What a batch applied on the driver did."""

    rows_before: int
    rows_after: int
    files_removed: int  # data files the commit removed
    committed: bool  # False: the batch changed nothing (a replay), so nothing was written


@dataclass(frozen=True)
class _Column:
    name: str
    field_id: int
    arrow: pa.DataType  # the row shape's type, Iceberg's field ids on nested fields
    # Not in the row shape: dropped in the source, kept in the table (``schema_changes.drop_column:
    # keep``). As the MERGE leaves it: a row's new version keeps its value, a new row has NULL.
    kept: bool = False


_local = threading.local()

# The contents of the last file each copy-on-write table was given here, by its location, so that
# table's next batch takes them instead of reading the file back (on an object store a HEAD and two
# ranged GETs at least, on disk a decode): a data file is never rewritten, and each kept one is
# exactly what was written, in the columns and types of its batch. All tables' together, in bytes.
WRITTEN_BYTES = 64 << 20


@dataclass(frozen=True)
class _Written:
    path: str  # the data file's location, as the commit named it
    rows: pa.Table  # its contents, in the schema of the batch that wrote it
    # The table's columns then, field ids included: a column dropped and added again under its name
    # has a new id, and the file's values are not its values (read back, it is NULL).
    columns: tuple[_Column, ...]

    @property
    def held_rows(self) -> int:
        return self.rows.num_rows


WRITTEN: KeyCache[_Written] = KeyCache(lambda kept: kept.rows.nbytes)


def connection() -> duckdb.DuckDBPyConnection:
    """This thread's in-memory DuckDB (apply workers apply several tables at once)."""
    con: duckdb.DuckDBPyConnection | None = getattr(_local, "con", None)
    if con is None:
        con = duckdb.connect(config={"threads": 1})  # the cores are shared with capture and Spark
        _local.con = con
    return con


def apply_on_driver(spark: SparkSession, iceberg: Any, table: TableSchema, changes: pa.Table,
                    truncate_before: Position | None, into: Any = None) -> DriverApplied:
    """Apply ``changes`` (a keyed batch in the row shape, as ``engines.driver.batch.batch_schema``) after the
    TRUNCATE before it, to the copy-on-write table ``iceberg`` (the Spark catalog's cached py4j
    ``Table``, ``catalog.java_table``), in one commit (``into``: into that transaction's view of it
    instead, ``cut_commit``). Raises ``NotOnLane`` before writing anything when the MERGE must do it."""
    if not table.key:
        raise NotOnLane("table without a key")  # a multiset delta: ``keyless``
    if HR_FROM in changes.column_names:
        raise NotOnLane("a key change left TOAST columns unchanged")
    if not iceberg.spec().isUnpartitioned():
        raise NotOnLane("partitioned table")
    jvm: Any = spark.sparkContext._jvm
    columns = table_columns(jvm, iceberg, table, changes.schema)
    schema = pa.schema([pa.field(c.name, c.arrow) for c in columns])
    sink = sink_for(iceberg, columns)
    snapshot = iceberg.currentSnapshot()
    data_files: list[Any] = []
    parts = []
    place = str(iceberg.location())
    kept = WRITTEN.take(place)
    if snapshot is not None:
        deletes_read: dict[str, pa.Table] = {}
        for data, deletes in planned_files(iceberg, int(snapshot.snapshotId())):
            data_files.append(data)
            if kept is not None and not deletes and kept.columns == tuple(columns) and str(data.location()) == kept.path:
                parts.append(kept.rows)
            else:
                parts.append(_read_data_file(data, deletes, columns, schema, deletes_read))
    current = pa.concat_tables(parts) if parts else schema.empty_table()
    rows_before = current.num_rows
    if truncate_before is not None:
        current = current.filter(pc.invert(_written_before(current, truncate_before)))
    shaped = [pa.field(c.name, c.arrow) for c in columns if not c.kept]
    batch = changes.select([f.name for f in shaped] + [HR_OP, HR_UNCHANGED]).cast(
        pa.schema([*shaped, pa.field(HR_OP, pa.string()), pa.field(HR_UNCHANGED, pa.string())]))
    after, changed = _merged(table, current, batch, columns)
    if not changed and after.num_rows == rows_before:
        if kept is not None:
            WRITTEN.put(place, kept, WRITTEN_BYTES)  # the table is as it was
        return DriverApplied(rows_before, rows_before, 0, committed=False)
    written = sink.write(after, f"{uuid.uuid4().hex}-driver") if after.num_rows else None
    _commit(jvm, iceberg, snapshot, data_files, written, into)
    if written is not None and after.nbytes <= WRITTEN_BYTES:
        WRITTEN.put(place, _Written(written.path, after, tuple(columns)), WRITTEN_BYTES)
    return DriverApplied(rows_before, after.num_rows, len(data_files), committed=True)


def table_columns(jvm: Any, iceberg: Any, table: TableSchema, batch: pa.Schema) -> list[_Column]:
    """The table's columns in its order, with field ids (one py4j call: the schema as JSON): every
    column of the row shape, in the batch's type, and any kept besides (``_Column.kept``)."""
    fields = json.loads(str(files.java_files(jvm).schema_parser.toJson(iceberg.schema())))["fields"]
    shape = [*table.column_names, *POSITION_COLUMNS]
    missing = set(shape) - {f["name"] for f in fields}
    if missing:
        raise NotOnLane(f"columns {sorted(missing)} missing in the table")
    out = []
    for field in fields:
        name, kept = field["name"], field["name"] not in shape
        arrow = iceberg_arrow_type(field["type"])
        if arrow is None or not (kept or arrow == batch.field(name).type):
            raise NotOnLane(f"column {name}: Iceberg type {field['type']} is not the batch's")
        if name in table.key and pa.types.is_floating(arrow):
            raise NotOnLane("floating-point key")  # the MERGE's = on NaN and -0.0 is Spark's own
        out.append(_Column(name, int(field["id"]), arrow, kept))
    return out


def iceberg_arrow_type(iceberg_type: Any) -> pa.DataType | None:
    """The row shape's Arrow type (``arrow_frame.spark_arrow_type``) of Iceberg type ``iceberg_type``
    (schema JSON), with the field ids of list elements; None for a type the row shape has not."""
    if isinstance(iceberg_type, dict):
        element = iceberg_arrow_type(iceberg_type["element"]) if iceberg_type.get("type") == "list" else None
        if element is None:
            return None
        return pa.list_(pa.field("element", element, nullable=not iceberg_type["element-required"],
                                 metadata={FIELD_ID: str(iceberg_type["element-id"]).encode()}))
    if iceberg_type in ("timestamp", "timestamptz"):
        return pa.timestamp("us", tz="UTC" if iceberg_type == "timestamptz" else None)
    if iceberg_type.startswith("decimal("):
        precision, scale = (int(n) for n in iceberg_type[len("decimal("):-1].split(","))
        return pa.decimal128(precision, scale)
    return _PRIMITIVES.get(iceberg_type)


def sink_for(iceberg: Any, columns: list[_Column]) -> FileSink:
    """Where the new contents go: the table's data folder, as ``files.copy_sink`` finds it (the table's
    location provider and codec), with every column's field id (kept columns too, in any order)."""
    sink = files.table_sink(iceberg, {c.name: c.field_id for c in columns})
    if sink is None:
        raise NotOnLane("table folder out of pyarrow.fs's reach")
    return sink


def _read_data_file(data: Any, deletes: list[Any], columns: list[_Column], schema: pa.Schema,
                    deletes_read: dict[str, pa.Table]) -> pa.Table:
    """Data file ``data``'s rows in ``schema`` (columns by field id; one the file lacks is NULL, as
    Iceberg reads it), without the rows its position ``deletes`` remove."""
    location = str(data.location())
    if str(data.format()) != "PARQUET":
        raise NotOnLane(f"a {data.format()} data file")
    filesystem, path = local_file(location)
    read = pq.read_table(path, filesystem=filesystem)
    by_id = {int(f.metadata[FIELD_ID]): i for i, f in enumerate(read.schema) if f.metadata and FIELD_ID in f.metadata}
    if not by_id:
        raise NotOnLane("a data file without field ids")
    arrays = []
    for column in columns:
        at = by_id.get(column.field_id)
        if at is None:
            arrays.append(pa.nulls(read.num_rows, column.arrow))
            continue
        values = read.column(at)
        if not same_values(values.type, column.arrow):
            raise NotOnLane(f"column {column.name}: {values.type} in a data file")
        arrays.append(values.cast(column.arrow))
    rows = pa.Table.from_arrays(arrays, schema=schema)
    keep = live_rows_mask(rows.num_rows, location, deletes, deletes_read)
    return rows if keep is None else rows.filter(pa.array(keep))


def _written_before(rows: pa.Table, position: Position) -> pa.ChunkedArray:
    """Which ``rows`` were written before ``position``."""
    lsn, seq = rows.column(HR_LSN), rows.column(HR_SEQ)
    return pc.or_(pc.less(lsn, position.lsn), pc.and_(pc.equal(lsn, position.lsn), pc.less(seq, position.seq)))


def _merged(table: TableSchema, current: pa.Table, batch: pa.Table, columns: list[_Column]) -> tuple[pa.Table, bool]:
    """The table's rows after ``batch`` (``merge_statement``'s rules, module docstring), and whether any
    row was removed or written. The kept rows come first, in their order, then the batch's rows."""
    keys = list(table.key)
    tokens = {t for text in pc.unique(batch.column(HR_UNCHANGED)).to_pylist() if text for t in text.split(",")}
    toast = [c for c in table.column_names if c not in keys and unchanged_token(c) in tokens]
    rows_in = current.select([*keys, HR_LSN, HR_SEQ]).append_column(ROW_NUMBER, pa.array(np.arange(current.num_rows)))
    batch_in = batch.select([*keys, HR_LSN, HR_SEQ, HR_OP, HR_UNCHANGED]).append_column(
        ROW_NUMBER, pa.array(np.arange(batch.num_rows)))
    flags = "".join(f", {left_unchanged_sql('b', c)} AS u{i}" for i, c in enumerate(toast))
    plan = plan_join(keys, rows_in, batch_in, f"o.{ROW_NUMBER} AS t_row", flags)
    matched = pc.is_valid(plan.column("t_row"))
    older = plan.column("older")
    replaced = pc.filter(plan.column("t_row"), pc.and_(matched, older)).to_numpy().astype(np.int64)
    written = pc.and_(pc.invert(plan.column("deletes")), pc.or_(pc.invert(matched), older))
    new_b = pc.filter(plan.column("b_row"), written).to_numpy().astype(np.int64)
    new_t = pc.filter(plan.column("t_row"), written).fill_null(-1).to_numpy().astype(np.int64)
    keep = np.ones(current.num_rows, dtype=bool)
    keep[replaced] = False
    kept = np.flatnonzero(keep)
    n = current.num_rows
    arrays = []
    for column in columns:
        if column.kept:  # a row's new version keeps the row's value; a new row has none (NULL)
            rows = np.concatenate([kept, new_t])
            arrays.append(current.column(column.name).take(pa.array(rows, pa.int64(), mask=rows < 0)))
            continue
        from_batch = n + new_b
        if column.name in toast:
            # The row's value where the change left the column unchanged and the table has the row.
            unchanged = pc.filter(plan.column(f"u{toast.index(column.name)}"), written).to_numpy(zero_copy_only=False)
            from_batch = np.where(unchanged & (new_t >= 0), new_t, from_batch)
        values = pa.chunked_array([*current.column(column.name).chunks, *batch.column(column.name).chunks],
                                  type=column.arrow)
        arrays.append(values.take(pa.array(np.concatenate([kept, from_batch]), pa.int64())))
    after = pa.Table.from_arrays(arrays, schema=pa.schema([pa.field(c.name, c.arrow) for c in columns]))
    return after, bool(len(replaced) or len(new_b))


def plan_join(keys: list[str], rows: pa.Table, batch: pa.Table, row_columns: str, extra: str = "") -> pa.Table:
    """The MERGE's join in DuckDB: each ``batch`` row (``b_row``: its ``ROW_NUMBER``) with the row of ``rows``
    holding its key (``row_columns``: what of it to return, as SQL over ``o``), whether that row was
    written before the change (``older``) and whether the change deletes (``deletes``); ``extra``: more
    of the SELECT list."""
    on = " AND ".join(f"o.{quote_ident(k)} = b.{quote_ident(k)}" for k in keys)
    con = connection()
    con.register("hr_rows", rows)
    con.register("hr_batch", batch)
    try:
        result = con.execute(
            f"SELECT b.{ROW_NUMBER} AS b_row, {row_columns}, coalesce({written_before_sql('o', 'b')}, false) AS older,"
            f" b.{HR_OP} = 'D' AS deletes{extra} FROM hr_batch b LEFT JOIN hr_rows o ON {on}").arrow()
        return result if isinstance(result, pa.Table) else result.read_all()
    finally:
        con.unregister("hr_rows")
        con.unregister("hr_batch")


def _commit(jvm: Any, iceberg: Any, snapshot: Any, data_files: list[Any], written: WrittenFile | None,
            into: Any = None) -> None:
    """One overwrite (committed into ``into``: a transaction of ``iceberg``, or by default ``iceberg``): ``data_files`` out,
    ``written`` in, validated from ``snapshot`` (None: the table had none, so any data committed since
    conflicts)."""
    java = files.java_files(jvm)
    overwrite = (iceberg if into is None else into).newOverwrite()
    for data in data_files:
        overwrite.deleteFile(data)
    if written is not None:
        overwrite.addFile(files.data_file(java, iceberg, java.metrics_config.forTable(iceberg), written))
    if snapshot is not None:
        overwrite.validateFromSnapshot(snapshot.snapshotId())
    overwrite.conflictDetectionFilter(java.always_true)
    overwrite.validateNoConflictingData()
    overwrite.validateNoConflictingDeletes()
    overwrite.set(SUMMARY_PROPERTY, "driver")
    overwrite.commit()


class ApplyLanes:
    """Which lane applied each keyed Arrow batch: ``counts`` by lane ("driver", or "merge": Spark's
    MERGE), and an ``iceberg.apply_lane`` event when a table's lane changes (its first batch included),
    with the reason a batch went to the MERGE (one event per change of lane, not one per batch)."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self._last: dict[str, str] = {}
        self._lock = threading.Lock()

    def took(self, table: str, lane: str, reason: str | None = None) -> None:
        """Count a batch of ``table`` applied by ``lane`` (``reason``: why not on the driver)."""
        with self._lock:
            self.counts[lane] += 1
            changed = self._last.get(table) != lane
            self._last[table] = lane
        if changed:
            event(log, "iceberg.apply_lane", table=table, lane=lane, reason=reason or "")
