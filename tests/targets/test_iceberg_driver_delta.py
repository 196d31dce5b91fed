"""Keyed batches applied to merge-on-read Iceberg tables on the driver (``driver_delta``) leave exactly
the rows Spark's MERGE leaves: two tables get the same batches, one each way, and every row is
compared as a reader that is not ours reads it (DuckDB's iceberg extension; pyiceberg too)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from py4j.protocol import Py4JJavaError
from pyiceberg.table import StaticTable
from pyspark.sql import SparkSession

from headrace.core.errors import TransientError
from headrace.core.lanes import NotOnLane
from headrace.core.position import Position
from headrace.core.rows import unchanged_token
from headrace.core.schema import TableSchema
from headrace.materialize.error_boundary import translate
from headrace.readers import iceberg_metadata_location
from headrace.targets.ducklake.files import to_arrow
from headrace.targets.iceberg import driver_delta
from headrace.targets.iceberg.catalog import java_table
from headrace.targets.iceberg.config import IcebergConfig
from headrace.targets.iceberg.target import IcebergTarget
from tests.e2e.test_copy_files import _iceberg_values
from tests.materialize.test_driver_batch import _stage, matrix_texts  # noqa: F401
from tests.targets.conftest import batch_df, snapshot_df
from tests.targets.test_contract import SNAPSHOT, TABLE
from tests.targets.test_iceberg_driver_apply import _named, apply_both_ways, driver_matrix_rows

_catalogs = itertools.count()


def _pair(spark: SparkSession, tmp_path: Path) -> tuple[IcebergTarget, IcebergTarget]:
    """Two targets on one warehouse writing every keyed table merge-on-read: the first applies driver
    batches on the driver, the second with Spark's MERGE."""
    config = IcebergConfig(warehouse=str(tmp_path / "wh"), catalog_name=f"hr_delta_{next(_catalogs)}",
                           copy_on_write_below_rows=0)
    driver, merge = IcebergTarget(spark, config, "p"), IcebergTarget(spark, config, "p")
    merge.apply_on_driver = False
    return driver, merge


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The data files whose keys ``driver_delta`` reads, as it reads them."""
    read: list[str] = []
    read_keys = driver_delta._read_keys

    def counted(data: Any, *args: Any) -> pa.Table:
        read.append(str(data.location()))
        return read_keys(data, *args)

    monkeypatch.setattr(driver_delta, "_read_keys", counted)
    return read


def _files(spark: SparkSession, name: str) -> tuple[int, int]:
    row = spark.sql(f"SELECT (SELECT count(*) FROM {name}.data_files), (SELECT count(*) FROM {name}.delete_files)")
    return tuple(row.first())  # type: ignore[arg-type,return-value]


def test_every_matrix_value_and_change_lands_as_the_merge_writes_it(
    spark: SparkSession, tmp_path: Path, matrix_texts: tuple[TableSchema, list[tuple[str, ...]]]  # noqa: F811
) -> None:
    """Type-matrix rows inserted, then deleted, updated with other rows' values, a key the table never
    had deleted, the batch replayed, keys re-inserted, and updated again over earlier position deletes:
    both tables hold the same values after each batch; a replay commits nothing."""
    schema, rows = matrix_texts
    names = schema.column_names
    taken = driver_matrix_rows(tmp_path, schema, rows)
    n = len(taken)
    nulls = [None] * (len(names) - 1)

    def keyed(i: int, texts: tuple[Any, ...]) -> tuple[Any, ...]:
        return (taken[i][0], *texts[1:])

    deleted = [("D", 200, i, (t[0], *nulls), None) for i, t in enumerate(taken) if i % 3 == 0]
    updates = [("U", 200, i, keyed(i, taken[(i + 1) % n]), None) for i in range(n) if i % 3 == 1]
    batches = [
        [("I", 100, i, t, None) for i, t in enumerate(taken)],
        [*deleted, *updates, ("D", 200, n, ("999999", *nulls), None)],
        [],  # the batch before, replayed
        [("I", 300, i, keyed(i, taken[(i + 2) % n]), None) for i in range(n) if i % 3 == 0],
        [("U", 400, i, keyed(i, taken[(i + 5) % n]), None) for i in range(n) if i % 2 == 0],
    ]
    batches[2] = batches[1]
    driver, merge = _pair(spark, tmp_path)
    counts = apply_both_ways(tmp_path, schema, driver, merge, batches)
    by_driver = _named(schema, "by_driver")
    assert driver.apply_lanes.counts == {"driver": len(batches)} and merge.apply_lanes.counts == {"merge": len(batches)}
    name = driver.table_name(by_driver)
    operations = [r[0] for r in spark.sql(f"SELECT operation FROM {name}.snapshots ORDER BY committed_at").collect()]
    assert len(operations) == 4, operations  # the replay committed nothing
    assert _files(spark, name)[1] == 2  # the two batches that replaced rows wrote a delete file each
    assert counts[-1] == n  # every deleted key came back in batch 4
    location = iceberg_metadata_location(driver.settings, "public", "by_driver")
    assert StaticTable.from_metadata(location).scan().to_arrow().num_rows == n


def test_only_files_in_the_batch_key_range_are_read_and_readers_agree(
    spark: SparkSession, tmp_path: Path, reads: list[str]
) -> None:
    """A table too large to keep its keys between batches (``driver_key_rows``), in three data files
    over separate key ranges: a batch within one range reads that file's keys only (Iceberg's column
    metrics), its position deletes name that file only, and Spark, DuckDB and pyiceberg read the same
    rows. A batch whose range spans more rows than that goes to the MERGE."""
    driver, merge = _pair(spark, tmp_path)
    tables = [_named(TABLE, "a"), _named(TABLE, "b")]
    for target, table in zip((driver, merge), tables, strict=True):
        target.write_snapshot(table, snapshot_df(spark, table, SNAPSHOT), Position(100))  # ids 1-3
        for start in (100, 200):
            rows = [(i, f"r{i}", None, None, f"d{i}") for i in range(start, start + 10)]
            target.write_snapshot(table, snapshot_df(spark, table, rows), Position(100), replace=False)
    driver.driver_key_rows = 15  # fewer than the table's 23 rows: its keys are read for each batch
    doc = unchanged_token("doc")
    changes = [("U", 200, 0, None, 105, "new", None, ["t"], "n105"), ("D", 200, 1, None, 107, *[None] * 4),
               ("I", 200, 2, None, 150, "ins", None, None, "n150"), ("D", 200, 3, None, 160, *[None] * 4)]
    for target, table in zip((driver, merge), tables, strict=True):
        target.apply_arrow_batch(table, to_arrow(batch_df(spark, table, changes)), None, 1)
    assert len(reads) == 1 and driver.apply_lanes.counts == {"driver": 1}
    name = driver.table_name(tables[0])
    [(delete_file,)] = spark.sql(f"SELECT file_path FROM {name}.delete_files").collect()
    referenced = {r[0] for r in spark.read.parquet(delete_file).select("file_path").distinct().collect()}
    assert referenced == {reads[0]}
    left, right = _iceberg_values(driver.settings, ["a", "b"], TABLE)
    assert left == right and len(left) == 3 + 20 - 1 + 1
    spark_rows = sorted(tuple(r) for r in driver.read_table(tables[0]).drop("_hr_commit_ts").collect())
    location = iceberg_metadata_location(driver.settings, "public", "a")
    read = StaticTable.from_metadata(location).scan().to_arrow().drop_columns(["_hr_commit_ts"])
    assert sorted(tuple(r.values()) for r in read.to_pylist()) == spark_rows
    # A batch with a TOAST column left unchanged needs the row's value: the MERGE applies it.
    toast = [("U", 300, 0, doc, 1, "one", None, None, None)]
    driver.apply_arrow_batch(tables[0], to_arrow(batch_df(spark, tables[0], toast)), None, 2)
    assert driver.apply_lanes.counts == {"driver": 1, "merge": 1}
    assert {r[0]: r[4] for r in driver.read_table(tables[0]).collect()}[1] == "big1"
    # A batch whose key range spans files of more rows than driver_key_rows: the MERGE, saying why.
    wide = [("U", 400, 0, None, 2, "two", None, None, "d2"), ("U", 400, 1, None, 205, "t205", None, None, "d205")]
    with pytest.raises(NotOnLane, match=r"key range spans files of \d+ rows \(of 2\d\): more keys than"):
        driver_delta.apply_delta_on_driver(spark, java_table(spark, name), tables[0],
                                           to_arrow(batch_df(spark, tables[0], wide)), None, 12)


def test_a_compaction_between_read_and_commit_fails_the_commit(spark: SparkSession, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The deletes point at the files read: a compaction that rewrote them in between fails validation
    (the deletes would miss the rows' new copies), the table is left as it was, and the batch applied
    again lands once."""
    driver, _ = _pair(spark, tmp_path)
    driver.write_snapshot(TABLE, snapshot_df(spark, TABLE, SNAPSHOT), Position(100))
    name = driver.table_name(TABLE)
    catalog = driver.settings.catalog_name
    batch = to_arrow(batch_df(spark, TABLE, [("U", 200, 0, None, 2, "two", None, None, "d2")]))
    commit = driver_delta._commit

    def compact_first(*args: Any) -> None:
        spark.sql(f"CALL {catalog}.system.rewrite_data_files(table => 'public.orders', "
                  "options => map('rewrite-all', 'true'))")
        commit(*args)

    monkeypatch.setattr(driver_delta, "_commit", compact_first)
    with pytest.raises(Py4JJavaError, match="missing data files") as failed:
        driver.apply_arrow_batch(TABLE, batch, None, 1)
    monkeypatch.undo()
    assert isinstance(translate(failed.value, "public.orders"), TransientError)  # retried by itself
    assert {r[0]: r[1] for r in driver.read_table(TABLE).collect()}[2] == "b"
    java_table(spark, name).refresh()
    driver.apply_arrow_batch(TABLE, batch, None, 1)
    driver.apply_arrow_batch(TABLE, batch, None, 1)
    got = {r[0]: r[1] for r in driver.read_table(TABLE).collect()}
    assert got == {1: "a", 2: "two", 3: None}


def test_the_keys_kept_between_batches_follow_each_commit_and_any_other_commit_drops_them(
    spark: SparkSession, tmp_path: Path, reads: list[str]
) -> None:
    """A table's keys are read once; each later batch reads no file, and the keys it keeps follow its
    commits (updates, deletes, re-inserts, updates of rows written by earlier batches); a compaction
    in between makes them stale, and they are read again. Both tables hold the same rows after every
    batch."""
    driver, merge = _pair(spark, tmp_path)
    tables = [_named(TABLE, "a"), _named(TABLE, "b")]
    rows = [(i, f"r{i}", None, None, f"d{i}") for i in range(1, 201)]
    for target, table in zip((driver, merge), tables, strict=True):
        target.write_snapshot(table, snapshot_df(spark, table, rows), Position(100))
    batches = [
        [("U", 200, i, None, k, f"u{k}", None, None, "x") for i, k in enumerate(range(1, 201, 7))],
        [("D", 300, i, None, k, *[None] * 4) for i, k in enumerate(range(1, 201, 5))],
        [("I", 400, i, None, k, f"again{k}", None, None, "y") for i, k in enumerate(range(1, 201, 10))]
        + [("U", 400, 100, None, 8, "twice", None, None, "z")],  # a row an earlier batch wrote
        [("U", 500, i, None, k, f"v{k}", None, None, "w") for i, k in enumerate(range(2, 201, 3))],
    ]
    name = driver.table_name(tables[0])
    for offset, changes in enumerate(batches, start=1):
        if offset == 4:
            spark.sql(f"CALL {driver.settings.catalog_name}.system.rewrite_data_files(table => 'public.a', "
                      "options => map('rewrite-all', 'true'))")
        before, files = len(reads), _files(spark, name)[0]
        for target, table in zip((driver, merge), tables, strict=True):
            target.apply_arrow_batch(table, to_arrow(batch_df(spark, table, changes)), None, offset)
        assert len(reads) - before == (0 if offset in (2, 3) else files), offset
        left, right = _iceberg_values(driver.settings, ["a", "b"], TABLE)
        assert left == right, f"after batch {offset}"
    assert driver.apply_lanes.counts == {"driver": 4}
    snapshot = java_table(spark, name).currentSnapshot().snapshotId()
    index = driver_delta.KEY_INDEXES.take(str(java_table(spark, name).location()))
    assert index is not None and index.snapshot_id == snapshot and int(index.keys.live.sum()) == len(left)
