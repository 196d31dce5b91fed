"""One change batch's statements inside a DuckLake transaction, and the cursors of a group of them.

A batch (``ChangeWrite``) commits with other tables' batches when they meet at the target's lock
(``group``); what it runs is the same alone or in a group: optional truncate; the plan joining the
batch to the target rows of its keys (``plan.plan_sql``: old values of unchanged TOAST columns,
stale changes skipped so replays are no-ops), found in the table or, for a large one, in its kept
keys (``kept_keys``); delete of the older rows by ``rowid`` (skipped when the plan found none; bounded
by their key range when narrow); insert of the new versions. A keyless batch is a net multiset delta
instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.core.names import quote_ident
from headrace.core.position import Position
from headrace.core.rows import HR_COMMIT_TS, HR_FROM, HR_LSN, HR_OP, HR_SEQ, leaves_unchanged
from headrace.core.schema import TableSchema
from headrace.targets.ducklake import plan
from headrace.targets.ducklake.extension import fetch_arrow
from headrace.targets.ducklake.kept_keys import check_deleted


@dataclass(frozen=True, eq=False)
class ChangeWrite:
    """One table's change batch (Arrow, the row shape) waiting for a commit with its cursor."""

    table: TableSchema
    changes: pa.Table
    truncate_before: Position | None
    log_offset: int


NARROW = 0.25  # the share of a table's key range below which a delete is bounded by its rows' keys


@dataclass(frozen=True)
class Applied:
    """What a batch applied with kept keys (``kept_keys``) did: the index rows it replaced or deleted
    (``IDX``), how many rows it inserted and the smallest ``_hr_lsn`` among them."""

    replaced: np.ndarray
    inserted: int
    lowest_lsn: int | None


def apply(con: duckdb.DuckDBPyConnection, target: str, write: ChangeWrite, kept: list[str],
          known: pa.Table | None = None, span: tuple[int, int] | None = None, small: bool = False) -> Applied | None:
    """Apply ``write``'s rows to ``target`` (its table's qualified name) inside the caller's
    transaction; the cursor is the caller's (``write_cursors``). ``kept``: the target's columns the
    source dropped (``kept_columns``). ``known``: the target rows of the batch's
    keys (``kept_keys``), joined instead of the table; then what the batch did is returned, and a
    delete that disagrees with them raises ``StaleKeys``. ``span``: the table's (integer) key range,
    which bounds the delete when the replaced rows lie in a narrow part of it (``_key_range``).
    ``small``: the table is small (``kept_keys.KeptKeys.small``): its plan skips DuckDB's join filter
    (``_unfiltered``)."""
    table, batch, truncate_before = write.table, write.changes, write.truncate_before
    con.register("hr_batch", batch)
    if known is not None:
        con.register("hr_known", known)
    try:
        if truncate_before is not None:
            con.execute(
                f"DELETE FROM {target} WHERE {HR_LSN} < ? OR ({HR_LSN} = ? AND {HR_SEQ} < ?)",
                [truncate_before.lsn, truncate_before.lsn, truncate_before.seq],
            )
        if batch.num_rows and not table.key:
            con.execute(plan.net_delete_sql(target, table))
            con.execute(plan.net_insert_sql(target, table))
        elif batch.num_rows:
            moved = HR_FROM in batch.schema.names
            unchanged = leaves_unchanged(batch)
            sql = plan.plan_sql(target, table, table.key, moved, kept, unchanged, known is not None)
            with _unfiltered(con, small and known is None):
                planned = fetch_arrow(con.execute(sql))
            con.register("hr_planned", planned)
            older_rows, low, high = _replaced(planned, table.key[0])
            if older_rows:
                within, bounds = _key_range(quote_ident(table.key[0]), low, high, span)
                deleted = con.execute(f"DELETE FROM {target} WHERE rowid IN "
                                      f"(SELECT hr_old_rowid FROM hr_planned WHERE hr_older){within}", bounds).fetchone()
                if known is not None:
                    check_deleted(target, older_rows, int(deleted[0]) if deleted else 0)
            con.execute(plan.insert_planned_sql(target, table, kept))
            if known is not None:
                return _applied(con)
        return None
    finally:
        con.unregister("hr_batch")
        con.unregister("hr_planned")
        con.unregister("hr_known")


UNFILTERED = "join_filter_pushdown"  # the optimizer a small table's plan runs without (``_unfiltered``)


@contextmanager
def _unfiltered(con: duckdb.DuckDBPyConnection, skip: bool) -> Iterator[None]:
    """With ``skip``, the block's queries run without DuckDB's join filter pushdown.

    The filter (the batch's keys, pushed into the table's scan) lets DuckLake skip the files of a large
    table outside the batch's keys, and costs a small table more than its scan: a 50-change batch's plan
    against a 2,000-row table took 9.2 ms with it and 5.4 ms without (DuckDB 1.5.5, DuckLake catalog in
    a DuckDB file, idle machine), 4 ms of each batch of a busy small table.

    A block that raises leaves the setting to the transaction's rollback (``DuckLakeTarget._rollback``):
    DuckDB refuses any statement in a failed transaction, a RESET too."""
    if not skip:
        yield
        return
    con.execute(f"SET disabled_optimizers = {plan.literal(UNFILTERED)}")
    yield
    con.execute("RESET disabled_optimizers")


def _replaced(planned: pa.Table, key: str) -> tuple[int, object, object]:
    """The plan's target rows a batch replaces or deletes (``hr_older``): how many, and the least and
    greatest of their first key column (integers only, for ``_key_range``; else None)."""
    older = planned.filter(planned.column("hr_older"))
    if not older.num_rows:
        return 0, None, None
    count = pc.count_distinct(older.column("hr_old_rowid")).as_py()
    keys = older.column(key)
    if not pa.types.is_integer(keys.type):
        return count, None, None
    bounds = pc.min_max(keys)
    return count, bounds["min"].as_py(), bounds["max"].as_py()


def _key_range(column: str, low: object, high: object, span: tuple[int, int] | None) -> tuple[str, list[object]]:
    """A filter on key column ``column`` (quoted) to the replaced rows' range ``low``..``high``, when
    that range is at most ``NARROW`` of the table's key ``span``; else none.

    DuckLake finds the rows to delete by scanning ``rowid``, which prunes no file; the range lets its
    file statistics skip every file outside it: one row of a 50M-row table, 0.20-0.25 s -> 0.013-0.018
    s. A range over most of the table prunes nothing and costs a scan of the key column besides
    (22.5K random rows of the same table: 0.49 s -> 0.82 s), so it is left out then."""
    if span is None or not isinstance(low, int) or not isinstance(high, int) or high - low > NARROW * (span[1] - span[0]):
        return "", []
    return f" AND {column} >= ? AND {column} <= ?", [low, high]


def _applied(con: duckdb.DuckDBPyConnection) -> Applied:
    replaced = con.execute("SELECT DISTINCT hr_old_idx FROM hr_planned WHERE hr_older").fetchnumpy()["hr_old_idx"]
    row = con.execute(f"SELECT count(*), min({HR_LSN}) FROM hr_planned WHERE {HR_OP} <> 'D' AND NOT hr_stale").fetchone()
    inserted, lowest = (int(row[0]), row[1]) if row else (0, None)
    return Applied(np.asarray(replaced, dtype=np.int64), inserted, None if lowest is None else int(lowest))


def kept_columns(con: duckdb.DuckDBPyConnection, target: str, table: TableSchema) -> list[str]:
    """Target columns the source no longer has (``schema_changes.drop_column: keep``)."""
    known = {*table.column_names, HR_LSN, HR_SEQ, HR_COMMIT_TS}
    return [r[0] for r in con.execute(f"DESCRIBE {target}").fetchall() if r[0] not in known]


# Cursor rows a target appends between prunes: past this, its next commit first deletes every row but each
# table's newest (``write_cursors``).
PRUNE_ROWS = 1_000


def cursor_sql(cursor_table: str) -> str:
    """A table's cursor (parameters: pipeline, table oid): its newest row's offset. DuckLake numbers a
    table's rows in the order of their commits (and keeps the numbers through compaction), so the
    newest row has the greatest ``rowid``."""
    return (f"SELECT log_offset FROM {cursor_table} WHERE pipeline = ? AND table_oid = ? "
            "ORDER BY rowid DESC LIMIT 1")


def write_cursors(con: duckdb.DuckDBPyConnection, cursor_table: str, pipeline: str, offsets: dict[int, int],
                  prune: bool = False) -> None:
    """Each table's (oid: offset) cursor in ``cursor_table``, inside the caller's transaction: one row
    appended a table, the newest row its cursor (``cursor_sql``). With ``prune``, first every row but
    each of the pipeline's tables' newest goes (``PRUNE_ROWS``).

    Appended, not replaced: DuckLake has no primary keys or ON CONFLICT, and a DELETE of the old row
    cost a group commit ~10 ms (its catalog work; the INSERT ~1 ms), ~5 ms of each batch of ten busy
    tables (DuckDB 1.5.5, a DuckDB-file catalog)."""
    if prune:
        con.execute(f"DELETE FROM {cursor_table} WHERE pipeline = ? AND rowid NOT IN "
                    f"(SELECT max(rowid) FROM {cursor_table} WHERE pipeline = ? GROUP BY table_oid)", [pipeline, pipeline])
    con.execute(
        f"INSERT INTO {cursor_table} VALUES {', '.join(['(?, ?, ?, now())'] * len(offsets))}",
        [v for oid, offset in offsets.items() for v in (pipeline, oid, offset)],
    )
