"""Real DuckLake lakes for fan-out tests: a source table, tenant lakes, and what each should hold."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb

from headrace.fanout.config import FanoutConfig, parse_fanout_config
from headrace.targets.ducklake import extension

Row = tuple[Any, ...]


_shared: list[duckdb.DuckDBPyConnection] = []


@contextlib.contextmanager
def lake(catalog: str, data_path: str) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection with the lake attached as ``l``, detached afterwards (frees the file lock).

    One DuckDB connection serves every test: loading the extensions costs ~0.5 s per connection.
    """
    if not _shared:
        con = duckdb.connect()
        extension.load_extension(con, "ducklake", "test")
        extension.load_extension(con, "postgres_scanner", "test")
        _shared.append(con)
    con = _shared[0]
    extension.attach(con, extension.parse_catalog(catalog), data_path, "l")
    try:
        yield con
    finally:
        con.execute("USE memory")
        con.execute("DETACH l")


class Setup:
    """A source lake with ``main.events`` and N tenant lake locations under ``root``."""

    def __init__(self, root: Path, source_catalog: str | None = None) -> None:
        self.root = root
        self.source_catalog = source_catalog or str(root / "src" / "meta.ducklake")
        self.source_data = str(root / "src" / "data")
        with self.source() as con:
            con.execute(
                "CREATE TABLE IF NOT EXISTS l.main.events (event_id BIGINT, company VARCHAR, payload VARCHAR)"
            )

    def source(self) -> contextlib.AbstractContextManager[duckdb.DuckDBPyConnection]:
        return lake(self.source_catalog, self.source_data)

    def write(self, *sql: str) -> None:
        """Run statements on the source, each its own snapshot (a list in one string: one txn)."""
        with self.source() as con:
            for statement in sql:
                con.execute(statement)

    def dest_catalog(self, dest_id: str) -> str:
        return str(self.root / dest_id / "meta.ducklake")

    def dest_data(self, dest_id: str) -> str:
        return str(self.root / dest_id / "data")

    def config(self, tenants: dict[str, str], **extra: Any) -> FanoutConfig:
        """A config routing ``company`` to one DuckDB-file lake per tenant (dest id -> value)."""
        routing = {"field": "company", "key_columns": ["event_id"], **extra.pop("routing", {})}
        raw: dict[str, Any] = {
            "name": "events-fanout",
            "source": {"ducklake": {"catalog": self.source_catalog, "data_path": self.source_data,
                                    "table": "main.events"}},
            "routing": routing,
            "defaults": {"ducklake": {"catalog": str(self.root / "{id}" / "meta.ducklake"),
                                      "data_path": str(self.root / "{id}" / "data"), "table": "events"}},
            "destinations": [{"id": d, "routing_value": v, **extra.pop(d, {})} for d, v in tenants.items()],
            "retry": {"initial_seconds": 0.05, "max_seconds": 0.2, "give_up_after": 3},
            "poll": {"interval_seconds": 0.05},
            **extra,
        }
        return parse_fanout_config(raw, "test")

    def expected(self, value: str) -> list[Row]:
        """The source rows of one tenant, as the tenant lake should hold them."""
        with self.source() as con:
            return sorted(con.execute("SELECT * FROM l.main.events WHERE company = ?", [value]).fetchall())

    def held(self, dest_id: str, catalog: str | None = None) -> list[Row]:
        """What a tenant lake holds."""
        with lake(catalog or self.dest_catalog(dest_id), self.dest_data(dest_id)) as con:
            return sorted(con.execute("SELECT * FROM l.main.events").fetchall())


def run_caught_up(config: FanoutConfig) -> dict[str, Any]:
    """Run one instance until caught up, closing every lake; the metrics as a dict."""
    from headrace.fanout.runner import FanoutRunner

    runner = FanoutRunner(config)
    try:
        assert runner.run(until_caught_up=True) == 0
        return runner.metrics.as_dict()
    finally:
        runner.close()
