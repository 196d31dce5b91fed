"""The interface every target implements.

A target receives Spark DataFrames shaped by the materializer (see ``write_snapshot`` and
``apply_batch``); it never sees pgoutput or staging files. Adding a target means adding a folder
under ``headrace/targets`` with a ``plugin.py`` (``headrace.targets.registry``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from headrace.core.filesink import FileSink, WrittenFile
from headrace.core.lanes import LaneChoice
from headrace.core.maintenance import MaintenancePolicy, TableFiles
from headrace.core.position import Position
from headrace.core.schema import SchemaChange, TableSchema

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from headrace.history.writer import HistoryWriter


@dataclass
class CutCommit:
    """What a ``Target.cut`` block did, told when it ends."""

    whole: bool = True  # every batch of it in the one commit; False: some committed alone (a Spark MERGE)


class Target(ABC):
    """A lakehouse format headrace keeps in sync with the source.

    Row shape shared by ``write_snapshot`` and ``apply_batch``: every source column under its own
    name, typed by ``headrace.core.spark_types`` (Spark types), plus ``_hr_lsn`` (long),
    ``_hr_seq`` (long) and ``_hr_commit_ts`` (timestamp). Change batches add ``_hr_op`` (``I``,
    ``U`` or ``D``; deletes carry only the key columns, the rest NULL) and ``_hr_unchanged``
    (comma-separated names of TOAST columns the update left untouched, or NULL). A batch holds at
    most one row per key: the last change to that key. A batch may add ``_hr_from`` (a struct of
    the key columns): unchanged TOAST columns of that row are the old key's target row's values
    (the update moved the row to a new key).

    Tables without a key (``table.key`` empty, REPLICA IDENTITY FULL) get a different batch: not
    deduplicated, one row per row image a change adds (``_hr_op`` ``I``) or removes (``D``, every
    column set), at the change's position; an update is a ``D`` of its old row and an ``I`` of
    its new one. Identical rows are legitimate, so such a batch must be applied exactly once, as
    a multiset delta (``net_row_changes``, in ``engines.spark.keyless`` and ``engines.driver.keyless``). Column names: ``headrace.core.rows``.
    """

    name: str = ""
    # True when the target stores infinite dates and timestamps (DuckDB's largest int32 day and
    # int64 microsecond, which the row shape's Spark values carry through unchanged).
    keeps_infinity: bool = False
    # True when the target applies change batches built on the driver as Arrow (``apply_arrow_batch``).
    applies_arrow: bool = False
    # True when the target writes initial copies already on the driver as Arrow, with no Spark job
    # (``write_snapshot_arrow``: small tables read before their copy).
    copies_arrow: bool = False
    # True when, ``apply.max_batch_rows`` unset, a keyed batch takes at most ``apply.driver_batch_rows`` staged
    # rows (a backlog then drains as a row of driver batches beside capture); False: no cap (a MERGE's
    # fixed cost is better spread over large batches).
    caps_batches: bool = False
    # ``apply.consistency: transaction``: True when batches of several tables commit in one
    # transaction (``cut``); False when each table commits alone and ``cut`` names each table's
    # snapshot at the cut instead (the cut is then what readers time-travel to).
    commits_across_tables: bool = False
    # True when ``snapshot_at`` names each table's snapshot (Iceberg): its cuts are recorded
    # (``state.cuts``) even where they commit across tables, for the cuts that could not (``CutCommit``).
    names_snapshots: bool = False
    # True when each table keeps snapshots of its own that ``expire_snapshots`` caps (Iceberg; DuckLake's
    # are the lake's, expired by ``maintain``).
    caps_snapshots: bool = False
    # Tables whose batches are applied at the same time when ``apply.concurrency`` is unset.
    apply_concurrency: int = 4

    @abstractmethod
    def ensure_table(self, table: TableSchema) -> str:
        """Create the target table for ``table`` if it is missing; return its name in the target."""

    @abstractmethod
    def write_snapshot(self, table: TableSchema, rows: DataFrame, position: Position, replace: bool = True) -> int:
        """Write initial-copy ``rows`` in one commit; return the rows the table then holds.

        ``replace=True`` swaps the table's whole contents for ``rows`` (the first part of a copy,
        so a previous partial copy is dropped in the same commit); ``replace=False`` appends the
        next part of the same consistent copy.
        """

    def write_snapshot_arrow(self, table: TableSchema, rows: pa.Table, replace: bool = True) -> int:
        """``write_snapshot`` for a small copy already on the driver: ``rows`` in the row shape as
        Arrow (the types Spark's ``toArrow`` gives for it), written without a Spark job. Only targets
        with ``copies_arrow`` implement it."""
        raise NotImplementedError(f"target {self.name} writes copies through Spark only")

    def copy_sink(self, table: TableSchema, replace: bool) -> FileSink | None:
        """Where a copy's tasks may write ``table``'s rows as Parquet themselves (no Spark writer),
        to be registered by ``register_copy_files``; None: this copy goes through ``write_snapshot``
        (the default; also where the target's storage is out of ``pyarrow.fs``'s reach)."""
        return None

    def register_copy_files(self, table: TableSchema, sink: FileSink, written: list[WrittenFile],
                            replace: bool) -> int:
        """``write_snapshot`` for files a ``copy_sink`` received: register ``written`` in one commit
        (``replace``: instead of the table's contents); return the rows the table then holds."""
        raise NotImplementedError(f"target {self.name} writes copies through Spark only")

    def copy_finished(self, table: TableSchema) -> bool:
        """After the last part of ``table``'s copy: whether its first maintenance pass should run as
        soon as it streams, not on the schedule (DuckLake: a copy of several parts left a file a part,
        and every change batch pays for each file it touches). False by default."""
        return False

    @abstractmethod
    def apply_batch(
        self,
        table: TableSchema,
        changes: DataFrame,
        truncate_before: Position | None,
        log_offset: int,
    ) -> LaneChoice:
        """Apply one deduplicated batch of changes, idempotently; where it was applied, and why.

        A row in the target is only replaced or deleted by a change at a later position than the
        one that wrote it, so replaying a batch changes nothing. When ``truncate_before`` is set,
        first delete every row written at a position before it (a TRUNCATE in the stream).
        ``log_offset`` is the staged-log offset this batch reaches: a target that can commit it
        with the data (``stores_cursor``) does so, and returns it from ``read_cursor``.
        """

    def cut(self, tables: Sequence[TableSchema], changed: set[int]) -> AbstractContextManager[CutCommit]:
        """With ``commits_across_tables``: a block applying one cut's batches (``apply_batch``,
        ``apply_arrow_batch`` on this thread) of ``tables`` (every streaming table; ``changed``: the
        oids with a batch in it); they commit together when it ends, in one transaction (with their
        cursors, where the target stores them), or not at all (an error in the block). The
        ``CutCommit`` it gives says, once the block ended, whether every batch was in that commit."""
        raise NotImplementedError(f"target {self.name} commits one table at a time: see snapshot_at")

    def snapshot_at(self, table: TableSchema) -> tuple[str, int | None]:
        """Without ``commits_across_tables``: the table's name as readers know it and its current
        snapshot id, which a cut names for it once every batch of the cut committed (None: no
        snapshot yet)."""
        raise NotImplementedError(f"target {self.name} has no consistent cuts")

    def apply_arrow_batch(self, table: TableSchema, changes: pa.Table, truncate_before: Position | None,
                          log_offset: int) -> LaneChoice:
        """``apply_batch`` for a batch already on the driver as a pyarrow Table: the rows and columns
        Spark's ``toArrow`` of the DataFrame would give (``headrace.engines.driver.batch``): for a
        keyless table its row images, which the target folds (``net_row_changes``). Only targets with
        ``applies_arrow`` implement it."""
        raise NotImplementedError(f"target {self.name} applies batches through Spark only")

    @abstractmethod
    def evolve(self, old: TableSchema, new: TableSchema, changes: Sequence[SchemaChange]) -> None:
        """Bring the target table from shape ``old`` to ``new`` (``changes`` lists the steps).

        Called between the last batch written in the old shape and the first in the new one, so
        the target then holds only rows from before the change. Must be idempotent: after a crash
        it runs again over a table that may already have some or all of the changes. An added
        column gets ``column.missing`` (or NULL) in every existing row. Raises
        ``SchemaChangeError`` for what the target cannot do.
        """

    @abstractmethod
    def drop_table(self, table: TableSchema) -> None:
        """Drop the target table if it exists."""

    @abstractmethod
    def read_table(self, table: TableSchema) -> DataFrame:
        """The target table as a Spark DataFrame (for verification and `status`)."""

    stores_cursor: bool = False

    def read_cursor(self, table: TableSchema) -> int | None:
        """The staged-log offset committed with the data, for targets with ``stores_cursor``."""
        return None

    def maintain(self, table: TableSchema, policy: MaintenancePolicy) -> None:
        """Compact small files, apply away delete files, expire old snapshots and remove orphan
        files of ``table`` (``headrace.maintenance``). Must leave the rows as they are; a commit
        conflict with a concurrent apply is the maintenance's to retry. The default does nothing."""

    def expire_snapshots(self, table: TableSchema, policy: MaintenancePolicy) -> int:
        """Expire ``table``'s oldest snapshots beyond half of ``policy.max_snapshots`` (never the one
        ``keep_from_snapshot`` names or a later one), cheaply, between two of its apply batches (the
        run loop calls it every ``max_snapshots / 2`` batches, on a target that ``caps_snapshots``);
        the number expired. The default expires nothing."""
        return 0

    def table_files(self, table: TableSchema) -> TableFiles | None:
        """The table's file counts from its metadata (cheap); None when the target cannot tell."""
        return None

    def history(self) -> HistoryWriter | None:
        """The target's history tables (changelog, scd2, soft_delete: ``headrace.history``); None when
        the target writes none (a history mode configured for it is then refused)."""
        return None

    def close(self) -> None:
        """Release connections; the default has nothing to release."""
