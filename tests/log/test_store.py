"""The staging store on a local folder (and on Arrow's in-memory filesystem, the non-local path)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from headrace.log.codec import StagingBuffer, read_staging_file
from headrace.log.store import StagingStore


def _buffer(lsn: int) -> StagingBuffer:
    buf = StagingBuffer()
    buf.append("I", lsn, 1, 0, 1, '{"id":"1"}')
    buf.append("D", lsn, 2, 0, 1, '{"id":"1"}')
    return buf


def test_durable_write_list_exists_delete_on_a_local_folder(tmp_path: Path) -> None:
    store = StagingStore.for_pipeline(str(tmp_path / "staging"), "orders")
    assert not store.exists_root() and store.files() == []  # nothing until the first write
    first, size = store.write(16384, _buffer(0x10))
    second, _ = store.write(16385, _buffer(0x20))
    assert first == str(tmp_path / "staging" / "orders" / "16384" / Path(first).name)  # an absolute path
    assert Path(first).name.startswith("0000000000000010-") and first.endswith(".parquet")
    assert size == os.path.getsize(first) > 0
    assert read_staging_file(first).num_rows == 2
    assert store.files() == sorted([first, second])  # no temporary file left behind
    assert store.exists(first)
    assert store.delete(first) and not store.exists(first)
    assert not store.delete(first)  # gone already: not an error
    store.delete_all()
    assert not store.exists_root() and not (tmp_path / "staging" / "orders").exists()


def test_orphans_are_the_files_no_registration_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = StagingStore.open("staging/p")  # relative: resolved against the working folder
    registered, _ = store.write(1, _buffer(1))
    unregistered, _ = store.write(1, _buffer(2))
    half = Path(registered).with_name("0000000000000003-half.tmp")  # a write cut short by a crash
    half.write_bytes(b"PAR1")
    (Path(registered).parent / "notes.txt").write_text("not a staged file")
    relative = os.path.relpath(registered)  # an older headrace registered paths as configured
    assert sorted(store.orphans([relative])) == sorted([unregistered, str(half)])
    assert store.orphans([registered, unregistered, str(half)]) == []


def test_a_location_outside_the_root_is_still_reached(tmp_path: Path) -> None:
    """Files registered before ``staging.path`` changed keep their own location."""
    old = StagingStore.open(tmp_path / "old")
    location, _ = old.write(7, _buffer(5))
    new = StagingStore.open(tmp_path / "new")
    assert new.exists(location) and location not in new.files()
    assert new.delete(location) and not os.path.exists(location)


def test_a_filesystem_without_fsync_writes_through_a_temporary_and_a_rename() -> None:
    store = StagingStore.open("mock:///bucket/staging/p")  # Arrow's in-memory filesystem
    assert not store.local
    location, size = store.write(42, _buffer(9))
    assert location.startswith("mock:///bucket/staging/p/42/") and size > 0
    assert store.files() == [location] and store.exists(location)
    assert store.orphans([location]) == []
    assert store.delete(location) and store.files() == []
