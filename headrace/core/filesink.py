"""Where an initial copy's Parquet files go when they are written without Spark's writer.

A target that registers files it did not write (Iceberg through its Java API, DuckLake with
``ducklake_add_data_files``) hands out a ``FileSink``: a folder of its data location, the
``pyarrow.fs`` filesystem that reaches it, and what the files must carry (Iceberg's field ids).
The sink is picklable, so a copy's Spark task writes its chunk itself (Arrow straight to Parquet,
no Spark rows) and sends the driver only a ``WrittenFile``; the target then registers every file
of a group in one commit. A file that no commit registered (a crash in between) is an orphan: the
target's own cleanup removes it (Iceberg's ``remove_orphan_files``, DuckLake's attempt folders).
"""

from __future__ import annotations

import builtins
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

FIELD_ID = b"PARQUET:field_id"  # Arrow field metadata pyarrow writes as the Parquet field id
ROW_GROUP_ROWS = 262_144  # rows a Parquet row group holds at most (batches are gathered up to it)
DICTIONARY_RATIO = 100  # rows per distinct value, at least, for a column's dictionary (dictionary_columns)
DICTIONARY_SAMPLE = 16_384  # the rows dictionary_columns looks at
# Parquet codecs by the names Iceberg's ``write.parquet.compression-codec`` uses.
CODECS = {"zstd": "zstd", "snappy": "snappy", "gzip": "gzip", "lz4": "lz4", "uncompressed": "none"}


@dataclass(frozen=True)
class WrittenFile:
    """One Parquet file a sink wrote: its location as the target names it, size and rows.

    ``footer``: the file's Parquet footer (its Thrift ``FileMetaData``, as the file holds it) when the
    writer kept it, so a target that needs the file's metrics (Iceberg) has them without reading the
    file back: on an object store that read was a HEAD and two ranged GETs a file, in series.
    """

    path: str
    bytes: int
    rows: int
    footer: builtins.bytes | None = field(default=None, repr=False, compare=False)  # `bytes` is a field here


@dataclass(frozen=True)
class FileSink:
    """A folder the copy writes Parquet into (module docstring).

    ``location``: the folder as the target names it (registered paths start with it); ``fs_path``:
    the same folder for ``filesystem``. ``field_ids``: column name -> Iceberg field id, or empty.
    """

    location: str
    filesystem: pafs.FileSystem
    fs_path: str
    field_ids: dict[str, int] = field(default_factory=dict)
    compression: str = "zstd"

    def write(self, rows: pa.Table, stem: str) -> WrittenFile:
        """Write ``rows`` (the row shape, as ``engines.chunks.chunk_rows`` builds it) as ``<stem>.parquet``."""
        written = self.write_parts(iter([rows]), stem)
        assert written is not None
        return written

    def write_parts(self, parts: Iterator[pa.Table], stem: str, empty: bool = True) -> WrittenFile | None:
        """Write the row-shape tables ``parts`` as they come into one file ``<stem>.parquet`` (a chunk
        written while PostgreSQL still sends it); None when they hold no rows and not ``empty``.

        Decimals are stored as integers where they fit (Iceberg's spec, and what Spark writes);
        timestamps keep microseconds; every column carries its field id when the target has them;
        dictionary encoding only for the columns ``dictionary_columns`` finds repetitive.
        An exception from ``parts`` removes the partial file and goes on up.
        """
        path = f"{self.fs_path}/{stem}.parquet"
        stream: pa.NativeFile | None = None
        writer: pq.ParquetWriter | None = None
        pending: list[pa.Table] = []
        pending_rows = rows = 0

        def flush() -> None:
            nonlocal stream, writer, pending, pending_rows
            block = pa.concat_tables(pending)
            if writer is None:
                stream = self.filesystem.open_output_stream(path)  # ours: its position is the file's size
                writer = pq.ParquetWriter(stream, block.schema,
                                          compression=self.compression, store_decimal_as_integer=True,
                                          coerce_timestamps="us", write_statistics=True,
                                          use_dictionary=dictionary_columns(block))
            writer.write_table(block, row_group_size=ROW_GROUP_ROWS)
            pending, pending_rows = [], 0

        try:
            for part in parts:
                pending.append(self._with_ids(part))
                pending_rows += part.num_rows
                rows += part.num_rows
                if pending_rows >= ROW_GROUP_ROWS:
                    flush()
            if pending and (rows or empty or writer is not None):
                flush()
            if writer is None:
                return None
            writer.close()  # the footer written; the stream is ours to close
            assert stream is not None
            size = stream.tell()
            stream.close()
            footer = _footer(writer)
            writer = stream = None
        except BaseException:
            if writer is not None:
                with contextlib.suppress(Exception):  # the error that brought us here is the one to raise
                    writer.close()
            if stream is not None:
                with contextlib.suppress(Exception):
                    stream.close()
            with contextlib.suppress(OSError):
                self.filesystem.delete_file(path)
            raise
        return WrittenFile(f"{self.location.rstrip('/')}/{stem}.parquet", size, rows, footer)

    def _with_ids(self, rows: pa.Table) -> pa.Table:
        """``rows`` with each column's field id, when the target has them."""
        if not self.field_ids:
            return rows
        missing = [n for n in rows.column_names if n not in self.field_ids]
        if missing:
            raise ValueError(f"columns {missing} have no field id in the target table; the copy must go"
                             " through Spark")
        schema = pa.schema([f.with_metadata({FIELD_ID: str(self.field_ids[f.name]).encode()}) for f in rows.schema])
        return pa.Table.from_arrays(rows.columns, schema=schema)


def _footer(writer: pq.ParquetWriter) -> bytes | None:
    """The Thrift footer ``writer`` (closed) wrote, or None if this pyarrow does not tell it.

    ``write_metadata_file`` frames it as a file of its own (``PAR1``, the footer, its length,
    ``PAR1``), so the footer is that file less 4 bytes ahead and 8 behind. The metadata is the inner
    writer's, as ``pq.write_table``'s ``metadata_collector`` takes it: no public attribute holds it.
    """
    metadata = getattr(getattr(writer, "writer", None), "metadata", None)
    if metadata is None:
        return None
    framed = pa.BufferOutputStream()
    metadata.write_metadata_file(framed)
    return framed.getvalue().to_pybytes()[4:-8]


def dictionary_columns(rows: pa.Table) -> list[str]:
    """The columns of ``rows`` (a file's first row group) worth dictionary encoding: at most one distinct
    value in ``DICTIONARY_RATIO`` of its first ``DICTIONARY_SAMPLE`` rows (booleans never: their plain
    values are bits already; nor lists, which ``count_distinct`` does not take).

    pyarrow's default encodes every column with a dictionary and falls back to plain values once the
    dictionary outgrows a page, after hashing every value. Measured on ``bench/initial_copy.py``'s
    table (1.77M rows, zstd): a dictionary on every column 1.00 CPU-s and 51.7 MB, on the repetitive
    column only 0.45 CPU-s and 42.7 MB: keys, timestamps and free text pay for a dictionary they
    then drop, and zstd compresses their plain values better than the fallback's mix. The sample
    keeps the choice cheap (8 ms a file; 0.4 s on a whole row group).
    """
    sample = rows.slice(0, DICTIONARY_SAMPLE)
    limit = max(1, sample.num_rows // DICTIONARY_RATIO)
    return [name for name, column in zip(sample.column_names, sample.columns, strict=True)
            if not pa.types.is_boolean(column.type) and not pa.types.is_nested(column.type)
            and pc.count_distinct(column).as_py() <= limit]


def local_path(location: str) -> str | None:
    """The local path ``location`` names (a path, or a ``file:`` URI: ``file:///x`` and ``file:/x`` name
    the same one); None for any other scheme."""
    scheme = urlparse(location).scheme
    if scheme not in ("", "file"):
        return None
    path = location[len("file:"):] if scheme == "file" else location
    while path.startswith("//"):
        path = path[1:]
    return path


def open_folder(location: str) -> tuple[pafs.FileSystem, str] | None:
    """The ``pyarrow.fs`` filesystem and path for folder ``location`` (a local path or ``file:`` URI,
    created if missing; an ``s3://`` URI on the configured object store, where folders need no
    creating); None for any other scheme: the copy then keeps Spark's writer.

    ``s3://`` is reached with the one ``storage`` section every engine uses (``headrace.storage``),
    so pyarrow writes as the same account as Spark's S3A. Other stores (``gs``, ``hdfs``, ...) are
    left to Spark: pyarrow would find their credentials its own way, and they are untested.
    """
    from headrace import storage

    if storage.is_object_store(location):
        return storage.filesystem(location)
    path = local_path(location)
    if path is None:
        return None
    filesystem: pafs.FileSystem = pafs.LocalFileSystem()
    try:
        filesystem.create_dir(path, recursive=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError):
        return None
    return filesystem, path.rstrip("/")
