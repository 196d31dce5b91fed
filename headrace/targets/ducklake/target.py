"""DuckLake target: Spark writes the initial copy as Parquet, change batches apply in DuckDB.

Every write to a table and its cursor row (``_headrace.cursor`` in the lake) commits in one
DuckLake transaction, so after a crash the data and the cursor always agree.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa

from headrace.core.filesink import FileSink, WrittenFile, open_folder
from headrace.core.interfaces import CutCommit, Target
from headrace.core.lanes import Lane, LaneChoice
from headrace.core.maintenance import MaintenancePolicy, TableFiles
from headrace.core.names import TableName, quote_ident
from headrace.core.position import Position
from headrace.core.rows import HR_COMMIT_TS, HR_LSN, HR_SEQ
from headrace.core.schema import SchemaChange, TableSchema
from headrace.engines.driver.keyless import net_row_changes
from headrace.engines.spark.casts import text_value_frame
from headrace.logs import event
from headrace.targets.ducklake import batches, extension, files, maintenance, naming, plan
from headrace.targets.ducklake.batches import ChangeWrite
from headrace.targets.ducklake.config import DuckLakeConfig
from headrace.targets.ducklake.copies import CopyWrite
from headrace.targets.ducklake.evolve import evolve_columns, rename_table, shape_matches
from headrace.targets.ducklake.group import GroupQueue, write_through
from headrace.targets.ducklake.inlining import Inlined
from headrace.targets.ducklake.kept_keys import KeptKeys, StaleKeys
from headrace.targets.ducklake.types import cast_out, registers_directly

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from headrace.history.writer import HistoryWriter

L = extension.LAKE_ALIAS
CURSOR_TABLE = f"{L}._headrace.cursor"  # its own schema: cannot collide with replicated tables
SNAPSHOT_ROWS = "hr_snapshot_rows"  # what DuckDB calls a driver-side copy's Arrow rows
log = logging.getLogger(__name__)


# Every batch commits in DuckDB on the driver, whichever lane built it: the lake's one writer.
APPLIED_IN_DUCKDB = LaneChoice(Lane.DRIVER, "ducklake", "DuckLake commits in DuckDB on the driver")

class DuckLakeTarget(Target):
    """Keeps tables of one DuckLake in sync; see the module docstring."""

    name = "ducklake"
    keeps_infinity = True  # DuckDB has infinite dates and timestamps
    applies_arrow = True  # batches commit in DuckDB: rows built on the driver need no Spark
    copies_arrow = True  # so do small copies (``write_snapshot_arrow``)
    stores_cursor = True
    # The driver path is 5-7x faster than Spark at 50,000-200,000 staged rows too (both commit in DuckDB on
    # the driver; Spark's JSON parsing, window and collect are the difference); 200,000 staged rows are
    # ~40 MiB of Arrow per apply worker in the backlog bench.
    caps_batches = True
    commits_across_tables = True  # one DuckLake transaction spans tables (``cut``)
    # One writer commits one group of batches at a time (``group``): a second batch built beside the commit
    # keeps it busy, and more only wait longer. bench/freshness.py, 10 busy tables, 848 changes/s, 60 s,
    # idle machine (2026-11-28): p50 / p99 0.54-0.56 / 0.94-1.00 s at 2, 0.61 / 0.99 s at 3, 0.63 / 1.06 s
    # at 4, 0.84 / 1.16 s at 10, 0.60 / 1.42 s at 1.
    apply_concurrency = 2

    def __init__(self, spark: SparkSession, settings: DuckLakeConfig, pipeline: str) -> None:
        self.spark = spark
        self.settings = settings
        self.pipeline = pipeline
        self._con = extension.connect(settings)
        # One DuckDB connection, used by one apply at a time: DuckLake would turn concurrent
        # commits of the cursor table into conflicts anyway.
        self._lock = threading.Lock()
        self._copies: GroupQueue[CopyWrite, int] = GroupQueue()  # copies written on the driver, waiting for a commit
        self._batches: GroupQueue[ChangeWrite, None] = GroupQueue()  # change batches waiting for a commit
        self._keys = KeptKeys(L, settings.driver_key_rows)  # large tables' keys between batches
        self._inlined = Inlined(settings.inline_rows)  # small batches' rows in the catalog, flushed in bulk
        self._kept: dict[tuple[str, tuple[str, ...]], list[str]] = {}  # (target, source columns) -> kept columns
        self._copy_files: dict[str, int] = {}  # target -> files its copy registered so far (``copy_finished``)
        self._appended = 0  # cursor rows appended since the last prune (``batches.PRUNE_ROWS``)
        self._one_thread = False  # the connection runs on one DuckDB thread (``_threads``)
        self._cut = threading.local()  # .writes: the batches of this thread's open cut (``cut``)
        self._con.execute(f"CREATE SCHEMA IF NOT EXISTS {L}._headrace")
        self._con.execute(
            f"CREATE TABLE IF NOT EXISTS {CURSOR_TABLE} (pipeline VARCHAR, table_oid BIGINT, "
            "log_offset BIGINT, updated_at TIMESTAMPTZ)"
        )

    # -- names -------------------------------------------------------------------------------
    def _schema(self, table: TableSchema) -> str:
        return self.settings.schema_ or table.target_schema

    def _qualified(self, table: TableSchema) -> str:
        return f"{L}.{quote_ident(self._schema(table))}.{quote_ident(table.target_table)}"

    # -- Target ------------------------------------------------------------------------------
    def ensure_table(self, table: TableSchema) -> str:
        """Create the schema and table (source columns + position columns) if missing."""
        naming.refuse_case_twins(table)
        with self._lock:
            naming.refuse_table_twin(self._con, L, self._schema(table), table)
            self._con.execute(f"CREATE SCHEMA IF NOT EXISTS {L}.{quote_ident(self._schema(table))}")
            self._con.execute(plan.create_sql(self._qualified(table), table)
                              .replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS", 1))
        return str(TableName(self._schema(table), table.target_table))

    def write_snapshot(self, table: TableSchema, rows: DataFrame, position: Position, replace: bool = True) -> int:
        """Spark writes Parquet under the data path; one DuckLake transaction swaps (or adds) it in
        (``register_copy_files``)."""
        self.ensure_table(table)
        folder = self._attempt_folder(table, replace)
        files.write_parquet(self.spark, table, rows, folder)
        with self._lock:
            written = [r[0] for r in self._con.execute("SELECT file FROM glob(?)", [f"{folder}/*.parquet"]).fetchall()]
        return self._register(table, written, replace, discard=[folder])

    def copy_sink(self, table: TableSchema, replace: bool) -> FileSink | None:
        """A new attempt folder for every part of one copy; None where ``pyarrow.fs`` cannot reach it."""
        folder = self._attempt_folder(table, replace)
        opened = open_folder(folder)
        return FileSink(folder, *opened) if opened is not None else None

    def register_copy_files(self, table: TableSchema, sink: FileSink, written: list[WrittenFile],
                            replace: bool) -> int:
        """Register a copy's files as ``write_snapshot`` does Spark's (discarding these files only: the
        folder is the whole copy's, its next files may be under way); the rows the table then holds."""
        return self._register(table, [w.path for w in written], replace, discard=[w.path for w in written])

    def _attempt_folder(self, table: TableSchema, first: bool) -> str:
        """A new folder for a copy's files; at its ``first`` part (only: a copy's own folder is one until
        its first commit), earlier attempts' unregistered folders go."""
        root = files.snapshot_root(self.settings.data_path, self._schema(table), table.target_table)
        if first:
            files.remove_unregistered_attempts(self._con, self._lock, L, root)
        return f"{root}/{uuid.uuid4().hex}"

    def _register(self, table: TableSchema, written: list[str], replace: bool, discard: list[str]) -> int:
        """One DuckLake transaction swaps (or adds) the Parquet files ``written`` in: registered with
        ``ducklake_add_data_files`` (no rewrite), or for tables with UUID/JSON/TIME columns (text in the
        row shape) copied by DuckDB with ``INSERT ... SELECT`` casts, the files or folders ``discard`` then deleted."""
        direct = all(registers_directly(c.type) for c in table.columns)
        target = self._qualified(table)
        with self._lock, self._transaction(table, inline=False):
            self._clear_for_copy(table, replace)
            if written and direct:
                self._con.execute(
                    "CALL ducklake_add_data_files(?, ?, ?, schema => ?)",
                    [L, table.target_table, written, self._schema(table)],
                )
            elif written:
                self._con.execute(plan.insert_from_parquet_sql(target, table), [written])
            count = extension.scalar(self._con, f"SELECT count(*) FROM {target}")
        self._copy_files[target] = (0 if replace else self._copy_files.get(target, 0)) + len(written)
        if not direct:
            for path in discard:
                files.remove(path)
        return int(count)

    def write_snapshot_arrow(self, table: TableSchema, rows: pa.Table, replace: bool = True) -> int:
        """``write_snapshot`` for rows already on the driver in the row shape (Arrow): DuckDB inserts
        them, with no Spark job and no files of our own, in one DuckLake commit with the other
        copies waiting for one (``group``: a group commit), a table still all or nothing.

        The commit creates the table when missing (``ensure_table``'s checks first) and holds the
        same steps as ``write_snapshot``'s (a new shape recreates the table, ``replace`` drops a
        previous copy, the count is read inside it), with the same casts as its ``INSERT ... SELECT``
        from Spark's files (``plan.insert_from_relation_sql``): UUID, JSON and TIME from their text,
        every other type as it comes. Returns the rows the table then holds.
        """
        naming.refuse_case_twins(table)
        return write_through(self._copies, self._lock, CopyWrite(table, rows, replace), self._commit_copies)

    def copy_finished(self, table: TableSchema) -> bool:
        """True after a copy of several parts (one a chunk: 32 MiB of heap, ~290K rows of a narrow
        table): its first maintenance pass merges their files into files of DuckLake's target size.

        A change batch writes one delete file for every data file it deletes a row of, at its commit:
        a batch of 10,000 random keys into a 10M-row table copied as 34 files committed in 118 ms,
        into the same rows in one file in 13 ms (DuckDB 1.5.5). The merge is not the copy's own last
        step: it rewrites the table (2.3 s for 10M rows of three columns, ~10 s for 20M rows of the
        copy bench's twelve, on 2 cores) and made that copy 0.47x raw ``COPY`` instead of 0.69x. A copy
        of one part (``write_snapshot_arrow``) or one a restart resumed is left to the schedule."""
        return self._copy_files.pop(self._qualified(table), 0) >= 2

    def _commit_copies(self, group: list[CopyWrite]) -> list[int]:
        """Write each copy of ``group`` in one transaction (lock held); each table's row count."""
        # Before the transaction: on a SQLite catalog, a read of it inside would lock out the commit.
        exists = [naming.refuse_table_twin(self._con, L, self._schema(w.table), w.table) for w in group]
        counts = []
        with self._transaction(group[0].table, inline=False):
            for i, write in enumerate(group):
                table, target, relation = write.table, self._qualified(write.table), f"{SNAPSHOT_ROWS}_{i}"
                if exists[i]:
                    self._clear_for_copy(table, write.replace)
                else:
                    self._con.execute(f"CREATE SCHEMA IF NOT EXISTS {L}.{quote_ident(self._schema(table))}")
                    self._con.execute(plan.create_sql(target, table))
                if write.rows.num_rows:
                    self._con.register(relation, write.rows)
                    try:
                        self._con.execute(plan.insert_from_relation_sql(target, table, relation))
                    finally:
                        self._con.unregister(relation)
                counts.append(int(extension.scalar(self._con, f"SELECT count(*) FROM {target}")))
        return counts

    def _clear_for_copy(self, table: TableSchema, replace: bool) -> None:
        """Inside a copy's transaction (lock held): with ``replace``, drop what an earlier copy left
        (never a history table under the table's own name: ``history.before_copy``)."""
        if replace:
            from headrace.targets.ducklake.history import writer

            writer(self).before_copy(table)
        if replace and not shape_matches(self._con, self._qualified(table), table):
            # A copy in a new shape (resync after a schema change the table could not follow):
            # the table is recreated in the same transaction as its new contents.
            self._con.execute(f"DROP TABLE {self._qualified(table)}")
            self._con.execute(plan.create_sql(self._qualified(table), table))
        elif replace:
            # Drops the previous (possibly partial) copy; DuckLake only marks its files deleted.
            self._con.execute(f"DELETE FROM {self._qualified(table)}")

    def apply_batch(
        self,
        table: TableSchema,
        changes: DataFrame,
        truncate_before: Position | None,
        log_offset: int,
    ) -> LaneChoice:
        """Collect the (bounded) batch as Arrow and apply it in one DuckDB transaction
        (``apply_arrow_batch``).

        Steps: optional truncate; join the batch to the target rows of its keys, which yields the
        old values of unchanged TOAST columns and which changes are stale (target already at or
        after the change: skipped, so replays are no-ops); delete the older rows by ``rowid``
        (skipped entirely when the join found none, e.g. inserts of new keys); insert the new
        versions; upsert the cursor; commit.
        """
        return self.apply_arrow_batch(table, files.to_arrow(changes), truncate_before, log_offset)

    def apply_arrow_batch(self, table: TableSchema, changes: pa.Table, truncate_before: Position | None,
                          log_offset: int) -> LaneChoice:
        """Apply a batch on the driver (Spark's, collected; or built there, ``driver_batch``) in one
        DuckDB transaction; see ``apply_batch``.

        Keyed tables' batches that arrive while another commit runs share the next one (``group``):
        a DuckLake commit costs more the more tables the lake holds (one small batch into a lake of
        10 tables: statements ~40 ms, commit included; of 210: ~80 ms). bench/freshness.py, 10 busy
        tables beside 200 idle ones, 1,000 changes/s, flush 0.5 s, runs back to back on our 2-core
        machine (2026-11-24): one commit per batch, apply.batch median 0.35 s, freshness p99 2.18 s;
        1.7 batches per commit, 0.24 s and p99 1.75 s. Every table's data and cursor still commit
        together, so a crash leaves each batch applied with its cursor or neither. A keyless table's
        batch commits alone: it is a multiset delta, applied exactly once, and a group that failed is
        committed again one write at a time.
        """
        if not table.key:
            # No key: the row images folded into a multiset delta, applied exactly once because the
            # cursor commits in the same transaction (a batch is never applied twice).
            changes = net_row_changes(changes, table)
        write = ChangeWrite(table, changes, truncate_before, log_offset)
        if (cut := getattr(self._cut, "writes", None)) is not None:
            cut.append(write)  # committed with the cut's other batches when it ends (``cut``)
            return APPLIED_IN_DUCKDB
        if not table.key:
            with self._lock:
                self._commit_batches([write])
            return APPLIED_IN_DUCKDB
        write_through(self._batches, self._lock, write, self._commit_batches)
        return APPLIED_IN_DUCKDB

    @contextmanager
    def cut(self, tables: Sequence[TableSchema], changed: set[int]) -> Iterator[CutCommit]:
        """The batches this thread applies in the block commit in one DuckLake transaction when it ends
        (``apply.consistency: transaction``): one snapshot holds them all, with their cursors, so a
        reader sees every table of the cut at the same source transaction, or none of it."""
        writes: list[ChangeWrite] = []
        self._cut.writes = writes
        try:
            yield CutCommit()  # one snapshot holds the cut, always whole: no table's needs naming
        finally:
            self._cut.writes = None
        if writes:
            with self._lock:
                self._commit_batches(writes)

    def _commit_batches(self, group: list[ChangeWrite]) -> list[None]:
        """Apply each batch of ``group`` and write their cursors in one transaction (lock held); a
        table whose kept keys disagreed with it (``kept_keys.StaleKeys``) is applied by a join then."""
        try:
            return self._commit_batches_once(group)
        except StaleKeys as exc:
            event(log, "ducklake.kept_keys_refused", logging.WARNING, table=exc.target, reason=str(exc))
            self._keys.refuse(exc.target)
            return self._commit_batches_once(group)

    def _commit_batches_once(self, group: list[ChangeWrite]) -> list[None]:
        followed = []
        small = all(w.table.key and self._keys.small(self._qualified(w.table)) for w in group)
        with self._transaction(group[0].table, batches_only=True, one_thread=small):
            for write in group:
                target, table = self._qualified(write.table), write.table
                kept = self._kept_columns(target, table) if table.key else []
                found = self._keys.find(self._con, target, write, kept, self._schema(table)) if table.key else None
                known, span = (None, None) if found is None else (found.known, found.index.span)
                applied = batches.apply(self._con, target, write, kept, known, span, self._keys.small(target))
                if found is not None and applied is not None:
                    followed.append((target, found, applied))
            self.write_cursors({w.table.oid: w.log_offset for w in group})  # a table twice: its later batch's
        for target, found, applied in followed:
            self._keys.follow(self._con, target, found, applied.replaced, applied.inserted, applied.lowest_lsn)
        self._inlined.committed(self._con, L, [(self._schema(w.table), w.table.target_table, w.changes.num_rows)
                                               for w in group])
        return [None] * len(group)

    def _kept_columns(self, target: str, table: TableSchema) -> list[str]:
        """``batches.kept_columns``, read once a shape (a DESCRIBE was 1.3 ms of every batch): only this
        target's own transactions change the lake table's columns, and every one but a change batch's
        forgets what was read (``_transaction``)."""
        shape = (target, table.column_names)
        if shape not in self._kept:
            self._kept[shape] = batches.kept_columns(self._con, target, table)
        return self._kept[shape]

    def write_cursors(self, offsets: dict[int, int]) -> None:
        """Append the tables' cursor rows (``batches.write_cursors``), pruning the older ones now and then,
        inside the caller's transaction (lock held): the mirror's batches, and a history table's writer
        (``history.DuckLakeHistory``) for the tables no mirror commits."""
        prune = self._appended >= batches.PRUNE_ROWS
        batches.write_cursors(self._con, CURSOR_TABLE, self.pipeline, offsets, prune)
        self._appended = len(offsets) if prune else self._appended + len(offsets)

    @contextmanager
    def _transaction(self, table: TableSchema, inline: bool = True, batches_only: bool = False,
                     one_thread: bool = False) -> Iterator[None]:
        """One DuckDB transaction: committed when the block ends, rolled back on any error. ``inline``:
        its small writes may go into the catalog (``inlining``); a copy's never do. Any transaction but
        change batches' (``batches_only``), and any that fails, may change tables' columns: the kept
        columns read are forgotten (``_kept_columns``). ``one_thread``: on one DuckDB thread (``_threads``)."""
        if not batches_only:
            self._kept.clear()
        self._threads(one_thread)
        self._inlined.allow(self._con, inline)
        self._con.execute("BEGIN")
        try:
            yield
            self._con.execute("COMMIT")
        except BaseException:
            # The run loop's error boundary (headrace.materialize.error_boundary) tells a conflict (retried)
            # from what needs an operator.
            self._kept.clear()
            self._rollback()
            raise

    def _threads(self, one: bool) -> None:
        """One DuckDB thread for a transaction of small tables' change batches, else DuckDB's default
        (a thread a core), set only when it changes (a change resizes DuckDB's pool: ~0.5 ms).

        A small table's statements are a few ms of DuckLake's catalog work each, and a second thread
        only wakes and waits: 10 busy tables of 2,000 rows used ~9 points of a core less on one thread
        (bench/freshness.py, docs/benchmarks-history.md). A copy, maintenance and a large table's scans
        keep both cores."""
        if one != self._one_thread:
            self._con.execute("SET threads = 1" if one else "RESET threads")
            self._one_thread = one

    def _rollback(self) -> None:
        # A refused COMMIT (a DuckLake conflict) has ended the transaction already, and a lost
        # catalog fails the ROLLBACK too: either failing ROLLBACK ("no transaction is active", "server
        # closed the connection") would hide the error that matters (a conflict is retried, an
        # outage ridden out).
        with suppress(duckdb.Error):
            self._con.execute("ROLLBACK")
        with suppress(duckdb.Error):  # a small table's plan may have failed without its join filter
            self._con.execute("RESET disabled_optimizers")

    def evolve(self, old: TableSchema, new: TableSchema, changes: Sequence[SchemaChange]) -> None:
        """All the changes in one DuckLake transaction (DuckLake's DDL is transactional), each step
        skipped where done (``evolve.evolve_columns``)."""
        fills = {}
        for change in changes:
            col = change.column
            if change.apply and change.kind == "add_column" and col is not None:
                fills[col.name] = files.to_arrow(text_value_frame(self.spark, col.missing, col.type, self.keeps_infinity))
        with self._lock, self._transaction(new):
            name = self._qualified(old)
            if any(c.kind == "rename_table" and c.apply for c in changes):
                rename_table(self._con, L, self._schema(old), old, new, self._schema(new))
                name = self._qualified(new)
            evolve_columns(self._con, name, new, changes, fills)

    def history(self) -> HistoryWriter:
        """History tables beside the mirror, in the same lake (``ducklake.history``)."""
        from headrace.targets.ducklake.history import writer

        return writer(self)

    def drop_table(self, table: TableSchema) -> None:
        """Drop the table and its cursor row together."""
        with self._lock, self._transaction(table):
            self._con.execute(f"DROP TABLE IF EXISTS {self._qualified(table)}")
            self._con.execute(
                f"DELETE FROM {CURSOR_TABLE} WHERE pipeline = ? AND table_oid = ?",
                [self.pipeline, table.oid],
            )

    def read_table(self, table: TableSchema) -> DataFrame:
        """The whole table as a Spark DataFrame in the row shape (small tables: via the driver)."""
        exprs = [f"{cast_out(quote_ident(c.name), c.type)} AS {quote_ident(c.name)}" for c in table.columns]
        with self._lock:
            self._threads(False)  # the whole table
            data = extension.fetch_arrow(self._con.execute(
                f"SELECT {', '.join(exprs)}, {HR_LSN}, {HR_SEQ}, {HR_COMMIT_TS} FROM {self._qualified(table)}"
            ))
        return files.to_spark(self.spark, table, data)

    def read_cursor(self, table: TableSchema) -> int | None:
        """The staged-log offset committed with this table's data, or None before the first batch."""
        with self._lock:
            row = self._con.execute(batches.cursor_sql(CURSOR_TABLE), [self.pipeline, table.oid]).fetchone()
        return None if row is None else int(row[0])

    def maintain(self, table: TableSchema, policy: MaintenancePolicy) -> None:
        """Rewrite deletes away, merge small files, expire and clean up (``maintenance.py``); under
        the lock, so apply batches wait for it rather than conflict with it."""
        with self._lock:
            self._threads(False)  # compaction rewrites files
            maintenance.maintain(self._con, L, self._schema(table), table.target_table, policy)
            self._inlined.flushed(self._schema(table), table.target_table)

    def table_files(self, table: TableSchema) -> TableFiles | None:
        """File counts from the lake's catalog."""
        with self._lock:
            return maintenance.table_files(self._con, L, self._schema(table), table.target_table)

    def close(self) -> None:
        """Close the DuckDB connection, detaching the lake first, under the lock (no batch is mid-way):
        a transaction open at the close is rolled back in DuckDB's destructor, where an error (the
        catalog's server gone) aborts the process; rolled back and detached here, errors are caught."""
        with self._lock:
            self._rollback()
            try:
                self._con.execute(f"DETACH {L}")
            except duckdb.Error as exc:
                # the lake stays attached: closing would abort the process (seen in the outage
                # tests); the connection is left open for good instead, one per outage
                event(log, "ducklake.connection_left_open", logging.WARNING, reason=str(exc).splitlines()[0])
                ctypes.pythonapi.Py_IncRef(ctypes.py_object(self._con))  # never destroyed, not even at exit
                return
            self._con.close()
