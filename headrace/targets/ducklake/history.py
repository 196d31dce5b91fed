"""History tables in DuckLake (``headrace.history``): each batch in one DuckDB transaction with its offset.

The offset a history table beside the mirror holds is a row of ``_headrace.history_offset`` in the
lake; a table written in one mode under its own name (no mirror) holds it in its cursor row
(``_headrace.cursor``). Either is written in the same transaction as the table's rows, so a batch is
in a history table with its offset or not at all. scd2 closes versions with an ``UPDATE`` of the
open versions of the batch's keys (``_hr_current``, the table's partition column: the closed
versions' files are not read) and soft_delete replaces the batch's keys' rows; both also only touch
rows written before the change (by position), so even a batch written twice would change nothing
the second time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from headrace.core.errors import TerminalError
from headrace.core.names import quote_ident
from headrace.core.schema import TableSchema
from headrace.history import build as b
from headrace.history.changes import Key, tuples
from headrace.history.config import Mode, history_table
from headrace.history.queries import rows_now, written_before
from headrace.history.tables import (
    EXTRA,
    IN_PLACE_MARKERS,
    in_place_mode,
    key_table,
    refuse_other_mode,
    to_arrow,
)
from headrace.history.writer import Built, HistoryWriter
from headrace.targets.ducklake import extension
from headrace.targets.ducklake.batches import cursor_sql
from headrace.targets.ducklake.types import cast_in, cast_out, duck_type

if TYPE_CHECKING:
    from headrace.targets.ducklake.target import DuckLakeTarget

L = extension.LAKE_ALIAS
CURSOR_TABLE = f"{L}._headrace.cursor"  # ``target.CURSOR_TABLE``: a table without a mirror commits its cursor here
OFFSET_TABLE = f"{L}._headrace.history_offset"


class DuckLakeHistory(HistoryWriter):
    """The history tables of one DuckLake target (its connection and lock)."""

    writes_in_place = True

    def __init__(self, target: DuckLakeTarget) -> None:
        self.target = target
        self.con = target._con
        self.con.execute(f"CREATE TABLE IF NOT EXISTS {OFFSET_TABLE} (pipeline VARCHAR, table_name VARCHAR,"
                         " log_offset BIGINT)")
        self._offsets: dict[tuple[int, Mode, bool], int] = {}  # (oid, mode, own) -> offset committed
        self._followed: set[tuple[int, str, tuple[tuple[str, str], ...]]] = set()  # tables that have these columns

    def name(self, table: TableSchema, mode: Mode, own: bool = False) -> str:
        """The history table's qualified name in the lake (``own``: the table's own name)."""
        return self.target._qualified(table) if own else (
            f"{L}.{quote_ident(self.target._schema(table))}.{quote_ident(history_table(table.target_table, mode))}")

    def _key(self, table: TableSchema, mode: Mode, own: bool = False) -> list[str]:
        return [self.target.pipeline, f"{self.target._schema(table)}.{_table_name(table, mode, own)}"]

    def applied_offset(self, table: TableSchema, mode: Mode, own: bool = False) -> int | None:
        """Read once, then kept as this writer commits (a batch's two catalog queries fewer). A table in
        place of the mirror holds its offset in its cursor row, once its first batch gave it the mode's
        columns (``start``)."""
        known = self._offsets.get((table.oid, mode, own))
        if known is not None:
            return known
        with self.target._lock:
            if own:
                have = {r[0] for r in self.con.execute(f"DESCRIBE {self.name(table, mode, own)}").fetchall()}
                row = self.con.execute(cursor_sql(CURSOR_TABLE), [self.target.pipeline, table.oid]).fetchone() \
                    if IN_PLACE_MARKERS[mode] in have else None
            else:
                row = self.con.execute(f"SELECT max(log_offset) FROM {OFFSET_TABLE} WHERE pipeline = ? AND table_name = ?",
                                       self._key(table, mode)).fetchone()
        found = None if row is None or row[0] is None else int(row[0])
        if found is not None:
            self._offsets[(table.oid, mode, own)] = found
        return found

    def before_copy(self, table: TableSchema) -> None:
        """Inside a copy that replaces the table's rows (lock held): refused when the table is a history
        table under its own name (the copy would throw its history away)."""
        have = {r[0] for r in self.con.execute(f"DESCRIBE {self.target._qualified(table)}").fetchall()}
        mode = in_place_mode(have)
        if mode is not None:
            raise TerminalError(
                f"table {table.qualified_name}: {self.target._qualified(table)} is its {mode} table, holding its"
                f" history, and a copy (a resync) would replace it: refused. To keep streaming, resume the table;"
                f" to start its history again, drop that lake table (its history is lost) and resync")
        self._forget(table)

    def _forget(self, table: TableSchema) -> None:
        """Read ``table``'s offsets and shapes from the lake again (a commit that may or may not have landed)."""
        self._offsets = {k: v for k, v in self._offsets.items() if k[0] != table.oid}
        self._followed = {k for k in self._followed if k[0] != table.oid}

    def _set_offset(self, table: TableSchema, mode: Mode, log_offset: int, own: bool = False) -> None:
        if own:  # no mirror commits this table's cursor: its history table does, with its rows (and offset)
            self.target.write_cursors({table.oid: log_offset})
            return
        key = self._key(table, mode)
        self.con.execute(f"DELETE FROM {OFFSET_TABLE} WHERE pipeline = ? AND table_name = ?", key)
        self.con.execute(f"INSERT INTO {OFFSET_TABLE} VALUES (?, ?, ?)", [*key, log_offset])

    def start(self, table: TableSchema, mode: Mode, log_offset: int, own: bool = False) -> None:
        try:
            if own:
                self._start_in_place(table, mode, log_offset)
            else:
                self._start_beside(table, mode, log_offset)
        except BaseException:
            self._forget(table)
            raise
        self._offsets[(table.oid, mode, own)] = log_offset

    def _start_beside(self, table: TableSchema, mode: Mode, log_offset: int) -> None:
        name, mirror = self.name(table, mode), self.target._qualified(table)
        cols = [f"{quote_ident(c.name)} {duck_type(c.type)}" for c in table.columns]
        cols += [f"{n} {duck}" for n, _, duck, _ in EXTRA[mode]]
        source = ", ".join(quote_ident(c.name) for c in table.columns)
        seeded = {
            "changelog": f"'I', {b.COMMIT_TS}, {b.LSN}, {b.SEQ}, NULL",
            "scd2": f"{b.COMMIT_TS}, NULL, true, {b.LSN}, {b.SEQ}, NULL, NULL",
            "soft_delete": f"NULL, {b.COMMIT_TS}, {b.LSN}, {b.SEQ}",
        }[mode]
        with self.target._lock, self.target._transaction(table):
            self.con.execute(f"CREATE TABLE IF NOT EXISTS {name} ({', '.join(cols)})")
            if mode == "scd2":
                self._partition(name)
            self.con.execute(f"DELETE FROM {name}")  # a table left without its offset row: started again
            self.con.execute(f"INSERT INTO {name} SELECT {source}, {seeded} FROM {mirror}")
            self._set_offset(table, mode, log_offset)

    def _start_in_place(self, table: TableSchema, mode: Mode, log_offset: int) -> None:
        """The copy (in the mirror's shape, under the table's own name) becomes the ``mode`` table: its
        rows ``I`` rows, open versions or live rows with no commit time (like the rows a history table
        beside the mirror starts from), in one commit with the offset. DuckLake adds columns without a
        default only, so ``_hr_op`` and ``_hr_current`` are set by an ``UPDATE`` (one rewrite of the copy)."""
        name = self.target._qualified(table)
        with self.target._lock, self.target._transaction(table):
            have = {r[0] for r in self.con.execute(f"DESCRIBE {name}").fetchall()}
            refuse_other_mode(table, name, have, mode, "that lake table")
            if mode == "scd2" and b.COMMIT_TS in have and b.VALID_FROM not in have:
                self.con.execute(f"ALTER TABLE {name} RENAME COLUMN {b.COMMIT_TS} TO {b.VALID_FROM}")
                have = (have - {b.COMMIT_TS}) | {b.VALID_FROM}
            for column, _, duck, _ in EXTRA[mode]:
                if column not in have:
                    self.con.execute(f"ALTER TABLE {name} ADD COLUMN {column} {duck}")
            if mode == "changelog":
                self.con.execute(f"UPDATE {name} SET {b.OP} = 'I' WHERE {b.OP} IS NULL")
            elif mode == "scd2":
                self._partition(name)
                self.con.execute(f"UPDATE {name} SET {b.CURRENT} = true WHERE {b.CURRENT} IS NULL")
            self._set_offset(table, mode, log_offset, own=True)

    def _partition(self, name: str) -> None:
        """scd2: open and closed versions in files of their own (``_hr_current`` partitions), so closing a
        batch's versions reads the open ones only, whatever the history holds (docs/history.md)."""
        self.con.execute(f"ALTER TABLE {name} SET PARTITIONED BY ({b.CURRENT})")

    def previous(self, table: TableSchema, keys: list[Key], own: Mode | None = None) -> dict[Key, b.Row]:
        source = self.target._qualified(table)
        if own is not None:
            source = f"({rows_now(table, own, source, quote_ident)})"
        on = " AND ".join(f"m.{quote_ident(k)} = {cast_in('k.' + quote_ident(k), table.column(k).type)}"
                          for k in table.key)
        cols = ", ".join(cast_out(f"m.{quote_ident(c.name)}", c.type) for c in table.columns)
        with self.target._lock:
            self.con.register("hr_keys", key_table(table, keys))
            try:
                rows = tuples(self.con.execute(f"SELECT {cols} FROM {source} m JOIN hr_keys k ON {on}").arrow())
            finally:
                self.con.unregister("hr_keys")
        out = {}
        for r in rows:
            row = dict(zip(table.column_names, r, strict=True))
            out[tuple(row[k] for k in table.key)] = row
        return out

    def _follow_columns(self, table: TableSchema, name: str) -> None:
        have = {r[0]: r[1] for r in self.con.execute(f"DESCRIBE {name}").fetchall()}
        for c in table.columns:
            if c.name not in have:
                self.con.execute(f"ALTER TABLE {name} ADD COLUMN {quote_ident(c.name)} {duck_type(c.type)}")
            elif have[c.name] != self._type_name(duck_type(c.type)):
                self.con.execute(f"ALTER TABLE {name} ALTER {quote_ident(c.name)} SET DATA TYPE {duck_type(c.type)}")

    def _type_name(self, duck: str) -> str:
        row = self.con.execute(f"SELECT typeof(CAST(NULL AS {duck}))").fetchone()
        return str(row[0]) if row else duck

    def write(self, table: TableSchema, mode: Mode, built: Built, log_offset: int, own: bool = False) -> None:
        name = self.name(table, mode, own)
        shape = (table.oid, name, tuple((c.name, duck_type(c.type)) for c in table.columns))
        try:
            with self.target._lock:
                with self.target._transaction(table):
                    if shape not in self._followed:
                        self._follow_columns(table, name)
                    if isinstance(built, (list, pa.Table)):
                        self._insert(table, mode, name, built)
                    elif isinstance(built, b.Scd2Batch):
                        self._scd2(table, name, built)
                    else:
                        self._soft_delete(table, name, built)
                    self._set_offset(table, mode, log_offset, own)
                # its small writes went into the catalog as the mirror's do (``inlining``)
                self.target._inlined.committed(
                    self.con, L, [(self.target._schema(table), _table_name(table, mode, own), _written(built))])
        except BaseException:
            self._forget(table)
            raise
        self._followed.add(shape)
        self._offsets[(table.oid, mode, own)] = log_offset

    def _insert(self, table: TableSchema, mode: Mode, name: str, rows: list[b.Row] | pa.Table) -> None:
        if not len(rows):
            return
        self._with("hr_rows", rows if isinstance(rows, pa.Table) else to_arrow(table, mode, rows),
                   self._insert_sql(table, mode, name))

    def _insert_sql(self, table: TableSchema, mode: Mode, name: str, where: str = "") -> str:
        """SQL: the rows of ``hr_rows`` (``tables.arrow_schema``'s columns) into the ``mode`` table ``name``."""
        cols = [quote_ident(c.name) for c in table.columns] + [n for n, _, _, _ in EXTRA[mode]]
        values = [cast_in(quote_ident(c.name), c.type) for c in table.columns] + [n for n, _, _, _ in EXTRA[mode]]
        return f"INSERT INTO {name} ({', '.join(cols)}) SELECT {', '.join(values)} FROM hr_rows{where and ' WHERE ' + where}"

    def _with(self, relation: str, rows: pa.Table, sql: str) -> None:
        self.con.register(relation, rows)
        try:
            self.con.execute(sql)
        finally:
            self.con.unregister(relation)

    def _events(self, table: TableSchema, events: dict[Key, b.Event]) -> pa.Table:
        keys = key_table(table, list(events))
        at = list(events.values())
        return (keys.append_column(b.LSN, pa.array([e.lsn for e in at], pa.int64()))
                .append_column(b.SEQ, pa.array([e.seq for e in at], pa.int64()))
                .append_column(b.COMMIT_TS, pa.array([e.ts for e in at], pa.timestamp("us", tz="UTC"))))

    def _on_key(self, table: TableSchema, row: str, other: str) -> str:
        return " AND ".join(f"{row}.{quote_ident(k)} = {cast_in(other + '.' + quote_ident(k), table.column(k).type)}"
                            for k in table.key)

    def _scd2(self, table: TableSchema, name: str, batch: b.Scd2Batch) -> None:
        close = f"{b.VALID_TO} = {{ts}}, {b.CURRENT} = false, {b.END_LSN} = {{lsn}}, {b.END_SEQ} = {{seq}}"
        if len(batch.closes):
            closes = batch.closes if isinstance(batch.closes, pa.Table) else self._events(table, batch.closes)
            self._with("hr_closes", closes,
                       f"UPDATE {name} AS v SET {close.format(ts='c.' + b.COMMIT_TS, lsn='c.' + b.LSN, seq='c.' + b.SEQ)}"
                       f" FROM hr_closes c WHERE v.{b.CURRENT} AND {self._on_key(table, 'v', 'c')}"
                       f" AND {written_before('v', 'c')}")
        if (t := batch.truncate) is not None:
            self.con.execute(
                f"UPDATE {name} SET {close.format(ts='?', lsn=t.lsn, seq=t.seq)} WHERE {b.CURRENT} AND "
                f"({b.LSN} < {t.lsn} OR ({b.LSN} = {t.lsn} AND {b.SEQ} < {t.seq}))", [t.ts])
        self._insert(table, "scd2", name, batch.versions)

    def _soft_delete(self, table: TableSchema, name: str, batch: b.SoftDeleteBatch) -> None:
        mark = f"{b.DELETED_AT} = {{ts}}, {b.COMMIT_TS} = {{ts}}, {b.LSN} = {{lsn}}, {b.SEQ} = {{seq}}"
        deletes = None if not len(batch.deletes) else (
            batch.deletes if isinstance(batch.deletes, pa.Table) else self._events(table, batch.deletes))
        rows = None if not len(batch.rows) else (
            batch.rows if isinstance(batch.rows, pa.Table) else to_arrow(table, "soft_delete", list(batch.rows.values())))
        if deletes is not None or rows is not None:
            self._soft_delete_keys(table, name, deletes, rows)
        if (t := batch.truncate) is not None:
            self.con.execute(
                f"UPDATE {name} SET {mark.format(ts='?', lsn=t.lsn, seq=t.seq)} WHERE {b.DELETED_AT} IS NULL AND "
                f"({b.LSN} < {t.lsn} OR ({b.LSN} = {t.lsn} AND {b.SEQ} < {t.seq}))", [t.ts, t.ts])

    def _soft_delete_keys(self, table: TableSchema, name: str, deletes: pa.Table | None, rows: pa.Table | None) -> None:
        """The batch's keys in one read of the table (``hr_found``: each key's row with the change it meets
        and whether it was written before it), then by ``rowid``: a deleted key's live row written before
        its delete is marked deleted (rewritten with the delete's time and position), a written key's row
        written before its change is replaced by the batch's row; a row written after the change (the
        batch replayed) stays, and the batch's row for that key is not inserted."""
        keys = ", ".join(quote_ident(k) for k in table.key)
        meets = " UNION ALL ".join(
            f"SELECT {keys}, {b.LSN}, {b.SEQ}, {b.COMMIT_TS}, {gone} AS hr_gone FROM {relation}"
            for relation, gone, found in (("hr_deletes", "true", deletes), ("hr_rows", "false", rows)) if found is not None)
        for relation, found in (("hr_deletes", deletes), ("hr_rows", rows)):
            if found is not None:
                self.con.register(relation, found)
        try:
            self.con.execute(
                f"CREATE OR REPLACE TEMP TABLE hr_found AS SELECT v.*, v.rowid AS hr_rowid, c.hr_gone,"
                f" c.{b.LSN} AS hr_c_lsn, c.{b.SEQ} AS hr_c_seq, c.{b.COMMIT_TS} AS hr_c_ts,"
                f" {written_before('v', 'c')} AS hr_older FROM {name} v JOIN ({meets}) c ON {self._on_key(table, 'v', 'c')}")
            marked = f"hr_gone AND hr_older AND {b.DELETED_AT} IS NULL"
            self.con.execute(f"DELETE FROM {name} WHERE rowid IN (SELECT hr_rowid FROM hr_found WHERE"
                             f" ({marked}) OR (NOT hr_gone AND hr_older))")
            self.con.execute(
                f"INSERT INTO {name} SELECT * EXCLUDE (hr_rowid, hr_gone, hr_c_lsn, hr_c_seq, hr_c_ts, hr_older)"
                f" REPLACE (hr_c_ts AS {b.DELETED_AT}, hr_c_ts AS {b.COMMIT_TS}, hr_c_lsn AS {b.LSN},"
                f" hr_c_seq AS {b.SEQ}) FROM hr_found WHERE {marked}")
            if rows is not None:
                newer = (f"NOT EXISTS (SELECT 1 FROM hr_found f WHERE NOT f.hr_gone AND NOT f.hr_older"
                         f" AND {self._on_key(table, 'f', 'hr_rows')})")
                self.con.execute(self._insert_sql(table, "soft_delete", name, newer))
        finally:
            self.con.execute("DROP TABLE IF EXISTS hr_found")
            for relation, found in (("hr_deletes", deletes), ("hr_rows", rows)):
                if found is not None:
                    self.con.unregister(relation)

def _table_name(table: TableSchema, mode: Mode, own: bool) -> str:
    """The history table's name in its schema, unquoted (``own``: the table's own name)."""
    return table.target_table if own else history_table(table.target_table, mode)


def _written(built: Built) -> int:
    """About how many rows a history batch writes (its inserts; an update in place counts once)."""
    parts = [built] if isinstance(built, (list, pa.Table)) else \
        [built.closes, built.versions] if isinstance(built, b.Scd2Batch) else [built.rows, built.deletes]
    return sum(p.num_rows if isinstance(p, pa.Table) else len(p) for p in parts)


def writer(target: Any) -> DuckLakeHistory:
    """The target's history writer (one per target, kept on it)."""
    found: DuckLakeHistory | None = getattr(target, "_history", None)
    if found is None:
        found = DuckLakeHistory(target)
        target._history = found
    return found
