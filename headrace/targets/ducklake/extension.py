"""Open DuckDB with the DuckLake extension and attach a lake described by a ``DuckLakeConfig``.

The extensions come from the ``duckdb-extension-*`` wheels and are loaded by file path, so no
extension server is needed; ``INSTALL`` is only the fallback when a wheel is missing. The catalog
string picks the metadata database: a DuckDB file (``/path/meta.ducklake``), SQLite
(``sqlite:/path/meta.sqlite``) or PostgreSQL (``postgres:dbname=lake host=...``).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from headrace import storage
from headrace.core.errors import ConfigError, TransientError
from headrace.core.settings import redacted_dsn
from headrace.targets.ducklake.config import DuckLakeConfig

LAKE_ALIAS = "hr_lake"

# extension name -> the wheel that ships it.
_WHEELS: dict[str, str | None] = {
    "ducklake": "duckdb_extension_ducklake",
    "postgres_scanner": "duckdb_extension_postgres_scanner",
    "sqlite_scanner": "duckdb_extension_sqlite_scanner",
    # Not for DuckLake: reading headrace's Iceberg tables with DuckDB (headrace.readers).
    "avro": "duckdb_extension_avro",
    "iceberg": "duckdb_extension_iceberg",
    # s3:// data paths and staged files (headrace.storage).
    "httpfs": "duckdb_extension_httpfs",
}


@dataclass(frozen=True, slots=True)
class Catalog:
    """A parsed catalog string: which metadata database, and the text DuckLake's ATTACH wants."""

    kind: str  # "duckdb", "sqlite" or "postgres"
    location: str  # what follows ``ducklake:`` in ATTACH

    @property
    def shown(self) -> str:
        """The catalog as logs and errors show it (passwords removed)."""
        return redacted_dsn(self.location)


def parse_catalog(text: str) -> Catalog:
    """Classify a catalog string from the config."""
    if text.startswith("sqlite:"):
        return Catalog("sqlite", text)
    if text.startswith(("postgres:", "postgresql:")) and not text.startswith("postgresql://"):
        return Catalog("postgres", "postgres:" + text.partition(":")[2])
    if text.startswith("duckdb:"):
        return Catalog("duckdb", text.removeprefix("duckdb:"))
    return Catalog("duckdb", text)


def extension_path(name: str) -> Path | None:
    """The extension file inside its wheel for this DuckDB version, or None when not installed."""
    package = _WHEELS.get(name)
    spec = importlib.util.find_spec(package) if package else None
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations)))
    path = folder / "extensions" / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"
    return path if path.exists() else None


def load_extension(con: duckdb.DuckDBPyConnection, name: str, needed_for: str) -> None:
    """Load ``name`` from its wheel by path; fall back to the extension server (needs internet)."""
    path = extension_path(name)
    try:
        if path is not None:
            con.execute(f"LOAD '{_quote(str(path))}'")
            return
        con.execute(f"INSTALL {name}")
        con.execute(f"LOAD {name}")
    except duckdb.Error as exc:
        wheel = _WHEELS.get(name) or name
        raise ConfigError(
            f"{needed_for} needs the DuckDB extension {name!r}, which is not available offline "
            f"({str(exc).splitlines()[0]}): run `pip install {wheel.replace('_', '-', 2)}=={duckdb.__version__}`"
            f" or allow access to extensions.duckdb.org so `INSTALL {name}` can download it"
        ) from exc


def _quote(text: str) -> str:
    return text.replace("'", "''")


def resolve_catalog(settings: DuckLakeConfig) -> Catalog:
    """The catalog string, taken from ``catalog_env`` when that names a set variable."""
    text = settings.catalog
    if settings.catalog_env:
        value = os.environ.get(settings.catalog_env)
        if not value:
            raise ConfigError(
                f"target.ducklake.catalog_env: environment variable {settings.catalog_env} is not set; "
                "export it before running"
            )
        text = value
    if not text:
        raise ConfigError("target.ducklake: give catalog (a path or connection string) or catalog_env")
    return parse_catalog(text)


def connect(settings: DuckLakeConfig, alias: str = LAKE_ALIAS) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with the lake attached as ``alias`` (UTC session)."""
    catalog = resolve_catalog(settings)
    con = duckdb.connect()
    try:
        # UTC so TIMESTAMPTZ values and casts never depend on the machine's zone.
        con.execute("SET TimeZone = 'UTC'")
        what = f"DuckLake catalog {catalog.shown}"
        load_extension(con, "ducklake", what)
        if catalog.kind == "postgres":
            load_extension(con, "postgres_scanner", what)
        elif catalog.kind == "sqlite":
            load_extension(con, "sqlite_scanner", what)
        storage.attach_duckdb(con, settings.data_path)
        attach(con, catalog, settings.data_path, alias, settings.inline_rows)
    except BaseException:
        con.close()
        raise
    return con


def scalar(con: duckdb.DuckDBPyConnection, sql: str, params: list[object] | None = None) -> Any:
    """The first column of the query's first row (None: no row)."""
    row = con.execute(sql, params or []).fetchone()
    return None if row is None else row[0]


def fetch_arrow(result: duckdb.DuckDBPyConnection) -> pa.Table:
    """The query result as one Arrow table (duckdb 1.5 returns a batch reader from ``arrow()``: drained
    here, before another query on the connection ends it)."""
    out: Any = result.arrow()
    if isinstance(out, pa.RecordBatchReader):
        out = out.read_all()
    assert isinstance(out, pa.Table)
    return out


def attach(con: duckdb.DuckDBPyConnection, catalog: Catalog, data_path: str, alias: str,
           inline_rows: int | None = None) -> None:
    """ATTACH the lake (``inline_rows``: DuckLake's data inlining limit for this connection's writes, set
    as the connection's default so that a write can change it, ``inlining``; None: DuckLake's own
    default); errors name the catalog and what to check."""
    if catalog.kind == "duckdb":
        Path(catalog.location).expanduser().parent.mkdir(parents=True, exist_ok=True)
    elif catalog.kind == "sqlite":
        Path(catalog.location.removeprefix("sqlite:")).expanduser().parent.mkdir(parents=True, exist_ok=True)
    if "://" not in data_path:
        Path(data_path).mkdir(parents=True, exist_ok=True)
    if inline_rows is not None:
        con.execute(f"SET ducklake_default_data_inlining_row_limit = {int(inline_rows)}")
    sql = f"ATTACH 'ducklake:{_quote(catalog.location)}' AS {alias} (DATA_PATH '{_quote(data_path)}')"
    try:
        con.execute(sql)
    except duckdb.Error as exc:
        if not isinstance(exc, duckdb.IOException) and "database is locked" not in str(exc):
            raise _attach_failed(catalog, data_path, exc) from exc
        # An unreachable Postgres, a locked DuckDB file or a SQLite catalog busy with another
        # writer: worth retrying.
        raise TransientError(
            f"could not open DuckLake catalog {catalog.shown} (data path {data_path}): "
            f"{redacted_dsn(str(exc).splitlines()[0])}; check the catalog database is reachable and not locked "
            "by another process"
        ) from exc


def _attach_failed(catalog: Catalog, data_path: str, exc: duckdb.Error) -> ConfigError:
    return ConfigError(
        f"could not attach DuckLake catalog {catalog.shown} (data path {data_path}): "
        f"{redacted_dsn(str(exc).splitlines()[0])}; check target.ducklake.catalog (a DuckDB file path, "
        "sqlite:/path/meta.sqlite or postgres:<libpq conninfo>) and that the data path is the "
        "one this lake was created with"
    )
