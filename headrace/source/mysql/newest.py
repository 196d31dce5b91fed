"""The schemas a MySQL/MariaDB binlog stream starts from: state's, each replaced by the table's newest
staged schema not applied yet, so column ids given by schema changes survive a restart."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from headrace.core.names import TableName
from headrace.core.schema import TableSchema

if TYPE_CHECKING:
    from headrace.state.store import StateStore


class NewestSchemas:
    """State's schemas for the stream (``BinlogStream(known=...)``), each replaced by the table's last
    staged schema when that is newer (staged, not applied yet): column ids given to a renamed or added
    column survive a restart. The same objects come back until state gives a table a new schema
    (tracked or copied again), which the stream then adopts.

    The stream asks at every TABLE_MAP; ``known`` (capture's tracked tables) hands back the same dict
    until a table is tracked or copied again (``CaptureLoop.track`` replaces it, never changes it in
    place), so the map is rebuilt only then: a TABLE_MAP costs a lookup, not a copy of every table's
    schema."""

    def __init__(self, known: Callable[[], dict[int, TableSchema]], staged: dict[int, TableSchema],
                 names: dict[int, TableName] | None = None) -> None:
        self._known = known
        self._staged = staged
        self._names = names or {}  # the names recorded in state (names.py): newer than any schema's
        self._given: dict[int, tuple[TableSchema, TableSchema]] = {}  # oid -> (state's, the one handed out)
        self._built: tuple[dict[int, TableSchema], dict[int, TableSchema]] | None = None  # (known, map)

    def __call__(self) -> dict[int, TableSchema]:
        known = self._known()
        if self._built is not None and self._built[0] is known:
            return self._built[1]
        out: dict[int, TableSchema] = {}
        for oid, schema in known.items():
            given = self._given.get(oid)
            if given is None or given[0] is not schema:
                # first sight: the staged one if there is one; a schema tracked again: state's
                newest = self._staged.get(oid, schema) if given is None else schema
                name = self._names.get(oid) if given is None else None
                if name is not None and name != newest.table_name:  # renamed, and no row staged since
                    newest = replace(newest, schema=name.schema, name=name.name)
                given = self._given[oid] = (schema, newest)
            out[oid] = given[1]
        self._built = (known, out)
        return out


def staged_schemas(state: StateStore) -> dict[int, TableSchema]:
    """Each table's schema in its newest staged log entry not applied yet (id -> schema)."""
    index = state.log_index
    out: dict[int, TableSchema] = {}
    for oid, tail in index.tails().items():
        if tail > index.cursor(oid):
            entries = index.entries_through(oid, tail, 1)
            if entries:
                out[oid] = entries[-1].schema
    return out


def staged_in_state(state_dsn: str | None, pipeline: str) -> dict[int, TableSchema]:
    """``staged_schemas`` of the pipeline's state (empty before the first run)."""
    from headrace.state.store import StateStore

    if not state_dsn:
        return {}
    state = StateStore(state_dsn, pipeline)
    try:
        return staged_schemas(state) if state.installed() else {}
    finally:
        state.close()
