"""The copy's file sink: folders pyarrow can and cannot reach, field ids, and a chunk given up midway."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from headrace.core.filesink import FileSink, dictionary_columns, open_folder


def test_open_folder_takes_local_paths_file_and_s3_uris_and_refuses_hadoop_only_schemes(tmp_path: Path) -> None:
    import pyarrow.fs as pafs

    for location in (str(tmp_path / "a"), f"file:{tmp_path}/b", f"file://{tmp_path}/c"):
        opened = open_folder(location)
        assert opened is not None, location
        assert opened[1] == str(tmp_path / location[-1]) and Path(opened[1]).is_dir()
    for location in ("s3://bucket/wh/t/data", "s3a://bucket/wh/t/data"):  # the storage section's store
        opened = open_folder(location)
        assert opened is not None and isinstance(opened[0], pafs.S3FileSystem) and opened[1] == "bucket/wh/t/data"
    assert open_folder("viewfs://cluster/wh") is None


def test_files_carry_field_ids_and_integer_decimals(tmp_path: Path) -> None:
    fs, path = open_folder(f"file:{tmp_path}/data")  # type: ignore[misc]
    sink = FileSink(f"file:{tmp_path}/data", fs, path, field_ids={"id": 1, "amount": 2})
    rows = pa.table({"id": pa.array([1, 2], pa.int64()),
                     "amount": pa.array([Decimal("1.50"), None], pa.decimal128(12, 2))})
    written = sink.write(rows, "f")
    assert written.path == f"file:{tmp_path}/data/f.parquet" and written.rows == 2 and written.bytes > 0
    file = pq.ParquetFile(tmp_path / "data" / "f.parquet")
    assert [f.metadata[b"PARQUET:field_id"] for f in file.schema_arrow] == [b"1", b"2"]  # read from the file
    assert file.schema.column(1).physical_type == "INT64"  # Iceberg's spec for precision 10..18
    with pytest.raises(ValueError, match="no field id"):
        sink.write(pa.table({"other": [1]}), "g")


def test_a_chunk_given_up_midway_leaves_no_file(tmp_path: Path) -> None:
    fs, path = open_folder(str(tmp_path))  # type: ignore[misc]
    sink = FileSink(str(tmp_path), fs, path)

    def parts() -> Iterator[pa.Table]:
        yield pa.table({"id": list(range(300_000))})  # more than a row group: written already
        raise LookupError("a value only Spark decides")

    with pytest.raises(LookupError):
        sink.write_parts(parts(), "half")
    assert not list(tmp_path.iterdir())
    assert sink.write_parts(iter([pa.table({"id": pa.array([], pa.int64())})]), "none", empty=False) is None
    assert not list(tmp_path.iterdir())


def test_only_repetitive_columns_get_a_dictionary_and_values_read_back_unchanged(tmp_path: Path) -> None:
    fs, path = open_folder(str(tmp_path))  # type: ignore[misc]
    n = 50_000
    rows = pa.table({"id": pa.array(range(n), pa.int64()), "status": [("new", "paid")[i % 2] for i in range(n)],
                     "note": [f"note {i}" for i in range(n)], "flag": [i % 3 == 0 for i in range(n)],
                     "ts": pa.nulls(n, pa.timestamp("us", tz="UTC"))})
    assert dictionary_columns(rows) == ["status", "ts"]
    FileSink(str(tmp_path), fs, path).write(rows, "f")
    file = pq.ParquetFile(tmp_path / "f.parquet")
    encodings = {file.schema.column(i).name: file.metadata.row_group(0).column(i).encodings
                 for i in range(len(rows.columns))}
    assert "RLE_DICTIONARY" in encodings["status"] and "RLE_DICTIONARY" not in encodings["id"]
    assert "RLE_DICTIONARY" not in encodings["note"]
    assert file.read().equals(rows)
