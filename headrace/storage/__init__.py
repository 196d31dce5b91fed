"""Object storage: the one place that knows how each engine reaches an ``s3://`` location.

``configure`` is called once a pipeline's config is read (``headrace.config.parse_config``); every
later ``filesystem`` call, Spark session and DuckDB connection that touches an ``s3://`` path then
uses the same store and the same credentials. Unconfigured, the standard AWS environment variables
apply (``S3Access.resolve``), as for the AWS CLI.
"""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING, Any

from headrace.storage.config import StorageConfig
from headrace.storage.s3 import S3Access, is_object_store, split

if TYPE_CHECKING:
    import duckdb
    import pyarrow.fs as pafs

__all__ = ["StorageConfig", "S3Access", "configure", "access", "filesystem", "is_object_store", "split",
           "attach_duckdb", "delete_keys"]

DELETE_BATCH = 1000  # keys a DeleteObjects request takes at most (the S3 API's limit)

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


@functools.lru_cache(maxsize=8)
def _client(resolved: S3Access) -> Any:
    """One boto3 client per store and credentials (thread-safe; it holds a connection pool)."""
    return resolved.client()


def delete_keys(bucket: str, keys: list[str]) -> list[str]:
    """Delete ``keys`` of ``bucket`` on the configured store, up to ``DELETE_BATCH`` in one request; the
    keys whose delete failed (a key already gone counts as deleted, as S3 reports it).

    ``pyarrow.fs`` deletes one key in three requests (a HEAD, the DELETE, and a PUT of the folder's
    marker should it have become empty): on the garbage collection of a busy pipeline's staged files
    that was three quarters of all requests to the store (moto's log, 2026-11-28).
    """
    failed: list[str] = []
    client = _client(access())
    for start in range(0, len(keys), DELETE_BATCH):
        chunk = keys[start:start + DELETE_BATCH]
        try:
            answer = client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in chunk],
                                                                  "Quiet": True})
        except Exception:  # unreachable, refused: the caller tries these keys again later
            failed += chunk
            continue
        failed += [error["Key"] for error in answer.get("Errors", []) if error.get("Code") != "NoSuchKey"]
    return failed


def attach_duckdb(con: duckdb.DuckDBPyConnection, *locations: str) -> None:
    """Give ``con`` (DuckDB) the store as an S3 secret when any of ``locations`` is on it."""
    if any(is_object_store(loc) for loc in locations):
        access().create_duckdb_secret(con)
