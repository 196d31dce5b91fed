"""Rows between Spark and DuckDB: a batch collected as Arrow, a snapshot written as Parquet files
under the lake's data path, and the folders of copies that crashed before registering their files.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from headrace.core.names import path_segment, quote_spark
from headrace.core.rows import HR_COMMIT_TS, HR_LSN, HR_SEQ, POSITION_COLUMNS
from headrace.core.schema import TableSchema
from headrace.engines.spark.arrow import to_arrow  # noqa: F401  (the batch's Arrow, re-exported)
from headrace.targets.ducklake.types import spark_type

if TYPE_CHECKING:
    import duckdb
    from pyspark.sql import DataFrame, SparkSession

SNAPSHOT_FOLDER = "_headrace_snapshot"  # under the data path; Spark's files for initial copies


def to_spark(spark: SparkSession, table: TableSchema, data: pa.Table) -> DataFrame:
    """``data`` (a table's rows in the row shape, read by DuckDB) as a Spark DataFrame, via the driver."""
    from pyspark.sql import types as T

    fields = [T.StructField(c.name, spark_type(c.type)) for c in table.columns]
    fields += [T.StructField(HR_LSN, T.LongType()), T.StructField(HR_SEQ, T.LongType()),
               T.StructField(HR_COMMIT_TS, T.TimestampType())]
    columns = data.to_pydict()
    rows = list(zip(*columns.values(), strict=True)) if columns else []
    return spark.createDataFrame(rows, T.StructType(fields))


def snapshot_root(data_path: str, schema: str, table: str) -> str:
    """The folder holding one table's initial-copy attempts (one uuid-named folder each)."""
    base = data_path.rstrip("/")
    return f"{base}/{SNAPSHOT_FOLDER}/{path_segment(schema)}/{path_segment(table)}"


def write_parquet(spark: SparkSession, table: TableSchema, rows: DataFrame, folder: str) -> None:
    """Spark writes the rows in target column order with microsecond timestamps."""
    from pyspark.sql import functions as F

    names = [*table.column_names, *POSITION_COLUMNS]
    # Spark's default INT96 timestamps are not a DuckLake type; micros are (with/without zone). Set for
    # the session and left set: copies of several tables write at once, and restoring the earlier value
    # after one write switched another table's write in flight back to INT96 (DuckLake then refused its
    # files: "Expected TIMESTAMP WITH TIME ZONE, found type TIMESTAMP"). No other Spark write of ours
    # goes through Spark's own Parquet writer (Iceberg has its own; staged files are pyarrow's).
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    rows.select(*[F.col(quote_spark(n)) for n in names]).write.mode("errorifexists").parquet(folder)


def attempt_folders(root: str) -> Iterator[Path]:
    """Earlier copy attempts' folders under ``root``; only local data paths are listed (on object
    stores the files stay until DuckLake's orphan-file cleanup runs)."""
    if "://" in root or not Path(root).is_dir():
        return
    yield from Path(root).iterdir()


def remove(path: str) -> None:
    """Delete a local snapshot file or folder of them (object stores: left to DuckLake's cleanup)."""
    if "://" in path:
        return
    if Path(path).is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        Path(path).unlink(missing_ok=True)


def remove_unregistered_attempts(con: duckdb.DuckDBPyConnection, lock: threading.Lock, lake: str, root: str) -> None:
    """Delete folders of earlier copies (under ``root``) that crashed before registering their files.

    Folders that any snapshot of the lake still references stay (time travel needs them).
    """
    for attempt in attempt_folders(root):
        # Attempt folders are uuid-named, so matching the name also covers paths the catalog
        # stores relative to the data path.
        with lock:
            row = con.execute(
                f"SELECT count(*) FROM __ducklake_metadata_{lake}.ducklake_data_file WHERE contains(path, ?)",
                [attempt.name + "/"],
            ).fetchone()
        if row is None or row[0] == 0:
            remove(str(attempt))
