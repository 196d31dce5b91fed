"""The staging codec: rows encoded as the fixed staging schema read back exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from headrace.core.changes import UNCHANGED
from headrace.log.codec import (
    STAGING_SCHEMA,
    StagingBuffer,
    encode_row,
    read_staging_file,
    write_staging_file,
)


def test_encode_row_keeps_nulls_and_names_unchanged_toast_columns() -> None:
    data, unchanged = encode_row(["id", "note", "doc", "blob"], ["1", None, UNCHANGED, UNCHANGED])
    assert json.loads(data) == {"id": "1", "note": None}  # a SQL NULL is a JSON null, not a missing key
    assert unchanged == "doc,blob"
    assert encode_row(["id"], ["ü€"]) == ('{"id":"ü€"}', None)  # text as is, not escaped


def _buffer() -> StagingBuffer:
    buf = StagingBuffer()
    buf.append("I", 100, 1, 1_700_000_000_000_000, 7, '{"id":"1"}')
    buf.append("U", 100, 2, 1_700_000_000_000_000, 7, '{"id":"2"}', "doc", '{"id":"1"}')
    buf.append("T", 90, 1, 1_600_000_000_000_000, 6, None)
    return buf


def test_a_buffer_round_trips_through_a_file_and_a_stream(tmp_path: Path) -> None:
    buf = _buffer()
    assert (len(buf), buf.min_lsn, buf.max_lsn) == (3, 90, 100) and buf.nbytes > 0
    path = tmp_path / "new" / "folder" / "f.parquet"  # the folder is created
    write_staging_file(path, buf)
    sink = pa.BufferOutputStream()
    write_staging_file(sink, buf)
    from_stream = pq.read_table(pa.BufferReader(sink.getvalue()))
    for table in (read_staging_file(path), from_stream):
        assert table.schema == STAGING_SCHEMA
        assert table.to_pylist() == buf.to_table().to_pylist()
        rows = table.to_pylist()
        assert [r["_op"] for r in rows] == ["I", "U", "T"]
        assert rows[1]["_unchanged_cols"] == "doc" and rows[1]["_old_key"] == '{"id":"1"}'
        assert rows[2]["_data"] is None
