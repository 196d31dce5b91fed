"""Object storage: the one place that knows how each engine reaches an ``s3://`` location.

``configure`` is called once a pipeline's config is read (``headrace.config.parse_config``); every
later ``filesystem`` call, Spark session and DuckDB connection that touches an ``s3://`` path then
uses the same store and the same credentials. Unconfigured, the standard AWS environment variables
apply (``S3Access.resolve``), as for the AWS CLI.
"""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING

from headrace.storage.config import StorageConfig
from headrace.storage.s3 import S3Access, is_object_store, split

if TYPE_CHECKING:
    import duckdb
    import pyarrow.fs as pafs

__all__ = ["StorageConfig", "S3Access", "configure", "access", "filesystem", "is_object_store", "split",
           "attach_duckdb"]

_lock = threading.Lock()
_config: StorageConfig | None = None
_in_use = False  # a configured location is on the store: Spark sessions started now get the S3A jars


def configure(config: StorageConfig, in_use: bool = False) -> None:
    """Make ``config`` the store every engine of this process uses for ``s3://`` paths; ``in_use``: the
    pipeline has a location there (a Spark session started from now on loads the S3A jars)."""
    global _config, _in_use
    with _lock:
        _config = config
        _in_use = _in_use or in_use


def in_use() -> bool:
    """Some configured pipeline of this process has a location on the object store."""
    return _in_use


def current_config() -> StorageConfig:
    """The configured storage section (defaults when none was configured)."""
    return _config or StorageConfig()


def access() -> S3Access:
    """The configured store's access, resolved now (credentials are read from the environment)."""
    return S3Access.resolve(_config)


def filesystem(location: str) -> tuple[pafs.FileSystem, str]:
    """The ``pyarrow.fs`` filesystem and path of ``location``: an ``s3://`` URI on the configured store
    (``bucket/key``), anything else as ``pyarrow.fs.FileSystem.from_uri`` reads it."""
    import pyarrow.fs as pafs

    if is_object_store(location):
        bucket, key = split(location)
        return _s3_filesystem(access()), f"{bucket}/{key}".rstrip("/")
    return pafs.FileSystem.from_uri(location)


@functools.lru_cache(maxsize=8)
def _s3_filesystem(resolved: S3Access) -> pafs.FileSystem:
    """One client per store and credentials (a client holds a connection pool)."""
    return resolved.filesystem()


def attach_duckdb(con: duckdb.DuckDBPyConnection, *locations: str) -> None:
    """Give ``con`` (DuckDB) the store as an S3 secret when any of ``locations`` is on it."""
    if any(is_object_store(loc) for loc in locations):
        access().create_duckdb_secret(con)
