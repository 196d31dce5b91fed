"""Keyed batches applied to a merge-on-read Iceberg table on the driver: a position-delete file and a
data file in one commit, no Spark job.

A table past copy-on-write's size (``write_mode``) had every batch applied by Spark's MERGE, and on
2 cores shared with the source that MERGE is what fell behind: under pgbench at full speed the
1M-row ``pgbench_accounts`` took 68-91 s a batch (``docs/benchmarks-history.md``), and a burst into a 10M-row
table cost 1.77x the same burst into 1M rows. What a merge-on-read MERGE writes needs only the
table's keys and positions: which rows the batch replaces (their file and row number) and which of
the batch's rows are new versions. So the driver:

1. Finds the table's keys: which file and row number holds each live key, and its ``_hr_lsn``/``_hr_seq``
   (``KeyIndex``). A table of up to ``max_rows`` rows (``driver_key_rows``) is read whole once (the current snapshot's data
   files and their delete files from ``data_files.planned_files``, py4j, no job; only those columns,
   by field id; rows position deletes removed left out), and the index is kept between batches:
   each commit made here carries it forward (the replaced rows out, the new file's rows in), so the
   next batch reads no file at all, and any other commit (a compaction, another writer) makes it
   stale and it is read again. A larger table is read for each batch, only the files in the batch's
   key range (an integer key: Iceberg's column metrics), cut to the batch's keys as they are read,
   when those files hold at most ``max_rows`` rows (a batch of recent keys into a table laid out by
   key: any table size); a range spanning more goes to the MERGE.
2. Runs the MERGE's rules in DuckDB over keys, positions and row numbers (``ducklake.plan``'s
   ``written_before_sql``, as ``driver_apply``): a change replaces or deletes the row of its key
   only when written after it; a delete removes; a change of a key the table lacks inserts unless
   it deletes.
3. Writes the replaced rows' (file, row number) pairs as one position-delete file (Iceberg's
   reserved field ids, sorted by file and position, as the spec asks) and the batch's new versions
   as one data file, both in the table's data folder, and commits them in one ``RowDelta`` validated
   from the snapshot read: a data file added since, a delete file added since, or a data file the
   deletes point at removed since (a compaction) fails the commit before anything is visible, and
   the batch is retried. A crash before the commit leaves orphan files (maintenance removes them);
   a replay after it changes nothing, and a batch that changes nothing commits nothing.

Measured (``bench/table_size.py --targets iceberg --sizes 1000000,10000000 --repeat 3``, a 25K-change
burst of random keys, load 4.3 from other work): the burst's apply took 0.44-0.58 s into 1M rows and
0.42-0.50 s into 10M (0.83x), against 2.57 / 4.66 s (1.8x) reading the keys for every batch and 2.90
/ 4.81 s by Spark's MERGE (midday, quiet); the first batch after start reads the 10M keys (2.7 s).

Values never pass through anything but Arrow: the new versions are the batch's own rows.
Anything else keeps Spark's MERGE (``NotOnLane`` says why): a TRUNCATE before the batch, TOAST
columns left unchanged (the new version takes the row's value, which step 1 does not read), a
column kept after the source dropped it (the same), a key change with TOAST (``_hr_from``), a
partitioned table, a batch whose key range spans more than ``max_rows`` rows of a table larger than
that (the keys are held in memory), and whatever ``driver_apply`` refuses (types, files, locations).
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from headrace.core.filesink import FIELD_ID, WrittenFile
from headrace.core.lanes import NotOnLane
from headrace.core.position import Position
from headrace.core.rows import HR_FROM, HR_LSN, HR_OP, HR_SEQ, leaves_unchanged
from headrace.core.schema import TableSchema
from headrace.engines.driver.key_rows import IDX, KeyCache, KeyRows
from headrace.targets.iceberg import files, write_mode
from headrace.targets.iceberg.data_files import live_rows_mask, local_file, planned_files, same_values
from headrace.targets.iceberg.driver_apply import (
    ROW_NUMBER,
    SUMMARY_PROPERTY,
    DriverApplied,
    plan_join,
    sink_for,
    table_columns,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Iceberg's reserved field ids of a position-delete file's columns (the table spec, "Position Delete Files").
DELETE_FILE_PATH_ID = 2147483546
DELETE_POS_ID = 2147483545
DELETE_SCHEMA = pa.schema([
    pa.field("file_path", pa.string(), nullable=False), pa.field("pos", pa.int64(), nullable=False),
])
_FILE = "_hr_file"  # which data file of the plan a row is in (index into the files read)
_POS = "_hr_pos"  # its row number there
_INTEGERS = ("int", "long")
READ_THREADS = 8  # data files whose keys ``_read_index`` reads at once


def apply_delta_on_driver(spark: SparkSession, iceberg: Any, table: TableSchema, changes: pa.Table,
                          truncate_before: Position | None, max_rows: int, into: Any = None) -> DriverApplied:
    """Apply ``changes`` (a keyed batch in the row shape, as ``engines.driver.batch.batch_schema``) to the
    merge-on-read table ``iceberg`` (the Spark catalog's cached py4j ``Table``) in one commit (``into``:
    into that transaction's view of it instead, ``cut_commit``), holding at most ``max_rows`` keys
    (``IcebergConfig.driver_key_rows``). Raises ``NotOnLane`` before writing anything when the MERGE
    must do it."""
    refusal = _refusal(table, changes, truncate_before)
    if refusal:
        raise NotOnLane(refusal)
    if not iceberg.spec().isUnpartitioned():
        raise NotOnLane("partitioned table")
    live = write_mode.live_rows(iceberg) or 0
    jvm: Any = spark.sparkContext._jvm
    columns = table_columns(jvm, iceberg, table, changes.schema)
    if any(c.kept for c in columns):
        raise NotOnLane("a column kept after the source dropped it")
    sink = sink_for(iceberg, columns)
    shape = pa.schema([pa.field(c.name, c.arrow) for c in columns])
    batch = changes.select([*shape.names, HR_OP]).cast(pa.schema([*shape, pa.field(HR_OP, pa.string())]))
    by_name = {c.name: c for c in columns}
    wanted = [by_name[name] for name in (*table.key, HR_LSN, HR_SEQ)]
    snapshot = iceberg.currentSnapshot()
    snapshot_id = None if snapshot is None else int(snapshot.snapshotId())
    place = str(iceberg.location())
    batch_keys = batch.column(table.key[0]).combine_chunks() if len(table.key) == 1 else None
    index = KEY_INDEXES.take(place)
    if index is None or index.snapshot_id != snapshot_id:  # any other commit (a compaction, another writer's)
        index = _read_index(jvm, table, iceberg, snapshot_id, wanted, batch, batch_keys, live, max_rows)
    replaced, new_rows = _plan(table, index.candidates(batch_keys), batch)
    if not replaced.num_rows and not len(new_rows):
        if index.whole:
            KEY_INDEXES.put(place, index, max_rows)
        return DriverApplied(live, live, 0, committed=False)
    stem = uuid.uuid4().hex
    added = batch.take(pa.array(new_rows, pa.int64()))
    written = sink.write(added.select(shape.names), f"{stem}-driver") if len(new_rows) else None
    deletes_written = None
    if replaced.num_rows:
        delete_sink = files.table_sink(iceberg, {"file_path": DELETE_FILE_PATH_ID, "pos": DELETE_POS_ID})
        assert delete_sink is not None  # the same folder ``sink_for`` reached
        file_paths = pa.array(index.locations, pa.string()).take(replaced.column(_FILE))
        deletes = pa.Table.from_arrays([file_paths, replaced.column(_POS)], schema=DELETE_SCHEMA)
        deletes_written = delete_sink.write(deletes.sort_by([("file_path", "ascending"), ("pos", "ascending")]),
                                            f"{stem}-deletes")
    referenced = sorted({index.locations[i] for i in replaced.column(_FILE).to_pylist()})
    # Out of the cache (``take``) until the commit is known to follow the snapshot it was read at.
    into = iceberg if into is None else into
    location = _commit(jvm, iceberg, snapshot, written, deletes_written, referenced, into)
    committed = into.currentSnapshot()  # in a transaction: the snapshot it will commit
    if index.whole and committed is not None and _parent(committed) == snapshot_id:
        index.advance(int(committed.snapshotId()), replaced.column(IDX).to_numpy(),
                      added.select([c.name for c in wanted]), location)
        KEY_INDEXES.put(place, index, max_rows)
    return DriverApplied(live, live - replaced.num_rows + len(new_rows), 0, committed=True)


def _parent(snapshot: Any) -> int | None:
    parent = snapshot.parentId()
    return None if parent is None else int(parent)


@dataclass
class KeyIndex:
    """A table's keys and positions at one snapshot, with each row's file and row number
    (``engines.driver.key_rows``): every live row (``whole``: kept between batches and carried forward by each
    commit made here, so a batch reads no file), or only the rows of one batch's keys (a table over
    the budget)."""

    snapshot_id: int | None
    locations: list[str]  # the data files ``_FILE`` numbers
    keys: KeyRows  # the key columns, ``_hr_lsn``, ``_hr_seq``, ``_FILE``, ``_POS``
    whole: bool

    @property
    def held_rows(self) -> int:
        return self.keys.rows.num_rows

    def candidates(self, batch_keys: pa.Array | None) -> pa.Table:
        """The live rows a batch of ``batch_keys`` (None: a key of several columns) can match, with
        their row numbers here (``IDX``)."""
        return self.keys.candidates(batch_keys if self.whole else None)

    def advance(self, snapshot_id: int, removed: np.ndarray, added: pa.Table, location: str | None) -> None:
        """Carry the index to ``snapshot_id``: the rows at ``removed`` (``IDX``) deleted, ``added`` (key
        and position columns, in file order) written as file ``location``."""
        if location is None:
            added = self.keys.rows.schema.empty_table()
        else:
            self.locations.append(location)
            n = added.num_rows
            added = (added.append_column(_FILE, pa.array(np.full(n, len(self.locations) - 1, dtype=np.int32)))
                     .append_column(_POS, pa.array(np.arange(n, dtype=np.int64))))
        self.keys.update(removed, added)
        self.snapshot_id = snapshot_id


KEY_INDEXES: KeyCache[KeyIndex] = KeyCache()


def _read_index(jvm: Any, table: TableSchema, iceberg: Any, snapshot_id: int | None, wanted: list[Any],
                batch: pa.Table, batch_keys: pa.Array | None, live: int, max_rows: int) -> KeyIndex:
    """The table's ``KeyIndex`` at ``snapshot_id`` read from its files: every live row when there are
    at most ``max_rows``, else only the files in the batch's key range (an integer key: Iceberg's
    column metrics) cut to the batch's keys as they are read (one key column: pyarrow's ``is_in``),
    ``NotOnLane`` when those hold more than ``max_rows`` rows."""
    whole = live <= max_rows
    locations: list[str] = []
    parts: list[pa.Table] = []
    if snapshot_id is not None:
        deletes_read: dict[str, pa.Table] = {}
        row_filter = None if whole else _key_range(jvm, table, iceberg, batch)
        planned = list(planned_files(iceberg, snapshot_id, row_filter))
        spanned = 0 if whole else sum(int(data.recordCount()) for data, _deletes in planned)
        if spanned > max_rows:
            raise NotOnLane(f"the batch's key range spans files of {spanned} rows (of {live}): more keys than"
                              f" target.iceberg.driver_key_rows ({max_rows}) to read on the driver")
        locations = [str(data.location()) for data, _deletes in planned]

        def read(i: int) -> pa.Table:
            data, deletes = planned[i]
            return _read_keys(data, deletes, wanted, i, deletes_read, None if whole else batch_keys)

        if len(planned) < 2:
            parts = [read(i) for i in range(len(planned))]
        else:  # side by side: on an object store each file is round trips, and decoding releases the GIL
            with ThreadPoolExecutor(min(READ_THREADS, len(planned)), thread_name_prefix="iceberg-keys") as pool:
                parts = list(pool.map(read, range(len(planned))))
    schema = pa.schema([*(pa.field(c.name, c.arrow) for c in wanted), pa.field(_FILE, pa.int32()),
                        pa.field(_POS, pa.int64())])
    rows = pa.concat_tables(parts) if parts else schema.empty_table()  # a chunk a file: ``KeyIndex`` keeps them
    return KeyIndex(snapshot_id, locations, KeyRows(rows, sort=whole), whole)


def _refusal(table: TableSchema, changes: pa.Table, truncate_before: Position | None) -> str | None:
    """Why the batch goes to the MERGE whatever the table (module docstring), or None."""
    if not table.key:
        return "table without a key"  # a multiset delta: ``keyless``
    if HR_FROM in changes.column_names:
        return "a key change left TOAST columns unchanged"
    if truncate_before is not None:
        return "a TRUNCATE before the batch"
    if leaves_unchanged(changes):
        return "TOAST columns left unchanged"
    return None


def _key_range(jvm: Any, table: TableSchema, iceberg: Any, batch: pa.Table) -> Any:
    """An Iceberg filter on the batch's key range when the key is one integer column (files whose
    metrics lie outside it cannot hold a row of the batch); else None (every file)."""
    if len(table.key) != 1:
        return None
    key = table.key[0]
    if str(iceberg.schema().findType(key).toString()) not in _INTEGERS:
        return None
    bounds = pc.min_max(batch.column(key))
    low, high = bounds["min"], bounds["max"]
    if not low.is_valid:
        return None
    expressions = jvm.org.apache.iceberg.expressions.Expressions
    both = getattr(expressions, "and")  # Expressions.and: a Python keyword
    return both(expressions.greaterThanOrEqual(key, low.as_py()), expressions.lessThanOrEqual(key, high.as_py()))


def _read_keys(data: Any, deletes: list[Any], wanted: list[Any], index: int,
               deletes_read: dict[str, pa.Table], batch_keys: pa.Array | None = None) -> pa.Table:
    """The ``wanted`` columns (by field id) of data file ``data``'s live rows, with ``_FILE`` (``index``)
    and ``_POS`` (the row number in the file); with ``batch_keys`` only the rows whose key (the first
    wanted column) is one of them."""
    location = str(data.location())
    if str(data.format()) != "PARQUET":
        raise NotOnLane(f"a {data.format()} data file")
    filesystem, path = local_file(location)
    with filesystem.open_input_file(path) as source:
        parquet = pq.ParquetFile(source)
        by_id = {int(f.metadata[FIELD_ID]): f.name for f in parquet.schema_arrow
                 if f.metadata and FIELD_ID in f.metadata}
        names = [by_id.get(c.field_id) for c in wanted]
        if None in names:
            raise NotOnLane(f"a data file without the key's or the positions' field ids ({location})")
        read = parquet.read(columns=names)
    arrays = []
    for column, values in zip(wanted, read.columns, strict=True):
        if not same_values(values.type, column.arrow):
            raise NotOnLane(f"column {column.name}: {values.type} in a data file")
        arrays.append(values.cast(column.arrow))
    n = read.num_rows
    arrays += [pa.array(np.full(n, index, dtype=np.int32)), pa.array(np.arange(n, dtype=np.int64))]
    rows = pa.Table.from_arrays(arrays, names=[*(c.name for c in wanted), _FILE, _POS])
    keep = live_rows_mask(n, location, deletes, deletes_read)
    if batch_keys is not None:
        ours = pc.is_in(rows.column(0), value_set=batch_keys).to_numpy(zero_copy_only=False)
        keep = ours if keep is None else keep & ours
    return rows if keep is None else rows.filter(pa.array(keep))


def _plan(table: TableSchema, current: pa.Table, batch: pa.Table) -> tuple[pa.Table, np.ndarray]:
    """The rows the batch replaces or deletes (``_FILE``, ``_POS``, ``IDX``) and the batch's row numbers to write
    (``merge_statement``'s rules)."""
    keys = list(table.key)
    batch_in = batch.select([*keys, HR_LSN, HR_SEQ, HR_OP]).append_column(
        ROW_NUMBER, pa.array(np.arange(batch.num_rows, dtype=np.int64)))
    plan = plan_join(keys, current, batch_in, f"o.{_FILE} AS t_file, o.{_POS} AS t_pos, o.{IDX} AS t_idx")
    matched = pc.is_valid(plan.column("t_file"))
    older = plan.column("older")
    replaced = plan.filter(pc.and_(matched, older)).select(["t_file", "t_pos", "t_idx"]).rename_columns(
        [_FILE, _POS, IDX])
    written = pc.and_(pc.invert(plan.column("deletes")), pc.or_(pc.invert(matched), older))
    new_rows = pc.filter(plan.column("b_row"), written).to_numpy().astype(np.int64)
    return replaced, new_rows


def _commit(jvm: Any, iceberg: Any, snapshot: Any, written: WrittenFile | None,
            deletes: WrittenFile | None, referenced: list[str], into: Any = None) -> str | None:
    """One ``RowDelta`` (committed into ``into``: a transaction of ``iceberg``, or by default ``iceberg``): ``written`` added, ``deletes`` (position deletes into the ``referenced`` data
    files) added, validated from ``snapshot`` (module docstring). Returns the added data file's location
    as the table names it (``file:/...`` for a local path): what later deletes must name."""
    java = files.java_files(jvm)
    delta = (iceberg if into is None else into).newRowDelta()
    location = None
    if written is not None:
        added = files.data_file(java, iceberg, java.metrics_config.forTable(iceberg), written)
        location = str(added.location())
        delta.addRows(added)
    if deletes is not None:
        source = iceberg.io().newInputFile(deletes.path)
        metrics = java.parquet_util.fileMetrics(source, java.metrics_config.forPositionDelete(iceberg))
        delta.addDeletes(java.file_metadata.deleteFileBuilder(iceberg.spec()).ofPositionDeletes()
                         .withPath(deletes.path).withFormat("parquet").withFileSizeInBytes(deletes.bytes)
                         .withRecordCount(deletes.rows).withMetrics(metrics).build())
        paths = jvm.java.util.ArrayList()
        for path in referenced:
            paths.add(path)
        delta.validateDataFilesExist(paths)
        delta.validateDeletedFiles()
    if snapshot is not None:
        delta.validateFromSnapshot(snapshot.snapshotId())
    delta.conflictDetectionFilter(java.always_true)
    delta.validateNoConflictingDataFiles()
    delta.validateNoConflictingDeleteFiles()
    delta.set(SUMMARY_PROPERTY, "driver")
    delta.commit()
    return location
