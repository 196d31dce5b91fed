"""What one batch of changes writes into each history table: pure functions, no engine.

Each function walks the batch's changes in commit order with the batch's running state per key, so
several changes to one key inside a batch give every version. The values a change does not carry
(TOAST columns an update left unchanged) come from the row as it was before: earlier in the batch,
else ``previous`` (the mirror's row read before the batch's mirror apply, or for a table without a
mirror its own current row, ``HistoryWriter.previous``; asked once, for the keys that need it). A
delete needs no row before: changelog writes the key's values, scd2 closes by key, soft_delete marks
the row in place.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pyarrow as pa

from headrace.core.position import Position
from headrace.core.schema import TableSchema
from headrace.history.changes import Change, Key, key_of

Row = dict[str, Any]
Previous = Callable[[list[Key]], dict[Key, Row]]  # the rows (source columns) of these keys before the batch

OP, COMMIT_TS, LSN, SEQ, XID = "_hr_op", "_hr_commit_ts", "_hr_lsn", "_hr_seq", "_hr_xid"
VALID_FROM, VALID_TO, CURRENT = "_hr_valid_from", "_hr_valid_to", "_hr_current"
END_LSN, END_SEQ = "_hr_end_lsn", "_hr_end_seq"
DELETED_AT = "_hr_deleted_at"


@dataclass(frozen=True)
class Event:
    """A moment in the source: position and commit time."""

    lsn: int
    seq: int
    ts: datetime

    @property
    def position(self) -> Position:
        return Position(self.lsn, self.seq)


def _event(change: Change) -> Event:
    return Event(change.lsn, change.seq, change.ts)


class _Versions:
    """The batch's running row per key (values after the latest change; None: no row), with the
    rows before the batch fetched once for the keys whose values a change does not carry."""

    def __init__(self, table: TableSchema, changes: list[Change], previous: Previous) -> None:
        self.table = table
        self.rows: dict[Key, Row | None] = {}
        wanted: list[Key] = []
        seen: set[Key] = set()
        for change in changes:
            if change.op == "T":
                seen.update(self.rows)  # after a truncate no earlier row is needed
                break
            key = key_of(table, change.old_key or change.values)
            if key not in seen and change.unchanged:  # only a TOAST column left unchanged needs the row before
                wanted.append(key)
            seen.add(key)
            if change.old_key:
                seen.add(key_of(table, change.values))
        self.before = previous(wanted) if wanted else {}

    def row(self, key: Key) -> Row | None:
        if key in self.rows:
            return self.rows[key]
        return self.before.get(key)

    def apply(self, change: Change) -> tuple[Key, Row | None, Key | None]:
        """Follow ``change``: its key, the row after it (None for a delete) and the old key of a key change."""
        table = self.table
        if change.op == "D":
            key = key_of(table, change.values)
            self.rows[key] = None
            return key, None, None
        old = key_of(table, change.old_key) if change.old_key else None
        key = key_of(table, change.values)
        base = self.row(old if old is not None else key) or {}
        row = {c: (base.get(c) if c in change.unchanged else change.values.get(c)) for c in table.column_names}
        if old is not None and old != key:
            self.rows[old] = None
        self.rows[key] = row
        return key, row, old if old != key else None

    def truncate(self) -> None:
        self.rows = {k: None for k in self.rows}
        self.before = {}


def after(table: TableSchema, changes: list[Change], previous: Previous) -> Previous:
    """``previous`` as it stands after ``changes``: the part of a replayed batch a history table holds
    already and the mirror has not applied (a crash between the two commits). A later change's values
    it does not carry come from those changes first, not from the mirror's older row."""
    if not table.key or not changes:
        return previous
    versions = _Versions(table, changes, previous)
    truncated = False
    for change in changes:
        if change.op == "T":
            versions.truncate()
            truncated = True
        else:
            versions.apply(change)

    def lookup(keys: list[Key]) -> dict[Key, Row]:
        rest = [k for k in keys if k not in versions.rows and not truncated]
        fetched = previous(rest) if rest else {}
        found = {k: versions.rows[k] if k in versions.rows else fetched.get(k) for k in keys}
        return {k: row for k, row in found.items() if row is not None}

    return lookup


def changelog_rows(table: TableSchema, changes: Iterable[Change], previous: Previous) -> list[Row]:
    """One row per change: I/U with the row after it, D with the key's values (a key change: a D of the
    old key then an I of the new one, at the change's position), T with no values."""
    changes = list(changes)
    versions = _Versions(table, changes, previous) if table.key else None
    out: list[Row] = []
    empty = dict.fromkeys(table.column_names)

    def emit(op: str, c: Change, values: Row) -> None:
        out.append({**empty, **values, OP: op, COMMIT_TS: c.ts, LSN: c.lsn, SEQ: c.seq, XID: c.xid})

    for c in changes:
        if c.op == "T":
            if versions is not None:
                versions.truncate()
            emit("T", c, {})
        elif versions is None:
            emit(c.op, c, c.values)  # keyless: the row image as sent (REPLICA IDENTITY FULL)
        else:
            key, row, old = versions.apply(c)
            if old is not None:
                emit("D", c, dict(zip(table.key, old, strict=True)))
                emit("I", c, row or {})
            elif row is None:
                emit("D", c, dict(zip(table.key, key, strict=True)))
            else:
                emit(c.op, c, row)
    return out


@dataclass
class Scd2Batch:
    """``truncate``: the batch's first TRUNCATE, closing every version open before the batch;
    ``closes``: per key, the change closing its version open before the batch (when before that
    truncate); ``versions``: every version the batch opens, closed or not."""

    truncate: Event | None = None
    closes: dict[Key, Event] | pa.Table = field(default_factory=dict)
    versions: list[Row] | pa.Table = field(default_factory=list)


def scd2_batch(table: TableSchema, changes: Iterable[Change], previous: Previous) -> Scd2Batch:
    """The versions the batch opens and the versions it closes (see ``Scd2Batch``)."""
    changes = list(changes)
    versions = _Versions(table, changes, previous)
    out = Scd2Batch()
    closes: dict[Key, Event] = {}
    opened: list[Row] = []
    out.closes, out.versions = closes, opened
    open_at: dict[Key, int] = {}  # key -> index in out.versions of its open version opened in this batch

    def close(key: Key, at: Event) -> None:
        if key in open_at:
            v = opened[open_at.pop(key)]
            v.update({VALID_TO: at.ts, CURRENT: False, END_LSN: at.lsn, END_SEQ: at.seq})
        elif out.truncate is None and key not in closes:
            closes[key] = at

    for c in changes:
        at = _event(c)
        if c.op == "T":
            for key in list(open_at):
                close(key, at)
            if out.truncate is None:
                out.truncate = at
            versions.truncate()
            continue
        key, row, old = versions.apply(c)
        close(old if old is not None else key, at)
        if row is not None:
            open_at[key] = len(opened)
            opened.append({**row, VALID_FROM: c.ts, VALID_TO: None, CURRENT: True, LSN: c.lsn,
                                 SEQ: c.seq, END_LSN: None, END_SEQ: None})
    return out


@dataclass
class SoftDeleteBatch:
    """``truncate``: the batch's first TRUNCATE, marking every row live before the batch deleted;
    ``rows``: per key touched before the batch, the row after the batch's last change to it (with
    its deletion time, or None while live); ``deletes``: keys whose last change deleted a row the
    batch never held (their row before the batch is marked deleted in place). Either as Python
    values, or as Arrow tables (``changes.soft_delete_arrow``: the rows in ``tables.arrow_schema``'s
    columns, the deletes as key columns, ``_hr_lsn``, ``_hr_seq``, ``_hr_commit_ts``)."""

    truncate: Event | None = None
    rows: dict[Key, Row] | pa.Table = field(default_factory=dict)
    deletes: dict[Key, Event] | pa.Table = field(default_factory=dict)


def soft_delete_batch(table: TableSchema, changes: Iterable[Change], previous: Previous) -> SoftDeleteBatch:
    """The rows the batch leaves per key, deleted ones kept with their deletion time."""
    changes = list(changes)
    versions = _Versions(table, changes, previous)
    out = SoftDeleteBatch()
    deletes: dict[Key, Event] = {}
    out.deletes = deletes
    held: dict[Key, Row] = {}  # the batch's latest full row per key (live or not)

    def mark(key: Key, at: Event) -> None:
        if key in held:
            row = held[key]
            if row[DELETED_AT] is None:
                row.update({DELETED_AT: at.ts, COMMIT_TS: at.ts, LSN: at.lsn, SEQ: at.seq})
        elif out.truncate is None:
            deletes[key] = at

    for c in changes:
        at = _event(c)
        if c.op == "T":
            for key in list(held):
                mark(key, at)
            if out.truncate is None:
                out.truncate = at
            versions.truncate()
            continue
        before = versions.row(key_of(table, c.old_key or c.values))
        key, row, old = versions.apply(c)
        if row is None or old is not None:
            gone = old if old is not None else key
            if gone not in held and before is not None and out.truncate is None:
                held[gone] = {**before, DELETED_AT: None, COMMIT_TS: None, LSN: None, SEQ: None}
            mark(gone, at)
        if row is not None:
            deletes.pop(key, None)
            held[key] = {**row, DELETED_AT: None, COMMIT_TS: c.ts, LSN: c.lsn, SEQ: c.seq}
    out.rows = held
    return out
