"""The row events of ``binlog.BinlogStream``: each table's C plan, and the changes of each event.

A row event of a table with a C plan (``rows_native.row_specs``) is read whole in C from the
replication packet (``rows_native.BinlogConnection``, then ``_native_rows``); any other goes through
mysql-replication's event (``_rows``), its rows decoded in C where the plan allows, else in Python.
With ``staged`` the C path hands capture one ``staged`` bytes per change, else both give the events
of ``core.changes``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from headrace.core.changes import Delete, Event, Insert, Update
from headrace.core.schema import TableSchema
from headrace.source.mysql import rows_native
from headrace.source.mysql.types import binlog_converters, python_images

Converter = Callable[[Any], str | None]


class RowEvents:
    """The row-event half of ``BinlogStream`` (which sets these attributes up and owns the rest)."""

    native: bool  # row events decoded in C where the table's types allow
    staged: bool  # the C path hands over ``staged`` bytes
    _reader: Any  # mysql-replication's BinLogStreamReader
    _schemas: dict[int, TableSchema]  # headrace oid -> shape of its last TABLE_MAP
    _maps: dict[int, int]  # binlog table id -> headrace oid
    _plans: dict[int, rows_native.Plan]  # binlog table id -> the plan C reads its row events whole with
    _native: dict[int, tuple[TableSchema, list[rows_native.Spec] | None]]  # binlog table id -> (shape, specs)
    _keys: dict[int, tuple[TableSchema, list[int], Callable[[Any], Any]]]  # oid -> key places
    _converters: dict[int, tuple[TableSchema, list[str], list[Converter | None], list[Converter]]]

    def _begin(self, out: list[tuple[int, Event]]) -> int:
        raise NotImplementedError

    def _relation(self, oid: int, start: int, out: list[tuple[int, Event]]) -> None:
        raise NotImplementedError

    def _plan(self, table_id: int, binlog_columns: Any, shape: TableSchema) -> None:
        """The C decoder's plan for the rows of binlog table ``table_id`` (None: Python decodes them);
        with one, its row events are read whole in C (``rows_native.BinlogConnection``)."""
        planned = self._native.get(table_id)
        if planned is not None and planned[0] is shape:
            return
        # Each TABLE_MAP body seen anew gives a new shape object; its columns are mostly the last one's.
        same = planned is not None and planned[0].columns == shape.columns
        specs = planned[1] if same and planned is not None else (
            rows_native.row_specs(binlog_columns, shape.columns) if self.native else None)
        self._native[table_id] = (shape, specs)
        if specs is None:
            self._plans.pop(table_id, None)
        else:
            self._plans[table_id] = rows_native.plan(specs, self._maps[table_id], bool(shape.key))

    def _rows(self, event: Any, oid: int, out: list[tuple[int, Event]]) -> None:
        """A row event mysql-replication read (C declined it whole, or the table has no C plan)."""
        start = self._begin(out)
        self._relation(oid, start, out)
        planned = self._native.get(event.table_id)
        images = rows_native.decode(event, planned[1]) if planned is not None and planned[1] is not None else None
        if images is None:
            images = self._python_images(event, oid, self._schemas[oid])
        kind = 0 if isinstance(event, WriteRowsEvent) else 2 if isinstance(event, DeleteRowsEvent) else 1
        self._changes(start, kind, oid, images, out)

    def _native_rows(self, kind: int, table_id: int, log_pos: int, _size: int, images: list[Any],
                     out: list[tuple[int, Any]]) -> None:
        """A row event read whole in C (``rows_native.NativeRows``); mysql-replication never saw it."""
        self._reader.log_pos = log_pos  # where it resumes if it reconnects by itself
        oid = self._maps.get(table_id)
        if oid is None:  # pragma: no cover - plans are kept for mapped tables only
            return
        start = self._begin(out)
        self._relation(oid, start, out)
        if self.staged:
            out += [(start, change) for change in images]
        else:
            self._changes(start, kind, oid, images, out)

    def _changes(self, start: int, kind: int, oid: int, images: list[tuple[str | None, ...]],
                 out: list[tuple[int, Event]]) -> None:
        """The changes of one row event's ``images`` (kind 0 write, 1 update: before, after, ..., 2 delete)."""
        shape = self._schemas[oid]
        keys = self._keys.get(oid)
        if keys is None or keys[0] is not shape:  # the key's places, once per shape
            at = [i for i, name in enumerate(shape.column_names) if name in shape.key]
            keys = self._keys[oid] = (shape, at, rows_native.key_image(at, len(shape.columns)))
        _shape, at, key_only = keys
        keyed = bool(shape.key)
        if kind == 0:
            out += [(start, Insert(oid, row)) for row in images]
        elif kind == 2:
            out += [(start, Delete(oid, key_only(old) if keyed else old, "K" if keyed else "O")) for old in images]
        else:
            single = at[0] if len(at) == 1 else None
            for old, new in zip(images[::2], images[1::2], strict=True):
                if not keyed:
                    out.append((start, Update(oid, new, old, "O")))
                elif (old[single] != new[single]) if single is not None else any(old[i] != new[i] for i in at):
                    out.append((start, Update(oid, new, key_only(old), "K")))
                else:
                    out.append((start, Update(oid, new)))

    def _python_images(self, event: Any, oid: int, shape: TableSchema) -> list[tuple[str | None, ...]]:
        """The event's row images (an UPDATE: before, after, ...) as text, through mysql-replication."""
        converters = self._converters.get(oid)
        if converters is None or converters[0] is not shape:
            converters = self._converters[oid] = (shape, *binlog_converters(shape.columns))
        return python_images(event.rows, isinstance(event, UpdateRowsEvent), converters[1:], shape.columns,
                             event.columns)
