"""A DuckLake table's keys kept in memory between batches: the plan finds a batch's target rows there
instead of joining the whole table.

DuckLake has no index: the plan's join (``plan.plan_sql``) scans the table's key column for every
batch, whatever the batch's size. A 25K-change burst took 0.20 s into a 1M-row table and 0.42 s into a
10M-row one (2.1x; 1.33 s at 50M), the join 0.18 s of it at 10M and 0.68 s at 50M. A table of
``INDEX_FROM_ROWS`` to ``budget`` rows (``target.ducklake.driver_key_rows``) with one integer key
column keeps its key, ``rowid``, ``_hr_lsn`` and ``_hr_seq`` instead (``engines.driver.key_rows``: a batch's keys
found by binary search), read once, in a batch's transaction, and carried forward by each commit:

- the batch's rows of the index go to DuckDB as ``hr_known``, joined in place of the table (the rest
  of the apply is the same: the delete by ``rowid``, the insert);
- after the commit, the rows it inserted are read back with their ``rowid`` (DuckLake numbers rows at
  the commit): ``_hr_lsn`` at least the batch's smallest, ``rowid`` past any the index has seen, so
  DuckLake's file statistics skip every older file (~7 ms for 22.5K rows of a 10M-row table);
- the index follows the lake snapshot it was read or carried to: a later snapshot that touched the
  table (``ducklake_snapshot_changes`` names its id: a compaction, a schema change, a TRUNCATE,
  another writer, a batch applied without the index) makes it stale, and it is read again. After
  our commit exactly one snapshot touched the table since the transaction's, and it must be the
  current one; anything else drops the index.
- inside the transaction the delete must remove as many rows as the index said were there
  (``StaleKeys`` otherwise: the transaction rolls back, the index is dropped and no longer used for
  that table in this process, and the batch is applied again by the join).

Not here (the join, as before): batches of more than 1/``LARGE_BATCH`` of the table's rows, batches
with a TRUNCATE, TOAST columns left unchanged, a key change with TOAST (``_hr_from``), columns kept
after a drop (they read the target row's other columns), keys of several columns or not integers,
keyless tables, tables under ``INDEX_FROM_ROWS`` (the join costs a few ms) or over the budget.
"""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.core.names import quote_ident
from headrace.core.rows import HR_FROM, HR_LSN, HR_SEQ, leaves_unchanged
from headrace.engines.driver.key_rows import KeyCache, KeyRows
from headrace.targets.ducklake.extension import fetch_arrow, scalar

if TYPE_CHECKING:
    from headrace.targets.ducklake.batches import ChangeWrite

INDEX_FROM_ROWS = 100_000  # below: the plan's join scans the key column in a few ms
RECOUNT_BATCHES = 100  # a table too small or too large for an index is counted again after this many batches
# A batch of more than 1/LARGE_BATCH of the table's rows joins the table instead, and the index is let go
# (read again by the next small batch). The index saves the scan of the key column, about the table, and
# costs about the batch (the candidates' lookup, the read-back of the rows inserted, the dead rows and
# their compaction). One UPDATE of a whole 5M-row table, applied as 26 batches of 200K rows (4% each):
# 20.0 s of batches with the index, 13.5 s without, and the driver's peak RSS 1,551 against 1,001 MiB
# (bench/large_transaction.py, 2026-11-28). A burst of 25K rows into 10M (0.25%) is the index's case.
LARGE_BATCH = 32
ROWID = "rowid"  # the column ``hr_known`` holds each row's DuckLake ``rowid`` in


class StaleKeys(RuntimeError):
    """The kept keys of ``target`` disagreed with it inside a batch's transaction (rolled back)."""

    def __init__(self, target: str, message: str) -> None:
        super().__init__(message)
        self.target = target


@dataclass
class KeyIndex:
    """A table's live keys at lake snapshot ``snapshot``: key, ``rowid``, ``_hr_lsn``, ``_hr_seq``."""

    table_id: int
    snapshot: int
    keys: KeyRows
    top_rowid: int  # the largest rowid seen: the rows a later commit inserts are past it
    span: tuple[int, int]  # the smallest and largest key seen (deleted ones too)

    @property
    def held_rows(self) -> int:
        return self.keys.rows.num_rows


@dataclass
class Found:
    """A batch's target rows from the index, and what the commit must carry into it."""

    index: KeyIndex
    known: pa.Table  # the candidates: key, rowid, _hr_lsn, _hr_seq, IDX
    read_at: int  # the transaction's snapshot


class KeptKeys:
    """The kept indexes of one DuckLake target's tables (used under the target's lock)."""

    def __init__(self, lake: str, budget: int) -> None:
        self.lake = lake
        self.budget = budget
        self._cache: KeyCache[KeyIndex] = KeyCache()
        self._refused: set[str] = set()  # an index disagreed, or the key is no integer: the join from then on
        self._skipped: dict[str, int] = {}  # tables outside the index's sizes: batches until they are counted again
        self._small: set[str] = set()  # tables last counted under ``INDEX_FROM_ROWS``

    def find(self, con: duckdb.DuckDBPyConnection, target: str, write: ChangeWrite,
             kept_columns: list[str], schema: str) -> Found | None:
        """Inside the batch's transaction: the batch's target rows from ``target``'s index (read first
        when missing or stale), or None when the plan joins the table (module docstring)."""
        index = self._cache.take(target)
        table, batch = write.table, write.changes
        if (len(table.key) != 1 or target in self._refused or write.truncate_before is not None
                or kept_columns or HR_FROM in batch.column_names or leaves_unchanged(batch)
                or not pa.types.is_integer(batch.schema.field(table.key[0]).type)):
            return None
        if index is None and self._skipped.get(target, 0) > 0:  # counted lately: not worth a query
            self._skipped[target] -= 1
            return None
        if index is not None and batch.num_rows * LARGE_BATCH > index.keys.live_rows:  # as ``_read`` counts
            return None  # a large batch joins the table; the index, taken out, is read again after it
        read_at = scalar(con, f"SELECT id FROM {self.lake}.current_snapshot()")
        if index is not None and _touching(con, self.lake, index.table_id, index.snapshot, read_at):
            index = None
        if index is None:
            index = self._read(con, target, table.key[0], table.target_table, schema, read_at, batch.num_rows)
            if index is None:
                return None
        keys = batch.column(table.key[0]).combine_chunks()
        key_type = index.keys.rows.schema.field(0).type
        if not keys.type.equals(key_type):
            try:
                keys = keys.cast(key_type)
            except pa.ArrowInvalid:  # a key beyond the target column's type: the join says so
                return None
        return Found(index, index.keys.candidates(keys), int(read_at))

    def _read(self, con: duckdb.DuckDBPyConnection, target: str, key: str, name: str, schema: str,
              read_at: int, batch_rows: int) -> KeyIndex | None:
        rows = int(scalar(con, f"SELECT count(*) FROM {target}"))
        if rows < INDEX_FROM_ROWS:
            self._small.add(target)
        else:
            self._small.discard(target)
        if not INDEX_FROM_ROWS <= rows <= self.budget:
            self._skipped[target] = RECOUNT_BATCHES
            return None
        if batch_rows * LARGE_BATCH > rows:
            return None  # not read for a large batch (``LARGE_BATCH``)
        read = fetch_arrow(con.execute(_key_rows_sql(key, target)))
        if not pa.types.is_integer(read.schema.field(0).type):
            self._refused.add(target)
            return None
        table_id = scalar(
            con,
            f"SELECT t.table_id FROM __ducklake_metadata_{self.lake}.ducklake_table t "
            f"JOIN __ducklake_metadata_{self.lake}.ducklake_schema s ON s.schema_id = t.schema_id "
            "WHERE s.schema_name = ? AND t.table_name = ? AND t.end_snapshot IS NULL "
            "AND s.end_snapshot IS NULL", [schema, name])
        if table_id is None:  # not found by its names in the catalog: the join from now on
            self._refused.add(target)
            return None
        top = pc.max(read.column(ROWID)).as_py()
        bounds = pc.min_max(read.column(0))
        span = (bounds["min"].as_py(), bounds["max"].as_py()) if read.num_rows else (0, 0)
        return KeyIndex(int(table_id), read_at, KeyRows(read), -1 if top is None else int(top), span)

    def small(self, target: str) -> bool:
        """``target`` held fewer than ``INDEX_FROM_ROWS`` rows when last counted (by ``find``, every
        ``RECOUNT_BATCHES`` batches of a table with one integer key)."""
        return target in self._small

    def follow(self, con: duckdb.DuckDBPyConnection, target: str, found: Found, deleted: np.ndarray,
               inserted: int, lowest_lsn: int | None) -> None:
        """After the batch's commit: carry ``found``'s index past it (``deleted``: the ``IDX`` of the
        rows it removed; ``inserted`` rows from ``_hr_lsn`` ``lowest_lsn`` on read back) and keep
        it, or drop it when anything else touched the table (module docstring)."""
        with suppress(duckdb.Error):  # the catalog lost after the commit: the index is read again
            self._follow(con, target, found, deleted, inserted, lowest_lsn)

    def _follow(self, con: duckdb.DuckDBPyConnection, target: str, found: Found, deleted: np.ndarray,
                inserted: int, lowest_lsn: int | None) -> None:
        index = found.index
        now = int(scalar(con, f"SELECT id FROM {self.lake}.current_snapshot()"))
        touched = _touching(con, self.lake, index.table_id, found.read_at, now)
        if touched != [now] and (inserted or len(deleted) or touched):  # an empty insert may name the table
            return
        added = index.keys.rows.schema.empty_table()
        if inserted:
            added = fetch_arrow(con.execute(_key_rows_sql(index.keys.rows.column_names[0], target)
                                            + f" WHERE {HR_LSN} >= ? AND rowid > ?", [lowest_lsn, index.top_rowid]))
            if added.num_rows != inserted:
                return
            index.top_rowid = max(index.top_rowid, int(pc.max(added.column(ROWID)).as_py()))
            bounds = pc.min_max(added.column(0))
            index.span = (min(index.span[0], bounds["min"].as_py()), max(index.span[1], bounds["max"].as_py()))
        index.keys.update(deleted, added)
        index.snapshot = now
        self._cache.put(target, index, self.budget)

    def refuse(self, target: str) -> None:
        """The index of ``target`` disagreed with it: the join from now on."""
        self._refused.add(target)
        self._cache.drop(target)


def check_deleted(target: str, expected: int, deleted: int) -> None:
    """The delete by the index's rowids removed what the index said the table holds."""
    if deleted != expected:
        raise StaleKeys(target, f"{target}: the kept keys named {expected} rows to replace, the table had {deleted}"
                        " of them; the batch is applied again by a join")


def _touching(con: duckdb.DuckDBPyConnection, lake: str, table_id: int, after: int, upto: int) -> list[int]:
    """The snapshots in (``after``, ``upto``] whose changes name table ``table_id``."""
    rows = con.execute(
        f"SELECT snapshot_id, changes_made FROM __ducklake_metadata_{lake}.ducklake_snapshot_changes "
        "WHERE snapshot_id > ? AND snapshot_id <= ? ORDER BY snapshot_id", [after, upto]).fetchall()
    mine = str(table_id)
    return [int(s) for s, changes in rows
            if any(part.rsplit(":", 1)[-1] == mine for part in (changes or "").split(","))]


def _key_rows_sql(key: str, target: str) -> str:
    """What the index holds of each row of ``target``: its key, ``rowid``, ``_hr_lsn`` and ``_hr_seq``."""
    return f"SELECT {quote_ident(key)}, rowid AS {ROWID}, {HR_LSN}, {HR_SEQ} FROM {target}"

