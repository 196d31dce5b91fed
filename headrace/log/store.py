"""The staging store: where a pipeline's staged files live, on any filesystem ``pyarrow.fs`` reaches.

A local folder by default; a URI (``s3://`` on the configured object store, ``headrace.storage``;
``hdfs://``, ``gs://``, ``file://`` as ``pyarrow.fs`` reads them) for a store that a Spark
cluster's executors read too. Files are named by *location*: the string registered in the
log index and handed to Spark, i.e. the store's root as configured followed by ``/<oid>/<file>``
(an absolute path for a local folder). Every write, listing, existence check and delete of staged
files goes through here, so none of them assumes a local disk.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

from headrace import storage
from headrace.log import recent
from headrace.log.codec import StagingBuffer, write_staging_file

# Object stores publish an object whole when its upload completes (a failed upload leaves nothing),
# and a rename there is a copy: they are written in place. Other filesystems get temp + rename.
_OBJECT_STORES = {"s3", "gcs", "abfs"}
_SUFFIXES = (".parquet", ".tmp")
DELETE_THREADS = 16  # deletes at once on an object store (``delete_many``)


class StagingStore:
    """One pipeline's staged files under one root folder of one filesystem."""

    def __init__(self, fs: pafs.FileSystem, root_path: str, root: str) -> None:
        self.fs = fs
        self.root = root.rstrip("/")  # the root as locations spell it (what users configured)
        self._root_path = root_path.rstrip("/")  # the root as ``fs`` spells it

    @classmethod
    def open(cls, location: str | Path) -> StagingStore:
        """The store at ``location``: a local path (relative to the working folder) or a URI."""
        text = str(location)
        if "://" not in text:
            root = os.path.abspath(text)
            return cls(pafs.LocalFileSystem(), root, root)
        fs, path = storage.filesystem(text)
        return cls(fs, path, text)

    @classmethod
    def for_pipeline(cls, staging_path: str, pipeline: str) -> StagingStore:
        """The store of ``pipeline`` under the configured ``staging.path`` (one folder per pipeline)."""
        return cls.open(f"{staging_path.rstrip('/')}/{pipeline}")

    @property
    def local(self) -> bool:
        """The store is a folder of this machine (fsync and atomic rename hold)."""
        return isinstance(self.fs, pafs.LocalFileSystem)

    def __str__(self) -> str:
        return self.root

    # -- writing --------------------------------------------------------------------------------
    def write(self, oid: int, buffer: StagingBuffer) -> tuple[str, int]:
        """Write ``buffer`` as a new staged file of table ``oid``, durably; its location and size.

        Durable means: on a local folder, written under a temporary name, fsynced, renamed, and the
        folder fsynced, so a crash leaves either the whole file or a ``.tmp`` leftover (removed as
        an orphan); elsewhere, what the filesystem offers for the same (atomic upload or rename).
        A write that fails removes what it left.
        """
        return self.write_table(oid, buffer, buffer.max_lsn)

    def write_table(self, oid: int, buffer: StagingBuffer | pa.Table, max_lsn: int) -> tuple[str, int]:
        """``write`` of a buffer or of a table of the staging schema whose last change is at ``max_lsn``."""
        name = f"{max_lsn:016X}-{uuid.uuid4().hex[:12]}.parquet"
        folder = f"{self._root_path}/{oid}"
        path = f"{folder}/{name}"
        if self.local:
            _write_local(path, buffer)
        elif self.fs.type_name in _OBJECT_STORES:
            encoded = pa.BufferOutputStream()
            write_staging_file(encoded, buffer)
            data = encoded.getvalue()
            with self.fs.open_output_stream(path) as out:
                out.write(data)
            location = self._location(path)
            recent.keep(location, data)  # the materializer's read of it, a moment later, from memory
            return location, data.size  # the size as written: no HEAD request to ask the store
        else:
            self.fs.create_dir(folder, recursive=True)
            tmp = path[: -len(".parquet")] + ".tmp"
            try:
                with self.fs.open_output_stream(tmp) as out:
                    write_staging_file(out, buffer)
                self.fs.move(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    self.fs.delete_file(tmp)
                raise
        size = self.fs.get_file_info(path).size
        return self._location(path), int(size or 0)

    # -- reading the folder ---------------------------------------------------------------------
    def files(self) -> list[str]:
        """Locations of every staged file in the store, temporaries of unfinished writes included."""
        selector = pafs.FileSelector(self._root_path, recursive=True, allow_not_found=True)
        return sorted(self._location(info.path) for info in self.fs.get_file_info(selector)
                      if info.type == pafs.FileType.File and info.path.endswith(_SUFFIXES))

    def exists(self, location: str) -> bool:
        """The file at ``location`` is there."""
        fs, path = self._resolve(location)
        return bool(fs.get_file_info(path).type == pafs.FileType.File)

    def orphans(self, registered: Iterable[str]) -> list[str]:
        """Files in the store that ``registered`` (the log index's locations) does not name."""
        known = {self.normalise(location) for location in registered}
        return [location for location in self.files() if location not in known]

    def normalise(self, location: str) -> str:
        """``location`` as this store spells it (a relative local path made absolute)."""
        return location if "://" in location else os.path.abspath(location)

    # -- deleting -------------------------------------------------------------------------------
    def delete(self, location: str) -> bool:
        """Delete the file at ``location``; False when it was gone already."""
        fs, path = self._resolve(location)
        recent.forget(location)
        try:
            fs.delete_file(path)
        except FileNotFoundError:
            return False
        return True

    def delete_many(self, locations: list[str]) -> list[str]:
        """Delete the files at ``locations`` (one gone already counts as deleted); those whose delete
        failed. On the S3 store in requests of up to 1,000 keys (``storage.delete_keys``); on another
        object store ``DELETE_THREADS`` at once, each delete a round trip."""
        def one(location: str) -> str | None:
            try:
                self.delete(location)
            except OSError:
                return location
            return None

        failed = _delete_on_s3([location for location in locations if storage.is_object_store(location)])
        others = [location for location in locations if not storage.is_object_store(location)]
        if self.local or len(others) < 2:
            failed += [one(location) for location in others]
        else:
            with ThreadPoolExecutor(min(DELETE_THREADS, len(others)), thread_name_prefix="staging-delete") as pool:
                failed += list(pool.map(one, others))
        return [location for location in failed if location is not None]

    def exists_root(self) -> bool:
        """The store's folder exists (it is created by the first write)."""
        return bool(self.fs.get_file_info(self._root_path).type != pafs.FileType.NotFound)

    def delete_all(self) -> None:
        """Delete the store's folder and everything in it (``headrace drop``)."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_dir(self._root_path)

    # -- locations ------------------------------------------------------------------------------
    def _location(self, path: str) -> str:
        return self.root + path[len(self._root_path):]

    def _resolve(self, location: str) -> tuple[pafs.FileSystem, str]:
        """The filesystem and path of ``location``: this store's, or, for a location written under
        another root (``staging.path`` changed since), the one its own spelling names."""
        location = self.normalise(location)
        if location == self.root or location.startswith(self.root + "/"):
            return self.fs, self._root_path + location[len(self.root):]
        if "://" not in location:
            return pafs.LocalFileSystem(), location
        fs, path = storage.filesystem(location)
        return fs, path


def _delete_on_s3(locations: list[str]) -> list[str | None]:
    """``delete_many`` of ``s3://`` locations: a request per bucket and 1,000 keys; the failed ones."""
    places = {location: storage.split(location) for location in locations}  # (bucket, key)
    by_bucket: dict[str, list[str]] = {}
    for location, (bucket, key) in places.items():
        recent.forget(location)
        by_bucket.setdefault(bucket, []).append(key)
    failed = {(bucket, key) for bucket, keys in by_bucket.items() for key in storage.delete_keys(bucket, keys)}
    return [location for location, place in places.items() if place in failed]


def _write_local(path: str, buffer: StagingBuffer | pa.Table) -> None:
    """Temp file, fsync, rename, fsync the folder: the file is whole on disk or absent."""
    final = Path(path)
    tmp = final.with_suffix(".tmp")
    try:
        write_staging_file(tmp, buffer)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
