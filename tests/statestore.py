"""A state store of its own on the shared test server, for component tests of the staged log."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from headrace.core.schema import TableSchema
from headrace.state.store import StateStore


@contextmanager
def fresh_state(dsn: str, pipeline: str, *tables: TableSchema) -> Iterator[StateStore]:
    """A state store for ``pipeline`` (installed, with its meta row) tracking ``tables``; closed after."""
    store = StateStore(dsn, pipeline)
    store.install()
    store.ensure_meta("sysid", "slot", "pub", 0)
    for table in tables:
        store.add_table(table)
    try:
        yield store
    finally:
        store.close()
