"""The DuckDB hub: one connection with the source lake and a bounded, LRU set of destination lakes.

Attaching a lake opens its catalog (a DuckDB file lock, or Postgres connections), so with hundreds
of destinations only ``max_open`` stay attached; the least recently used is detached to make room.
A DuckDB-file catalog can be attached only once per process, hence one shared connection in which
every lake has one alias.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import duckdb

from headrace.core.errors import ConfigError, HeadraceError, TransientError
from headrace.fanout.config import LakeTable
from headrace.logs import event
from headrace.targets.ducklake import extension

log = logging.getLogger("headrace.fanout.pool")

SOURCE_ALIAS = "hr_src"


class LakePool:
    """Attach lakes on demand into one DuckDB connection, detaching the least recently used."""

    def __init__(self, max_open: int) -> None:
        self.max_open = max_open
        self.con = duckdb.connect()
        self.con.execute("SET TimeZone = 'UTC'")
        self._loaded: set[str] = set()
        self._open: OrderedDict[str, str] = OrderedDict()  # lake key -> alias, oldest first
        self._next = 0
        self.evictions = 0
        self.attaches = 0

    def attach_source(self, lake: LakeTable) -> str:
        """Attach the source lake (never evicted)."""
        self._attach(lake, SOURCE_ALIAS, "source.ducklake")
        return SOURCE_ALIAS

    def acquire(self, lake: LakeTable, what: str) -> str:
        """The alias of ``lake``, attaching it (and evicting the LRU lake) when needed."""
        key = _lake_key(lake, what)
        alias = self._open.get(key)
        if alias is not None:
            self._open.move_to_end(key)
            return alias
        while len(self._open) >= self.max_open:
            old_key, old_alias = self._open.popitem(last=False)
            self._detach(old_alias)
            self.evictions += 1
            event(log, "fanout.pool.evict", alias=old_alias, open=len(self._open))
        self._next += 1
        alias = f"hr_d{self._next}"
        self._attach(lake, alias, what)
        self._open[key] = alias
        self.attaches += 1
        return alias

    def release(self, lake: LakeTable, what: str) -> None:
        """Detach ``lake`` (after an error: the next acquire starts from a fresh ATTACH)."""
        try:
            key = _lake_key(lake, what)
        except HeadraceError:  # its catalog cannot even be named (catalog_env unset): never attached
            return
        alias = self._open.pop(key, None)
        if alias is not None:
            self._detach(alias)

    @property
    def open_count(self) -> int:
        return len(self._open)

    def close(self) -> None:
        """Close the connection (detaches every lake)."""
        self._open.clear()
        self.con.close()

    def _attach(self, lake: LakeTable, alias: str, what: str) -> None:
        catalog = lake.resolved_catalog(what)
        self._load("ducklake", what)
        if catalog.kind == "postgres":
            self._load("postgres_scanner", what)
        elif catalog.kind == "sqlite":
            self._load("sqlite_scanner", what)
        try:
            extension.attach(self.con, catalog, lake.data_path, alias)
        except TransientError as exc:
            raise TransientError(f"{what}: {exc}") from exc
        except ConfigError as exc:
            # A missing Postgres database or a catalog being created elsewhere looks like a config
            # problem to DuckDB, but it can pass: the destination is retried with backoff.
            raise TransientError(f"{what}: {exc}") from exc
        except OSError as exc:
            raise TransientError(
                f"{what}: cannot create the data path {lake.data_path} ({exc}); check permissions"
            ) from exc

    def _load(self, name: str, what: str) -> None:
        if name not in self._loaded:
            extension.load_extension(self.con, name, what)
            self._loaded.add(name)

    def _detach(self, alias: str) -> None:
        try:
            self.con.execute(f"DETACH {alias}")
        except duckdb.Error as exc:  # e.g. the catalog went away; the alias is gone either way
            event(log, "fanout.pool.detach_failed", level=logging.WARNING, alias=alias,
                  error=str(exc).splitlines()[0])


def _lake_key(lake: LakeTable, what: str) -> str:
    return f"{lake.resolved_catalog(what).location}|{lake.data_path}"
