"""A snapshot's data files read on the driver (no Spark job): which files a snapshot has (``planFiles``
through py4j), where a file is (a local path, or the configured object store), and which of a data
file's rows its position deletes leave."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from headrace import storage
from headrace.core.filesink import local_path
from headrace.core.lanes import NotOnLane


def planned_files(iceberg: Any, snapshot_id: int, row_filter: Any = None) -> Iterator[tuple[Any, list[Any]]]:
    """(data file, its delete files) of every file of snapshot ``snapshot_id`` (py4j objects); with
    ``row_filter`` (an Iceberg ``Expression``) only the files whose column metrics allow a match."""
    scan = iceberg.newScan().useSnapshot(snapshot_id)
    tasks = (scan if row_filter is None else scan.filter(row_filter)).planFiles()
    try:
        found = tasks.iterator()
        while found.hasNext():
            task = found.next()
            # Not list(): py4j iterates a Java list until its iterator throws, and PySpark turns each
            # such exception into a Python one in ~8 more round trips (17% of a core at 10 busy tables).
            deletes = task.deletes()
            yield task.file(), [deletes.get(i) for i in range(deletes.size())]
    finally:
        tasks.close()


def local_file(location: str) -> tuple[pafs.FileSystem, str]:
    """The ``pyarrow.fs`` filesystem and path of file ``location`` (a local path or ``file:`` URI, or
    an ``s3://`` / ``s3a://`` URI on the configured object store)."""
    if storage.is_object_store(location):
        return storage.filesystem(location)
    path = local_path(location)
    if path is None:
        raise NotOnLane(f"a file out of pyarrow.fs's reach ({urlparse(location).scheme}://)")
    return pafs.LocalFileSystem(), path


def live_rows_mask(n: int, location: str, deletes: list[Any], deletes_read: dict[str, pa.Table]) -> np.ndarray | None:
    """Which of the ``n`` rows of data file ``location`` its position ``deletes`` leave; None: all."""
    if not deletes:
        return None
    keep = np.ones(n, dtype=bool)
    for delete in deletes:
        keep[_deleted_positions(delete, location, deletes_read)] = False
    return keep


def same_values(have: pa.DataType, want: pa.DataType) -> bool:
    """A file's column of type ``have`` reads as ``want`` without changing a value: the same type (field
    names and a timestamp's zone label aside), or a widening Iceberg allows (int to long, float to
    double, a decimal's precision)."""
    if pa.types.is_list(have) and pa.types.is_list(want):
        return same_values(have.value_type, want.value_type)
    if pa.types.is_timestamp(have) and pa.types.is_timestamp(want):
        return have.unit == want.unit and (have.tz is None) == (want.tz is None)
    if pa.types.is_decimal(have) and pa.types.is_decimal(want):
        return bool(have.scale == want.scale and have.precision <= want.precision)
    widened = {(pa.int32(), pa.int64()), (pa.float32(), pa.float64())}
    return bool(have == want) or (have, want) in widened


def _deleted_positions(delete: Any, data_location: str, deletes_read: dict[str, pa.Table]) -> np.ndarray:
    """The row positions of data file ``data_location`` that position-delete file ``delete`` removes."""
    if str(delete.content()) != "POSITION_DELETES" or str(delete.format()) != "PARQUET":
        raise NotOnLane(f"{delete.content()} in {delete.format()}")  # equality deletes, deletion vectors
    location = str(delete.location())
    if location not in deletes_read:
        filesystem, path = local_file(location)
        deletes_read[location] = pq.read_table(path, filesystem=filesystem, columns=["file_path", "pos"])
    rows = deletes_read[location]
    mine = rows.filter(pc.equal(rows.column("file_path"), data_location))
    return np.asarray(mine.column("pos").to_numpy(), dtype=np.int64)
