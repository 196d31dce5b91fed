"""How a batch reaches the history tables, exactly once: the part every target shares.

Per table and mode, the target keeps the staged-log offset its history table holds, committed with
its rows (``HistoryWriter.write``). A batch is written into a history table only when that offset
is below the batch's last offset, so a batch replayed after a crash (between the history commit and
the mirror's, or the mirror's and the cursor's) is written once. The history tables are written
before the mirror: the mirror then still holds the rows before the batch, the previous versions a
change does not carry (TOAST columns left unchanged). A history table beside the mirror starts as
the mirror's rows at the batch's cursor (``HistoryWriter.start``), so it also starts right for a
table copied before its history mode was configured.

A table in one history mode has no mirror (``own``): the table itself is the history table. The
initial copy lands in it in the mirror's shape, and its first batch turns it into the mode's shape
(the copy's rows become ``I`` rows, open versions, live rows); the values a change does not carry
come from the table itself (scd2: the open version; soft_delete: the live row; changelog: the key's
last change), and each batch commits the table's cursor with its rows and offset.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TypeAlias

import pyarrow as pa

from headrace.core.errors import ConfigError
from headrace.core.position import Position
from headrace.core.schema import TableSchema
from headrace.core.spark_types import ValueRules
from headrace.history import build
from headrace.history.changes import (
    Change,
    Key,
    changelog_arrow,
    changes_of,
    read_staged,
    scd2_arrow,
    soft_delete_arrow,
)
from headrace.history.config import Mode
from headrace.logs import event

log = logging.getLogger("headrace.history")
Built: TypeAlias = list[build.Row] | pa.Table | build.Scd2Batch | build.SoftDeleteBatch  # a changelog: rows or Arrow


class HistoryWriter(ABC):
    """A target's history tables; every write commits with its offset. ``own``: the table's one mode,
    under its own name, without a mirror (else ``<table>__<mode>`` beside the mirror)."""

    writes_in_place: bool = False  # the target writes a history mode under the table's own name (``own``)

    @abstractmethod
    def applied_offset(self, table: TableSchema, mode: Mode, own: bool = False) -> int | None:
        """The staged-log offset ``table``'s ``mode`` table holds; None when it does not exist yet."""

    @abstractmethod
    def start(self, table: TableSchema, mode: Mode, log_offset: int, own: bool = False) -> None:
        """Create the history table from the mirror's rows (which are at ``log_offset``), in one commit
        with that offset; ``own``: turn the table's copy into the mode's table in place."""

    @abstractmethod
    def previous(self, table: TableSchema, keys: list[Key], own: Mode | None = None) -> dict[Key, build.Row]:
        """The rows of ``keys`` (source columns) before the batch: the mirror's, before its apply, or
        with ``own`` the current rows of the table written in that mode under its own name."""

    @abstractmethod
    def write(self, table: TableSchema, mode: Mode, built: Built, log_offset: int, own: bool = False) -> None:
        """Write one batch's ``built`` rows and record ``log_offset``, in one commit (with ``own``, the
        table's cursor too); the history table first follows ``table``'s columns (an added column is
        added; a dropped one stays, NULL on)."""


def refuse_keyless(table: TableSchema, mode: Mode) -> None:
    """scd2 and soft_delete follow rows by key: a table without one is refused with the fix."""
    if mode != "changelog" and not table.key:
        raise ConfigError(
            f"history mode {mode} needs a key and table {table.qualified_name} has none (REPLICA IDENTITY"
            f" FULL): add a primary key, or write it as [changelog] or [mirror, changelog] in history.tables")


def build_mode(table: TableSchema, mode: Mode, changes: list[Change], previous: build.Previous) -> Built:
    """What ``changes`` write into ``table``'s ``mode`` table (``previous``: the rows before them)."""
    if mode == "changelog":
        return build.changelog_rows(table, changes, previous)
    if mode == "scd2":
        return build.scd2_batch(table, changes, previous)
    return build.soft_delete_batch(table, changes, previous)


def apply_history(writer: HistoryWriter, table: TableSchema, modes: Sequence[Mode],
                  entries: Sequence[tuple[int, str]], skip: Position | None, rules: ValueRules,
                  cursor: int, own: bool = False) -> list[Mode]:
    """Write the batch's staged files (``entries``: offset and path, after ``cursor``) into each history
    table of ``modes``, each from the first file it does not hold yet (a batch replayed after a crash
    may be cut otherwise than the one a history table took); the modes written. ``own``: ``modes`` is
    the table's one mode, written under its own name (no mirror)."""
    if not entries:
        return []
    if own and (len(modes) != 1 or not writer.writes_in_place):
        raise ConfigError(f"table {table.qualified_name}: a history mode in place of the mirror (history mode"
                          f" {list(modes)}) is built for DuckLake and Iceberg; on this target write it beside the"
                          f" mirror, as [mirror, {', '.join(modes)}] in history.tables")
    last = max(offset for offset, _ in entries)
    held: dict[Mode, int] = {}
    for mode in modes:
        refuse_keyless(table, mode)
        offset = writer.applied_offset(table, mode, own)
        if offset is None:
            writer.start(table, mode, cursor, own)
            offset = cursor
        elif offset < cursor:
            # The mirror moved on without this table: a resync's copy, or the mode left out of the config
            # for a while. What the mirror took meanwhile is not in the history (docs/history.md, resync).
            event(log, "history.gap", logging.WARNING, table=table.qualified_name, mode=mode,
                  history_offset=offset, mirror_offset=cursor)
            offset = cursor
        if offset < last:
            held[mode] = offset
    in_place = modes[0] if own else None
    staged: dict[int, pa.Table] = {}
    read: dict[int, list[Change]] = {}
    before: dict[int, build.Previous] = {}  # per history offset: the rows before its first change
    for mode, offset in held.items():
        if offset not in staged:
            staged[offset] = read_staged([p for o, p in entries if o > offset])
        built: Built | None = changelog_arrow(staged[offset], table, skip, rules)  # None: TOAST to fill, below
        if built is not None:
            if mode == "soft_delete":
                fast = soft_delete_arrow(built, table)  # None: a TRUNCATE in the batch
                built = build.SoftDeleteBatch(rows=fast[0], deletes=fast[1]) if fast is not None else None
            elif mode == "scd2":
                opened = scd2_arrow(built, table)  # None: a TRUNCATE in the batch
                built = build.Scd2Batch(versions=opened[0], closes=opened[1]) if opened is not None else None
        if built is None:
            if offset not in read:
                read[offset] = changes_of(staged[offset], table, skip, rules)
            if offset not in before:
                mirror: build.Previous = lambda keys: writer.previous(table, keys, in_place)  # noqa: E731
                # A replay after a crash between this table's commit and the mirror's: the files it holds
                # are not in the mirror yet, and the values a later change leaves out are theirs.
                held_files = [p for o, p in entries if cursor < o <= offset]
                before[offset] = (build.after(table, changes_of(read_staged(held_files), table, skip, rules), mirror)
                                  if held_files else mirror)
            built = build_mode(table, mode, read[offset], before[offset])
        writer.write(table, mode, built, last, own)
    return list(held)
