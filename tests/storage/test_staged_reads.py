"""Staged files on the store are read back (the metrics' and lineage's per-operation counts) through the
configured store, also when its endpoint is in the storage section only and not in the environment."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from headrace import storage
from headrace.control.metrics import _footer_last_ts, _read_ops
from headrace.storage import StorageConfig
from tests.objectstore import MotoServer


def test_staged_file_counts_are_read_from_the_configured_store(s3_server: MotoServer, s3_bucket: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # Left to pyarrow, an s3:// URI without AWS_ENDPOINT_URL went to AWS itself and waited out its
    # timeouts for every staged file (seconds a batch), then counted nothing.
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    storage.configure(StorageConfig(endpoint=s3_server.endpoint))
    at = datetime(2026, 1, 2, tzinfo=timezone.utc)
    staged = pa.table({"_op": ["I", "U", "D"], "_lsn": [5, 6, 7], "_seq": [0, 0, 0], "_ts": [at, at, at]})
    filesystem, path = storage.filesystem(f"s3://{s3_bucket}/staging/t/1.parquet")
    pq.write_table(staged, path, filesystem=filesystem)
    started = time.monotonic()
    assert _read_ops(f"s3://{s3_bucket}/staging/t/1.parquet", None) == ({"insert": 1, "update": 1, "delete": 1}, at)
    assert _footer_last_ts(f"s3://{s3_bucket}/staging/t/1.parquet") == (at,)
    assert time.monotonic() - started < 5


def test_a_staged_file_this_process_wrote_is_uploaded_once_and_read_back_without_the_store(
        s3_server: MotoServer, s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from headrace.log import recent
    from headrace.log.codec import StagingBuffer, read_staging_file
    from headrace.log.store import StagingStore

    storage.configure(StorageConfig(endpoint=s3_server.endpoint))
    store = StagingStore.open(f"s3://{s3_bucket}/staging/p")
    buf = StagingBuffer()
    buf.append("I", 5, 1, 7_000_000, 1, '{"id":"1"}')

    def requests() -> int:
        return len(s3_server.log_path.read_text().splitlines())

    before = requests()
    location, size = store.write(42, buf)
    assert requests() - before == 1  # one PUT: no multipart create/complete, no HEAD for the size
    assert size == s3_server.client().head_object(Bucket=s3_bucket, Key=location.split("/", 3)[3])["ContentLength"]
    before = requests()
    assert read_staging_file(location).equals(buf.to_table())
    assert requests() == before  # read from this process's memory
    store.delete(location)
    assert recent.read(location) is None
    another = StagingStore.open(f"s3://{s3_bucket}/staging/p")  # a file this process did not write: the store
    location, _ = another.write(42, buf)
    recent.forget(location)
    before = requests()
    assert read_staging_file(location).equals(buf.to_table())
    assert requests() > before


def test_collected_files_on_the_store_are_deleted_in_one_request(s3_server: MotoServer, s3_bucket: str) -> None:
    """``StagingStore.delete_many`` on the object store deletes every file in one DeleteObjects request
    (pyarrow's delete is a HEAD, a DELETE and a PUT of the folder's marker a file), one gone already
    counts as deleted, none is left to try again, and a store that refuses leaves them all to retry."""
    from headrace.log.codec import StagingBuffer
    from headrace.log.store import StagingStore

    storage.configure(StorageConfig(endpoint=s3_server.endpoint))
    store = StagingStore.open(f"s3://{s3_bucket}/staging/gc")
    buf = StagingBuffer()
    buf.append("I", 5, 1, 7_000_000, 1, '{"id":"1"}')
    locations = [store.write(7, buf)[0] for _ in range(40)]
    store.delete(locations[3])

    def requests() -> int:
        return len(s3_server.log_path.read_text().splitlines())

    before = requests()
    assert store.delete_many(locations) == []
    assert requests() - before == 1
    # (the single delete above left pyarrow's folder marker, a key ending in "/")
    assert [k for k in s3_server.keys(s3_bucket, "staging/gc/") if not k.endswith("/")] == []

    kept = [store.write(7, buf)[0] for _ in range(3)]
    gone = StagingStore.open(f"s3://{s3_bucket}-missing/staging/gc")  # NoSuchBucket: the request fails
    assert gone.delete_many([loc.replace(s3_bucket, f"{s3_bucket}-missing", 1) for loc in kept]) != []
    assert len([k for k in s3_server.keys(s3_bucket, "staging/gc/") if not k.endswith("/")]) == 3
