"""Small keyed batches applied to copy-on-write Iceberg tables on the driver (``driver_apply``) leave
exactly the rows Spark's MERGE leaves: two tables get the same batches, one each way, and every row
is compared, as Spark reads it and as readers that are not ours read it (DuckDB's iceberg extension,
pyiceberg).
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from py4j.protocol import Py4JJavaError
from pyiceberg.table import StaticTable
from pyspark.sql import SparkSession

from headrace.core.changes import UNCHANGED
from headrace.core.lanes import NotOnLane
from headrace.core.position import Position
from headrace.core.rows import unchanged_token
from headrace.core.schema import Column, ColumnType, TableSchema, TypeKind
from headrace.core.spark_types import ValueRules
from headrace.engines.driver.batch import read_driver_batch
from headrace.readers import duckdb_with, iceberg_metadata_location
from headrace.targets.ducklake.files import to_arrow
from headrace.targets.iceberg import data_files, driver_apply
from headrace.targets.iceberg.catalog import java_table
from headrace.targets.iceberg.config import IcebergConfig
from headrace.targets.iceberg.target import IcebergTarget
from tests.e2e.test_copy_files import _iceberg_values
from tests.materialize.test_driver_batch import _raw_type, _same_values, _stage, matrix_texts  # noqa: F401
from tests.targets.conftest import batch_df, snapshot_df
from tests.targets.test_contract import SNAPSHOT, TABLE

_catalogs = itertools.count()


def _pair(spark: SparkSession, tmp_path: Path, **settings: Any) -> tuple[IcebergTarget, IcebergTarget]:
    """Two targets on one warehouse: the first applies small batches on the driver, the second with
    Spark's MERGE (``apply_on_driver`` off)."""
    config = IcebergConfig(warehouse=str(tmp_path / "wh"), catalog_name=f"hr_drv_{next(_catalogs)}", **settings)
    driver, merge = IcebergTarget(spark, config, "p"), IcebergTarget(spark, config, "p")
    merge.apply_on_driver = False
    return driver, merge


def _named(table: TableSchema, name: str) -> TableSchema:
    return dataclasses.replace(table, target_as=("public", name))


def _spark_rows(target: IcebergTarget, table: TableSchema) -> list[dict[str, Any]]:
    """Every column of every row as Spark reads it (dates and timestamps as numbers), sorted by key."""
    rows = to_arrow(target.read_table(table))
    raw = rows.cast(pa.schema([pa.field(f.name, _raw_type(f.type)) for f in rows.schema])).to_pylist()
    return sorted(raw, key=lambda r: r[table.key[0]])


def _assert_same_rows(spark_left: list[dict[str, Any]], spark_right: list[dict[str, Any]]) -> None:
    assert len(spark_left) == len(spark_right)
    problems = [f"{a} != {b}" for a, b in zip(spark_left, spark_right, strict=True)
                if a.keys() != b.keys() or not all(_same_values(a[k], b[k]) for k in a)]
    assert not problems, "\n".join(problems[:5])


def _snapshot_summaries(spark: SparkSession, name: str) -> list[str | None]:
    rows = spark.sql(f"SELECT summary['{driver_apply.SUMMARY_PROPERTY}'] FROM {name}.snapshots "
                     "ORDER BY committed_at").collect()
    return [r[0] for r in rows]


MATRIX_RULES = ValueRules("public.matrix", "clamp", keep_infinity=False)  # Iceberg keeps no infinity


def driver_matrix_rows(tmp_path: Path, schema: TableSchema, rows: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """The type-matrix rows the driver builds batches of (a value only Spark casts never reaches
    ``apply_arrow_batch``)."""
    taken = []
    for n, texts in enumerate(rows):
        path, facts = _stage(tmp_path / f"row{n}.parquet", schema.column_names, [("I", 100, 1, texts, None)])
        try:
            read_driver_batch([path], schema, None, MATRIX_RULES, [facts])
        except NotOnLane:
            continue
        taken.append(texts)
    assert len(taken) > 80
    return taken


def apply_both_ways(tmp_path: Path, schema: TableSchema, driver: IcebergTarget, merge: IcebergTarget,
                    batches: list[list[tuple[Any, ...]]]) -> list[int]:
    """Stage each batch and apply it to table ``by_driver`` through ``driver`` and ``by_merge`` through
    ``merge``; both hold the same values after each, as DuckDB reads them. The row counts after each."""
    by_driver, by_merge = _named(schema, "by_driver"), _named(schema, "by_merge")
    for target, table in ((driver, by_driver), (merge, by_merge)):
        target.ensure_table(table)
    counts = []
    for offset, staged in enumerate(batches, start=1):
        path, facts = _stage(tmp_path / f"batch{offset}.parquet", schema.column_names, staged)
        batch = read_driver_batch([path], schema, None, MATRIX_RULES, [facts])
        assert isinstance(batch.changes, pa.Table)
        for target, table in ((driver, by_driver), (merge, by_merge)):
            target.apply_arrow_batch(table, batch.changes, batch.truncate_before, offset)
        left, right = _iceberg_values(driver.settings, ["by_driver", "by_merge"], schema)
        assert left == right, f"after batch {offset}"
        counts.append(len(left))
    return counts


def test_every_matrix_value_lands_as_the_merge_writes_it(
    spark: SparkSession, tmp_path: Path, matrix_texts: tuple[TableSchema, list[tuple[str, ...]]]  # noqa: F811
) -> None:
    """Every type-matrix value the driver builds batches of (NULLs, Unicode, extremes, NaN and -0.0,
    arrays), inserted into an empty table, then deleted, updated with TOAST columns left unchanged,
    re-inserted, the updates replayed, and a TRUNCATE with an insert after it: both tables hold the
    same values after each step, as DuckDB reads them and as Spark does."""
    schema, rows = matrix_texts
    names = schema.column_names
    taken = driver_matrix_rows(tmp_path, schema, rows)
    toast = [names.index("c_text"), names.index("c_bytea")]

    def updated(i: int, texts: tuple[Any, ...], unchanged: bool) -> tuple[Any, ...]:
        values = list(texts)
        values[0] = taken[i][0]  # the row's own key, another row's values
        for at in toast if unchanged else ():
            values[at] = UNCHANGED
        return tuple(values)

    n = len(taken)
    nulls = [None] * (len(names) - 1)
    deleted = [("D", 200, i, (t[0], *nulls), None) for i, t in enumerate(taken) if i % 4 == 0]
    updates = [("U", 200, i, updated(i, (None, *nulls), True), None) for i in range(n) if i % 4 == 1]
    updates += [("U", 200, i, updated(i, taken[(i + 1) % n], True), None) for i in range(n) if i % 4 == 2]
    batches = [
        [("I", 100, i, t, None) for i, t in enumerate(taken)],
        [*deleted, *updates, ("D", 200, n, ("999999", *nulls), None)],  # and a key the table never had
        [("I", 300, i, updated(i, taken[(i + 2) % n], False), None) for i in range(n) if i % 4 == 0],
    ]
    batches.append(batches[1])  # replayed: changes nothing
    batches.append([("T", 400, 0, None, None), ("I", 400, 1, ("777777", *taken[3][1:]), None)])
    driver, merge = _pair(spark, tmp_path)
    counts = apply_both_ways(tmp_path, schema, driver, merge, batches)
    assert counts == [{1: n, 2: n - len(deleted), 5: 1}.get(offset, n) for offset in range(1, len(batches) + 1)]
    by_driver, by_merge = _named(schema, "by_driver"), _named(schema, "by_merge")
    assert driver.apply_lanes.counts == {"driver": len(batches)} and merge.apply_lanes.counts == {"merge": len(batches)}
    _assert_same_rows(_spark_rows(driver, by_driver), _spark_rows(merge, by_merge))
    # Four commits: the replay changed nothing and committed nothing.
    assert _snapshot_summaries(spark, driver.table_name(by_driver)) == ["driver"] * 4


def test_a_replay_commits_nothing_and_readers_that_are_not_ours_read_the_file(
    spark: SparkSession, tmp_path: Path
) -> None:
    """One driver commit per batch that changes something (its snapshot summary says so), none for a
    replay; the file carries Iceberg's field ids down to list elements; pyiceberg and DuckDB read what
    Spark reads."""
    driver, _ = _pair(spark, tmp_path)
    driver.write_snapshot(TABLE, snapshot_df(spark, TABLE, SNAPSHOT), Position(100))
    name = driver.table_name(TABLE)
    doc = unchanged_token("doc")
    batch = to_arrow(batch_df(spark, TABLE, [
        ("U", 200, 0, doc, 1, "h\u00e9 \u2603 \U0001d11e", None, [None, "", "x"], None),
        ("D", 200, 1, None, 2, None, None, None, None),
        ("I", 200, 2, None, -(2**63), "min", None, [], "d"),
        ("I", 200, 3, None, 2**63 - 1, "max", None, None, "e"),
    ]))
    driver.apply_arrow_batch(TABLE, batch, None, 1)
    driver.apply_arrow_batch(TABLE, batch, None, 1)
    assert _snapshot_summaries(spark, name) == [None, "driver"]
    assert driver.apply_lanes.counts == {"driver": 2}
    [(data_file, low, high)] = spark.sql(f"SELECT file_path, readable_metrics.id.lower_bound,"
                                          f" readable_metrics.id.upper_bound FROM {name}.data_files").collect()
    assert (low, high) == (-(2**63), 2**63 - 1)  # column metrics from the footer: later MERGEs prune by them
    element = pq.read_schema(data_file.removeprefix("file:")).field("tags").type.value_field
    iceberg_list = java_table(spark, name).schema().findField("tags").type()
    assert element.metadata == {b"PARQUET:field_id": str(iceberg_list.elementId()).encode()}
    spark_rows = sorted(tuple(r) for r in driver.read_table(TABLE).drop("_hr_commit_ts").collect())
    assert [r[:2] for r in spark_rows] == [(-(2**63), "min"), (1, "h\u00e9 \u2603 \U0001d11e"), (3, None),
                                           (2**63 - 1, "max")]
    assert spark_rows[1][3:5] == ([None, "", "x"], "big1")  # doc left unchanged: the row's value
    location = iceberg_metadata_location(driver.settings, "public", "orders")
    read = StaticTable.from_metadata(location).scan().to_arrow().drop_columns(["_hr_commit_ts"])
    assert sorted(tuple(r.values()) for r in read.to_pylist()) == spark_rows
    con = duckdb_with("avro", "iceberg")
    try:
        duck = sorted(con.execute(f"SELECT * EXCLUDE (_hr_commit_ts) FROM iceberg_scan('{location}')").fetchall())
    finally:
        con.close()
    assert duck == spark_rows


def test_the_next_batch_takes_the_rows_this_process_wrote_and_reads_another_writers(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A table's next batch takes the contents of the file its last batch wrote from memory, not from
    the file (proved by removing the file: the batch still applies, and its commit replaces that file,
    so the table reads whole again); after another writer's commit it reads the files. Every step
    leaves the rows the MERGE leaves."""
    driver, merge = _pair(spark, tmp_path)
    tables = [_named(TABLE, "mine"), _named(TABLE, "merged")]
    for target, table in zip((driver, merge), tables, strict=True):
        target.write_snapshot(table, snapshot_df(spark, table, SNAPSHOT), Position(100))

    def both(changes: list[tuple[Any, ...]]) -> list[list[tuple[Any, ...]]]:
        for target, table in zip((driver, merge), tables, strict=True):
            target.apply_arrow_batch(table, to_arrow(batch_df(spark, table, changes)), None, 1)
        got = [sorted(tuple(r) for r in t.read_table(table).drop("_hr_commit_ts").collect())
               for t, table in zip((driver, merge), tables, strict=True)]
        assert got[0] == got[1]
        return got

    both([("U", 200, 0, None, 1, "one", None, ["a"], "d1"), ("I", 200, 1, None, 9, "nine", None, None, None)])
    name = driver.table_name(tables[0])
    [(written,)] = spark.sql(f"SELECT file_path FROM {name}.data_files").collect()
    Path(written.removeprefix("file:")).unlink()  # nothing can read it back now
    both([("D", 300, 0, None, 2, None, None, None, None), ("U", 300, 1, None, 9, "nine!", None, [], "d9")])
    [(replaced,)] = spark.sql(f"SELECT file_path FROM {name}.data_files").collect()
    assert replaced != written and Path(replaced.removeprefix("file:")).exists()
    for target, table in zip((driver, merge), tables, strict=True):  # another writer's commit
        spark.sql(f"DELETE FROM {target.table_name(table)} WHERE id = 1")
    got = both([("U", 400, 0, None, 3, "three", None, None, None), ("I", 400, 1, None, 1, "back", None, None, None)])
    assert [r[:2] for r in got[0] if r[0] in (1, 3, 9)] == [(1, "back"), (3, "three"), (9, "nine!")]
    # A column dropped and added again under its name is a new column (a new field id): the rows kept
    # from the last file have no value in it, as Iceberg reads that file, not the values written.
    for target, table in zip((driver, merge), tables, strict=True):
        spark.sql(f"ALTER TABLE {target.table_name(table)} DROP COLUMN doc")
        spark.sql(f"ALTER TABLE {target.table_name(table)} ADD COLUMN doc string AFTER tags")
    both([("U", 500, 0, None, 3, "three!", None, None, "d3")])
    assert spark.sql(f"SELECT collect_list(id) FROM {name} WHERE doc IS NOT NULL").first()[0] == [3]  # type: ignore[index]
    assert driver.apply_lanes.counts == {"driver": 4}


def test_position_deletes_renamed_added_and_kept_columns(spark: SparkSession, tmp_path: Path) -> None:
    """A table that was merge-on-read (position deletes), with a column renamed, one added after the
    position columns and one dropped in the source but kept: the rows are read by field id, the
    deletes applied, the kept column keeps a row's value and is NULL in a new row, as the MERGE
    leaves it; the driver's commit leaves one data file."""
    mor, _ = _pair(spark, tmp_path, copy_on_write_below_rows=0)
    driver, merge = _pair(spark, tmp_path)
    before = [_named(TABLE, "a"), _named(TABLE, "b")]
    for table in before:
        mor.write_snapshot(table, snapshot_df(spark, table, SNAPSHOT), Position(100))
        mor.apply_batch(table, batch_df(spark, table, [("U", 150, 0, None, 1, "a1", None, None, "d1"),
                                                       ("D", 150, 1, None, 2, None, None, None, None)]), None, 1)
        name = mor.table_name(table)
        assert spark.sql(f"SELECT count(*) FROM {name}.delete_files").first()[0] == 1  # type: ignore[index]
        spark.sql(f"ALTER TABLE {name} RENAME COLUMN doc TO body")
        spark.sql(f"ALTER TABLE {name} ADD COLUMN extra bigint")
    text = ColumnType(TypeKind.STRING, "text")
    kept = TABLE.columns[1]  # "odd name, `quoted`": dropped in the source, kept in the table
    columns = tuple(c for c in TABLE.columns if c is not kept and c.name != "doc")
    evolved = dataclasses.replace(TABLE, columns=(*columns, Column("body", text, 25),
                                                  Column("extra", ColumnType(TypeKind.LONG, "bigint"), 20)))
    body = unchanged_token("body")
    changes = [("U", 200, 0, None, 1, None, ["t"], "b1", 10), ("U", 200, 1, body, 3, None, None, None, 30),
               ("I", 200, 2, None, 4, None, None, "b4", 40)]
    tables = [_named(evolved, "a"), _named(evolved, "b")]
    driver.apply_arrow_batch(tables[0], to_arrow(batch_df(spark, evolved, changes)), None, 2)
    merge.apply_arrow_batch(tables[1], to_arrow(batch_df(spark, evolved, changes)), None, 2)
    assert driver.apply_lanes.counts == {"driver": 1}
    got = [sorted(tuple(r) for r in t.read_table(table).collect()) for t, table in zip((driver, merge), tables, strict=True)]
    assert got[0] == got[1]
    by_id = {r[0]: r for r in got[0]}
    assert sorted(by_id) == [1, 3, 4]
    # The table's columns: id, the kept column, amount, tags, body, the positions, extra.
    assert by_id[1][1] == "a1" and by_id[4][1] is None  # the kept column
    assert by_id[3][4] == "big3" and by_id[1][4] == "b1"  # body left unchanged: the row's value, renamed
    assert [by_id[k][8] for k in (1, 3, 4)] == [10, 30, 40]
    counts = []
    for table in tables:
        name = driver.table_name(table)
        files = spark.sql(f"SELECT (SELECT count(*) FROM {name}.data_files), (SELECT count(*) FROM {name}.delete_files)")
        counts.append(tuple(files.first()))  # type: ignore[arg-type]
    # One data file; the delete file stays, as after Spark's copy-on-write MERGE, applying to no data
    # file any more (maintenance removes it).
    assert counts[0] == (1, 1) and counts[1][1] == 1
    left, right = _iceberg_values(driver.settings, ["a", "b"], evolved)
    assert left == right


def test_a_commit_over_a_concurrent_one_fails_validation(spark: SparkSession, tmp_path: Path) -> None:
    """The overwrite is validated from the snapshot the rows were read at: rows committed after it (by
    another writer) fail the commit instead of being dropped with the files it replaces."""
    driver, _ = _pair(spark, tmp_path)
    driver.write_snapshot(TABLE, snapshot_df(spark, TABLE, SNAPSHOT), Position(100))
    iceberg = java_table(spark, driver.table_name(TABLE))
    snapshot = iceberg.currentSnapshot()
    read = [data for data, _ in data_files.planned_files(iceberg, int(snapshot.snapshotId()))]
    driver.write_snapshot(TABLE, snapshot_df(spark, TABLE, [(8, "late", None, None, None)]), Position(100),
                          replace=False)
    with pytest.raises(Py4JJavaError, match="conflicting files"):
        driver_apply._commit(spark.sparkContext._jvm, iceberg, snapshot, read, None)
    assert len(driver.read_table(TABLE).collect()) == len(SNAPSHOT) + 1


def test_a_crash_before_the_commit_leaves_an_orphan_file_only(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new file is written before the commit: dying in between (the commit raising here) leaves the
    table as it was and the file referenced by no snapshot; the batch applied again lands once."""
    driver, _ = _pair(spark, tmp_path)
    driver.write_snapshot(TABLE, snapshot_df(spark, TABLE, SNAPSHOT), Position(100))
    name = driver.table_name(TABLE)
    before = sorted(tuple(r) for r in driver.read_table(TABLE).collect())
    batch = to_arrow(batch_df(spark, TABLE, [("I", 200, 0, None, 9, "nine", None, None, "d9")]))

    def crash(*args: Any) -> None:
        raise RuntimeError("killed before the commit")

    monkeypatch.setattr(driver_apply, "_commit", crash)
    with pytest.raises(RuntimeError, match="killed"):
        driver.apply_arrow_batch(TABLE, batch, None, 1)
    monkeypatch.undo()
    assert sorted(tuple(r) for r in driver.read_table(TABLE).collect()) == before
    listed = {r[0].removeprefix("file:") for r in spark.sql(f"SELECT file_path FROM {name}.all_data_files").collect()}
    on_disk = {str(p) for p in (tmp_path / "wh" / "public" / "orders" / "data").glob("*.parquet")}
    assert len(on_disk - listed) == 1 and next(iter(on_disk - listed)).endswith("-driver.parquet")
    driver.apply_arrow_batch(TABLE, batch, None, 1)
    assert sorted(r[0] for r in driver.read_table(TABLE).collect()) == [1, 2, 3, 9]
