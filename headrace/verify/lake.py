"""The target read through DuckDB, pinned: DuckLake at one snapshot version, Iceberg at one
metadata file (each names one snapshot of the table, whatever is committed after).

A DuckLake on a SQLite catalog is read from a copy of the catalog taken at the pin (SQLite's
backup API, one short read): DuckLake's SQLite writer does not wait for readers, so every catalog
query verify made there could fail one of the pipeline's commits ("database is locked"). The data
files the copy names are immutable.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import duckdb

from headrace.config import PipelineConfig
from headrace.core.errors import HeadraceError
from headrace.core.names import path_segment, quote_ident
from headrace.core.schema import TableSchema
from headrace.targets.ducklake.config import DuckLakeConfig
from headrace.targets.ducklake.extension import resolve_catalog
from headrace.verify.point import VerifyError
from headrace.verify.sides import LakeSide

LAKE = "verified_lake"
COPY_TRIES_SECONDS = 30.0  # a catalog busy with a commit is copied again until then


def _copy_sqlite(location: str, folder: str) -> str:
    """A consistent copy of the SQLite catalog at ``location`` in ``folder``; its path."""
    copy = f"{folder}/catalog.sqlite"
    deadline = time.monotonic() + COPY_TRIES_SECONDS
    while True:
        try:
            with sqlite3.connect(location, timeout=1.0) as src, sqlite3.connect(copy) as dst:
                src.backup(dst)
            return copy
        except sqlite3.OperationalError as exc:
            # a commit during the copy: locked, or (seen under load) a read of a page being written
            if not any(m in str(exc) for m in ("locked", "disk I/O error")) or time.monotonic() >= deadline:
                raise VerifyError(f"cannot read the DuckLake catalog {location}: {exc}") from exc
            time.sleep(0.1)


def _ducklake(settings: DuckLakeConfig, folder: str) -> duckdb.DuckDBPyConnection:
    from headrace import readers

    catalog = resolve_catalog(settings)
    if catalog.kind == "sqlite":
        copy = _copy_sqlite(catalog.location.removeprefix("sqlite:"), folder)
        settings = settings.model_copy(update={"catalog": f"sqlite:{copy}", "catalog_env": None})
    return readers.ducklake(settings, LAKE)


def _open(config: PipelineConfig, folder: str) -> duckdb.DuckDBPyConnection:
    from headrace import readers

    try:
        match config.target.kind:
            case "ducklake":
                return _ducklake(config.target.settings, folder)  # type: ignore[arg-type]
            case "iceberg":
                return readers.duckdb_with("avro", "iceberg")
    except (HeadraceError, duckdb.Error) as exc:
        if isinstance(exc, VerifyError):
            raise
        raise VerifyError(f"cannot open the {config.target.kind} target with DuckDB: {str(exc).strip()}"
                          " (a DuckDB-file DuckLake catalog is locked by the running pipeline: verify needs a"
                          " SQLite or PostgreSQL catalog)") from exc
    raise VerifyError(f"verify reads DuckLake and Iceberg targets; this pipeline's is {config.target.kind}")


def _relations(config: PipelineConfig, con: duckdb.DuckDBPyConnection, tables: list[TableSchema]) -> dict[int, str]:
    """Each table's FROM item at the target's current snapshot (read now, fixed from then on)."""
    if config.target.kind == "ducklake":
        row = con.execute(f"SELECT id FROM {LAKE}.current_snapshot()").fetchone()
        assert row is not None
        schema = config.target.settings.schema_  # type: ignore[attr-defined]
        return {t.oid: f"{LAKE}.{quote_ident(schema or t.target_schema)}.{quote_ident(t.target_table)}"
                       f" AT (VERSION => {int(row[0])})" for t in tables}
    from headrace.readers import iceberg_metadata_location

    settings = config.target.settings
    out = {}
    for t in tables:
        namespace = path_segment(settings.namespace or t.target_schema)  # type: ignore[attr-defined]
        try:
            location = iceberg_metadata_location(settings, namespace, path_segment(t.target_table))  # type: ignore[arg-type]
        except Exception as exc:  # pyiceberg's NoSuchTableError, a missing version hint
            raise VerifyError(f"cannot find the Iceberg table of {t.qualified_name}: {exc}") from exc
        out[t.oid] = "iceberg_scan('" + location.replace("'", "''") + "')"
    return out


@contextmanager
def pinned_target(config: PipelineConfig, tables: list[TableSchema]) -> Iterator[LakeSide]:
    """The target's tables as they are now, for as long as the block runs."""
    folder = tempfile.mkdtemp(prefix="headrace-verify-")
    try:
        con = _open(config, folder)
        try:
            yield LakeSide(con, _relations(config, con, tables))
        finally:
            con.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
