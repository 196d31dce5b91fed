"""The binlog stream as capture sees it, and what it starts from after a restart.

``PositionStream`` wraps ``BinlogStream``: it turns binlog progress past untracked transactions into
empty transactions capture can register, words the errors of tracked tables the binlog dropped, and
keeps tables' names in state when they are renamed (``names.py``). ``renamed_tables`` gives start-up
the names tracked tables have now; ``newest.py`` the schemas the stream starts from.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg

from headrace.core.changes import Begin, Commit, Event
from headrace.core.names import TableName
from headrace.core.schema import TableSchema
from headrace.source.mysql import catalog
from headrace.source.mysql.identity import dropped_message
from headrace.source.mysql.names import TableNames, recorded_names
from headrace.source.mysql.newest import staged_schemas
from headrace.source.mysql.position import format_position


class PositionStream:
    """The binlog stream, plus an empty transaction whenever the binlog moved past transactions that
    touch no tracked table (or DDL): capture registers that position, as a PostgreSQL heartbeat's
    commit lets it, so an idle pipeline is caught up and a restart does not read them again."""

    forwardable = 0  # a MySQL server keeps no position of ours (``BinlogStream.acknowledge``)

    def __init__(self, inner: Any, start: int, known: Callable[[], dict[int, TableSchema]] = dict,
                 names: TableNames | None = None) -> None:
        self.inner = inner
        self._names = names  # records a table's new name before capture can pass its RENAME (names.py)
        self._named: dict[int, TableName] = {}  # oid -> the name last recorded or known
        self._known = known  # state's schemas: a dropped table's name when the stream never saw its rows
        self._sent = start  # the end of the last transaction handed to capture
        self._open = False  # a Begin was handed over without its Commit yet
        self._reported: dict[int, str] = {}  # tables dropped -> message (``new_table_errors``)
        # Held while the stream reads: a copy tracking a table again (``schema_at``) does it between reads.
        self.lock = threading.Lock()

    def read(self, max_messages: int, timeout: float) -> list[tuple[int, Event]]:
        with self.lock:
            events: list[tuple[int, Event]] = self.inner.read(max_messages, timeout)
        while self.inner.renames:  # read before the events are handed over: capture cannot pass them yet
            oid, name, at = self.inner.renames.pop(0)
            self.record_name(oid, TableName(*name), at)
        for _pos, ev in events:
            if isinstance(ev, Begin):
                self._open = True
            elif isinstance(ev, Commit):
                self._open = False
                self._sent = max(self._sent, ev.end_lsn)
        moved = int(self.inner.position)
        if not self._open and moved > self._sent:
            events += [(moved, Begin(moved, 0, 0)), (moved, Commit(moved, moved, 0, self.inner.token))]
            self._sent = moved
        return events

    def record_name(self, oid: int, name: TableName, position: int) -> None:
        """Keep table ``oid``'s name in state when it is not the one last kept (a RENAME TABLE, a table
        copied again under another name): durable before capture registers a position past it."""
        known = self._named.get(oid)
        if known is None:
            shape = self._known().get(oid)
            known = shape.table_name if shape is not None else None
        if known != name and self._names is not None:
            self._names.record(oid, name, position)
        self._named[oid] = name

    def acknowledge(self, pos: int) -> None:
        self.inner.acknowledge(pos)

    def tables_created(self) -> bool:
        created, self.inner.tables_created = self.inner.tables_created > 0, 0
        return created

    def new_table_errors(self) -> dict[int, str]:
        """Tracked tables the binlog dropped since the last call (id -> the message naming the fix), for
        capture to hand to the run loop, which errors each (``run.table_watch``)."""
        for oid in [o for o in self._reported if o not in self.inner.dropped]:
            del self._reported[oid]  # tracked again (resync): a later drop is news again
        new: dict[int, str] = {}
        for oid, at in self.inner.dropped.items():
            if oid in self._reported:
                continue
            shape = self.inner._schemas.get(oid) or self._known().get(oid)
            name = self.inner.identities.dropped_names.get(oid) or (
                (shape.schema, shape.name) if shape is not None else None)
            created = self.inner.created.get(name) if name is not None else None
            label = str(TableName(*name)) if name is not None else f"with id {oid}"
            new[oid] = self._reported[oid] = dropped_message(
                label, format_position(at), format_position(created) if created is not None else None)
        return new

    def close(self) -> None:
        self.inner.close()
        if self._names is not None:
            self._names.close()


def renamed_tables(state_dsn: str | None, pipeline: str) -> dict[int, TableName]:
    """Tables the pipeline tracks whose name now is not the one their id was made from (renamed since
    first tracked): id -> name now, from each table's newest schema (staged, else state's). Empty
    before the first run, or when state cannot be read (then the start-up check says so)."""
    from headrace.state.store import StateStore

    if not state_dsn:
        return {}
    try:
        state = StateStore(state_dsn, pipeline)
        try:
            if not state.installed():
                return {}
            staged = staged_schemas(state)
            newest = {row.oid: staged.get(row.oid, row.schema).table_name for row in state.tables()}
            newest.update({oid: name for oid, name in recorded_names(state.conn, pipeline).items() if oid in newest})
        finally:
            state.close()
    except psycopg.Error:
        return {}
    return {oid: name for oid, name in newest.items() if catalog.table_id(name.schema, name.name) != oid}
