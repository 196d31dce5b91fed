"""The schemas a MySQL/MariaDB binlog stream starts from: state's, each replaced by the table's newest
staged schema not applied yet, so column ids given by schema changes survive a restart."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from headrace.core.schema import TableSchema

if TYPE_CHECKING:
    from headrace.state.store import StateStore


class NewestSchemas:
    """State's schemas for the stream (``BinlogStream(known=...)``), each replaced by the table's last
    staged schema when that is newer (staged, not applied yet): column ids given to a renamed or added
    column survive a restart. The same objects come back until state gives a table a new schema
    (tracked or copied again), which the stream then adopts.

    The stream asks for them at every TABLE_MAP; ``generation`` (the source's count of changes to the
    captured table set, ``MySqlSource.capture_tables``) lets the map be rebuilt only when that count
    moved, so a TABLE_MAP costs a dict lookup, not a copy of every table's schema. It moves before the
    added table's copy takes its snapshot, so no row event after the snapshot meets the old map.
    Without ``generation`` the map is rebuilt at every call."""

    def __init__(self, known: Callable[[], dict[int, TableSchema]], staged: dict[int, TableSchema],
                 generation: Callable[[], int] | None = None) -> None:
        self._known = known
        self._staged = staged
        self._generation = generation
        self._given: dict[int, tuple[TableSchema, TableSchema]] = {}  # oid -> (state's, the one handed out)
        self._built: tuple[int, dict[int, TableSchema]] | None = None  # (generation, map) last built

    def __call__(self) -> dict[int, TableSchema]:
        now = self._generation() if self._generation is not None else None
        if now is not None and self._built is not None and self._built[0] == now:
            return self._built[1]
        out: dict[int, TableSchema] = {}
        for oid, schema in self._known().items():
            given = self._given.get(oid)
            if given is None or given[0] is not schema:
                # first sight: the staged one if there is one; a schema tracked again: state's
                newest = self._staged.get(oid, schema) if given is None else schema
                given = self._given[oid] = (schema, newest)
            out[oid] = given[1]
        if now is not None:
            self._built = (now, out)
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
