"""What only IcebergTarget has: its table names, its catalog bound to one warehouse, its bounded MERGE
and its batches built on the driver.

What every target does (snapshot, changes, TOAST, replays, truncates, composite keys, keyless
tables) is in test_contract.py.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import pytest
from pyiceberg.table import StaticTable
from pyspark.sql import SparkSession

from headrace.core.errors import ConfigError
from headrace.core.maintenance import MaintenancePolicy
from headrace.core.position import Position
from headrace.core.rows import unchanged_token
from headrace.readers import duckdb_with, iceberg_metadata_location
from headrace.targets.ducklake.files import to_arrow
from headrace.targets.iceberg.catalog import java_table
from headrace.targets.iceberg.config import IcebergConfig
from headrace.targets.iceberg.target import IcebergTarget
from tests.targets.conftest import batch_df, rows_of, snapshot_df
from tests.targets.test_contract import SNAPSHOT, TABLE

_catalogs = itertools.count()


@pytest.fixture
def target(spark: SparkSession, tmp_path: Path) -> IcebergTarget:
    """An Iceberg target (in place of the contract suite's, parametrised over kinds)."""
    # A catalog per test: Spark caches a catalog by name, with the warehouse it first saw.
    settings = IcebergConfig(warehouse=str(tmp_path / "wh"), catalog_name=f"hr_ice_{next(_catalogs)}")
    return IcebergTarget(spark, settings, pipeline="p")


@pytest.fixture
def mor_target(spark: SparkSession, target: IcebergTarget) -> IcebergTarget:
    """The same target with every keyed table written merge-on-read whatever its size (as a large table
    is, ``write_mode``): what the tests of position deletes and of the bounded MERGE's scan look at."""
    return IcebergTarget(spark, target.settings.model_copy(update={"copy_on_write_below_rows": 0}), pipeline="p")


def test_table_names_are_quoted_in_the_catalog(spark: SparkSession, target: IcebergTarget) -> None:
    name = target.ensure_table(TABLE)
    assert name == "`" + target.settings.catalog_name + "`.`public`.`orders`" == target.table_name(TABLE)
    target.drop_table(TABLE)
    assert not spark.catalog.tableExists(name)


def test_catalog_name_cannot_switch_warehouse(
    spark: SparkSession, target: IcebergTarget, tmp_path: Path
) -> None:
    other = IcebergConfig(warehouse=str(tmp_path / "other"), catalog_name=target.settings.catalog_name)
    with pytest.raises(ConfigError, match="catalog_name"):
        IcebergTarget(spark, other, pipeline="p")
    IcebergTarget(spark, target.settings, pipeline="p")  # the same warehouse again is fine


def three_data_files(spark: SparkSession, target: IcebergTarget) -> None:
    """Rows 1..300 of ``TABLE`` at position 100 in three data files of disjoint key ranges (spark.range
    splits 1..300 into contiguous thirds)."""
    rows = spark.range(1, 301, numPartitions=3).selectExpr(
        "id", "cast(id AS string) AS `odd name, ``quoted```", "CAST(NULL AS decimal(20,4)) AS amount",
        "CAST(NULL AS array<string>) AS tags", "concat('doc', id) AS doc", "100L AS _hr_lsn", "0L AS _hr_seq",
        "TIMESTAMP '2024-01-01 00:00:00' AS _hr_commit_ts")
    target.write_snapshot(TABLE, rows, Position(100))


def test_merge_of_keys_in_one_file_reads_and_touches_no_other_file(
    spark: SparkSession, mor_target: IcebergTarget, tmp_path: Path
) -> None:
    """The MERGE is bounded by the batch's keys: with the other data files moved away it still
    runs (so it never opened them), its deletes name only the one file, and the rows are right."""
    target = mor_target
    target.ensure_table(TABLE)
    name = target.table_name(TABLE)
    three_data_files(spark, target)
    files = {r.file_path: (r.lo, r.hi) for r in spark.sql(
        f"SELECT file_path, readable_metrics.id.lower_bound AS lo, readable_metrics.id.upper_bound AS hi"
        f" FROM {name}.data_files").collect()}
    assert sorted(files.values()) == [(1, 100), (101, 200), (201, 300)]
    batch = batch_df(spark, TABLE, [
        ("U", 200, 0, None, 10, "ten", None, None, "new10"),
        ("U", 200, 1, "doc", 20, "twenty", None, None, None),  # doc unchanged (TOAST): keeps doc20
        ("D", 200, 2, None, 30, None, None, None, None),
        ("I", 200, 3, None, 50_000, "new", None, None, "x"),  # above every file's range: widens the bound
    ])
    others = [Path(f.removeprefix("file:")) for f, (lo, _) in files.items() if lo != 1]
    for path in others:
        path.rename(path.with_suffix(".away"))
    try:
        target.apply_batch(TABLE, batch.where("id <> 50000"), None, 1)
    finally:
        for path in others:
            path.with_suffix(".away").rename(path)
    deleted_from = {r[0] for r in spark.sql(f"SELECT DISTINCT file_path FROM {name}.position_deletes").collect()}
    assert deleted_from == {f for f, (lo, _) in files.items() if lo == 1}
    target.apply_batch(TABLE, batch, None, 1)  # replayed, now with the insert: only the insert is new
    got = {r[0]: (r[1], r[4], r[5]) for r in rows_of(target, TABLE).values()}
    want = {i: (str(i), f"doc{i}", 100) for i in range(1, 301) if i != 30}
    want.update({10: ("ten", "new10", 200), 20: ("twenty", "doc20", 200), 50_000: ("new", "x", 200)})
    assert got == want


def test_maintenance_lays_the_files_out_by_key(spark: SparkSession, mor_target: IcebergTarget) -> None:
    """After random-key merges (merge-on-read, as into a large table), a maintenance pass leaves data
    files of disjoint key ranges (what lets a MERGE bounded by its batch's keys skip files) and the
    same rows."""
    target = mor_target
    target.ensure_table(TABLE)
    name = target.table_name(TABLE)
    spark.sql(f"ALTER TABLE {name} SET TBLPROPERTIES ('write.target-file-size-bytes'='16000')")
    rows = spark.range(1, 601, numPartitions=2).selectExpr(
        "id", "cast(id AS string) AS `odd name, ``quoted```", "CAST(NULL AS decimal(20,4)) AS amount",
        "CAST(NULL AS array<string>) AS tags", "md5(cast(id AS string)) AS doc", "100L AS _hr_lsn", "0L AS _hr_seq",
        "TIMESTAMP '2024-01-01 00:00:00' AS _hr_commit_ts")
    target.write_snapshot(TABLE, rows, Position(100))
    for lsn in (200, 300):  # each batch's file spans nearly the whole key range
        changes = [("U", lsn, i, None, k, "upd", None, None, f"d{k}") for i, k in enumerate(range(lsn // 100, 601, 7))]
        target.apply_batch(TABLE, batch_df(spark, TABLE, changes), None, lsn)
    before = {r[0]: r for r in rows_of(target, TABLE).values()}
    target.maintain(TABLE, MaintenancePolicy(retention_seconds=0, keep_last=1, orphan_age_seconds=3 * 86400))
    ranges = sorted((r.lo, r.hi) for r in spark.sql(
        f"SELECT readable_metrics.id.lower_bound AS lo, readable_metrics.id.upper_bound AS hi FROM {name}.data_files"
    ).collect())
    assert len(ranges) > 1
    assert all(hi < next_lo for (_, hi), (next_lo, _) in zip(ranges, ranges[1:], strict=False)), ranges
    assert {r[0]: r for r in rows_of(target, TABLE).values()} == before


def test_expiry_keeps_the_snapshot_a_consistent_cut_names_and_every_later_one(
    spark: SparkSession, mor_target: IcebergTarget
) -> None:
    """``keep_from_snapshot`` (``apply.consistency: transaction``): a pass expiring everything but the
    newest snapshot (retention 0, keep_last 1) keeps the named one and those after it; readers time-travel
    to it (pyiceberg, below, reads the metadata the pass left)."""
    target = mor_target
    target.ensure_table(TABLE)
    name = target.table_name(TABLE)
    three_data_files(spark, target)
    for lsn in (200, 300):
        target.apply_batch(TABLE, batch_df(spark, TABLE, [("U", lsn, 0, None, 10, "x", None, None, "y")]), None, lsn)
    first, named, last = [r[0] for r in spark.sql(f"SELECT snapshot_id FROM {name}.snapshots ORDER BY committed_at")
                          .collect()]
    policy = MaintenancePolicy(retention_seconds=0, keep_last=1, orphan_age_seconds=3 * 86400, keep_from_snapshot=named)
    target.maintain(TABLE, policy)
    kept = {r[0] for r in spark.sql(f"SELECT snapshot_id FROM {name}.snapshots").collect()}
    assert first not in kept and {named, last} <= kept and len(kept) > 2  # the compaction's commit too
    at_named = StaticTable.from_metadata(iceberg_metadata_location(target.settings, "public", "orders")).scan(snapshot_id=named).to_arrow()
    assert at_named.num_rows == 300


def test_the_snapshot_cap_expires_the_oldest_down_to_half_and_keeps_what_a_cut_names(
    spark: SparkSession, target: IcebergTarget
) -> None:
    """``expire_snapshots`` (``maintenance.max_snapshots``): up to half the cap nothing; beyond it, the
    oldest go, whatever their age, down to half the cap, never the one a consistent cut names nor a later one;
    the rows stay, and the files only expired snapshots referenced are deleted."""
    target.ensure_table(TABLE)
    name = target.table_name(TABLE)
    three_data_files(spark, target)
    for lsn in range(200, 1100, 100):
        target.apply_batch(TABLE, batch_df(spark, TABLE, [("U", lsn, 0, None, 10, f"v{lsn}", None, None, "y")]),
                           None, lsn)

    def snapshots() -> list[int]:
        return [r[0] for r in spark.sql(f"SELECT snapshot_id FROM {name}.snapshots ORDER BY committed_at").collect()]

    every, rows = snapshots(), rows_of(target, TABLE)
    assert len(every) >= 10
    files_before = len(list((Path(target.settings.warehouse) / "public" / "orders" / "data").glob("*.parquet")))
    policy = MaintenancePolicy(retention_seconds=3600, keep_last=2, orphan_age_seconds=3 * 86400)
    assert target.expire_snapshots(TABLE, replace(policy, max_snapshots=2 * len(every))) == 0
    named = every[2]
    assert target.expire_snapshots(TABLE, replace(policy, max_snapshots=4, keep_from_snapshot=named)) == 2
    assert snapshots() == every[2:]
    assert target.expire_snapshots(TABLE, replace(policy, max_snapshots=4)) == len(every) - 4
    assert snapshots() == every[-2:] and rows_of(target, TABLE) == rows
    files = {r[0].removeprefix("file:") for r in spark.sql(f"SELECT file_path FROM {name}.all_data_files").collect()}
    on_disk = {str(p) for p in (Path(target.settings.warehouse) / "public" / "orders" / "data").glob("*.parquet")}
    # Left: the kept snapshots' files, and the one the oldest kept snapshot replaced (Iceberg deletes a
    # file when the snapshot that removed it is expired).
    assert files <= on_disk and len(on_disk - files) <= 1 < files_before - len(on_disk)


@pytest.mark.parametrize("mode", ["copy_on_write", "merge_on_read"])
def test_a_batch_built_on_the_driver_writes_what_the_spark_batch_writes(
    spark: SparkSession, request: pytest.FixtureRequest, mode: str
) -> None:
    """``apply_arrow_batch`` (bounds from Arrow, the batch as a local relation) and ``apply_batch``
    leave the same rows after the same batches: TOAST columns left unchanged, deletes, a batch of
    more keys than the MERGE lists, a replay, a truncate; in either write mode (``write_mode``: the
    contract suite's small tables are copy-on-write)."""
    target: IcebergTarget = request.getfixturevalue("target" if mode == "copy_on_write" else "mor_target")
    twin = replace(TABLE, oid=TABLE.oid + 1, name="orders_twin")
    doc, odd = unchanged_token("doc"), unchanged_token("odd name, `quoted`")
    batches = [
        [("U", 200, 0, doc, 1, "one", Decimal("-0.0001"), ["y"], None),
         ("U", 200, 1, f"{doc},{odd}", 2, None, None, None, None),
         ("D", 200, 2, None, 3, None, None, None, None),
         ("I", 200, 3, None, 7, "h\u00e9 \u2603 'q'", Decimal("99999999999999.9999"), [None, ""], "d7")],
        [("I", 300, i, None, 1000 + i, f"n{i}", Decimal(i), None, f"doc{i}") for i in range(250)]
        + [("U", 300, 250, doc, 2, "again", None, ["z"], None)],
    ]
    for table in (TABLE, twin):
        target.write_snapshot(table, snapshot_df(spark, table, SNAPSHOT), Position(100))
    for offset, rows in enumerate(batches + batches[:1], start=1):  # the first again: a replay
        target.apply_batch(TABLE, batch_df(spark, TABLE, rows), None, offset)
        target.apply_arrow_batch(twin, to_arrow(batch_df(spark, twin, rows)), None, offset)
    assert rows_of(target, twin) == rows_of(target, TABLE)
    assert rows_of(target, twin)[1] == (1, "one", Decimal("-0.0001"), ["y"], "big1", 200, 0)
    assert len(rows_of(target, twin)) == len(SNAPSHOT) - 1 + 1 + 250
    truncated = [("I", 600, 1, None, 5, "after", None, None, "d")]
    target.apply_batch(TABLE, batch_df(spark, TABLE, truncated), Position(600, 0), 9)
    target.apply_arrow_batch(twin, to_arrow(batch_df(spark, twin, truncated)), Position(600, 0), 9)
    assert rows_of(target, twin) == rows_of(target, TABLE) == {5: (5, "after", None, None, "d", 600, 1)}
    # Copy-on-write: applied on the driver (``driver_apply``); merge-on-read: the MERGE.
    assert target.apply_lanes.counts == {"driver" if mode == "copy_on_write" else "merge": 4}


def test_a_first_batch_on_a_fresh_thread_finds_its_catalog(spark: SparkSession, target: IcebergTarget) -> None:
    """The first use of a catalog from an apply worker's thread (as after a restart, with the table
    streaming already): the table-size lookup must not fall back to spark_catalog."""
    target.write_snapshot(TABLE, snapshot_df(spark, TABLE, SNAPSHOT), Position(100))
    settings = target.settings.model_copy(update={"catalog_name": f"hr_ice_{next(_catalogs)}"})
    fresh = IcebergTarget(spark, settings, pipeline="p")
    batch = to_arrow(batch_df(spark, TABLE, [("I", 200, 0, None, 9, "nine", None, None, "d9")]))
    errors: list[BaseException] = []

    def first_batch() -> None:
        try:
            fresh.apply_arrow_batch(TABLE, batch, None, 1)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            errors.append(exc)

    worker = threading.Thread(target=first_batch)
    worker.start()
    worker.join()
    assert not errors, errors
    assert rows_of(fresh, TABLE)[9] == (9, "nine", None, None, "d9", 200, 0)


def test_a_batch_over_many_data_files_writes_one_delete_file(spark: SparkSession, mor_target: IcebergTarget) -> None:
    """Position deletes are scoped to the partition (``write.delete.granularity``): a batch that deletes
    rows from three data files writes one delete file, not one per data file plus a rewrite of each
    file's earlier deletes, and DuckDB (a reader that is not ours) reads what Spark reads."""
    target = mor_target
    target.ensure_table(TABLE)
    name = target.table_name(TABLE)
    three_data_files(spark, target)
    for lsn in (200, 300):  # keys in every data file: an update and a delete in each third
        changes = [("U", lsn, 0, None, lsn // 100, "u", None, None, "x"), ("D", lsn, 1, None, 100 + lsn // 100, *[None] * 4),
                   ("U", lsn, 2, None, 200 + lsn // 100, "u", None, None, "y"), ("I", lsn, 3, None, 1000 + lsn, "i", None, None, "z")]
        target.apply_arrow_batch(TABLE, to_arrow(batch_df(spark, TABLE, changes)), None, lsn)
    added = [int(r[0]) for r in spark.sql(
        f"SELECT coalesce(summary['added-delete-files'], '0') FROM {name}.snapshots ORDER BY committed_at"
    ).collect()]
    assert added[-2:] == [1, 1]  # the two batches' MERGEs (file granularity: 3, then 4 and 3 removed)
    assert spark.sql(f"SELECT count(*) FROM {name}.delete_files").first()[0] == 2  # type: ignore[index]
    spark_rows = sorted((r[0], r[4]) for r in rows_of(target, TABLE).values())
    con = duckdb_with("avro", "iceberg")
    try:
        scan = f"iceberg_scan('{iceberg_metadata_location(target.settings, 'public', 'orders')}')"
        duck_rows = sorted(con.execute(f"SELECT id, doc FROM {scan}").fetchall())
    finally:
        con.close()
    assert duck_rows == spark_rows
    assert len(spark_rows) == 300 - 2 + 2 and (2, "x") in spark_rows and (102, "doc102") not in spark_rows


def test_the_write_mode_follows_the_table_size(spark: SparkSession, target: IcebergTarget) -> None:
    """A keyed table below ``copy_on_write_below_rows`` is written copy-on-write (no delete file), one of
    twice that merge-on-read, and back when deletes shrink it; the rows are the same in every mode,
    a replay changes nothing, and DuckDB reads what Spark reads."""
    sized = IcebergTarget(spark, target.settings.model_copy(update={"copy_on_write_below_rows": 400}), pipeline="p")
    sized.ensure_table(TABLE)
    name = sized.table_name(TABLE)
    three_data_files(spark, sized)  # 300 rows
    java = java_table(spark, name)

    def apply(lsn: int, changes: list[tuple[object, ...]]) -> tuple[str, int]:
        sized.apply_arrow_batch(TABLE, to_arrow(batch_df(spark, TABLE, changes)), None, lsn)
        deletes = spark.sql(f"SELECT count(*) FROM {name}.delete_files").first()[0]  # type: ignore[index]
        return java.properties().get("write.merge.mode"), int(deletes)

    touch = [("U", 200, 0, None, 10, "ten", None, None, "u"), ("D", 200, 1, None, 150, *[None] * 4),
             ("U", 200, 2, None, 290, "u", None, None, "u")]
    assert apply(200, touch) == ("copy-on-write", 0)  # 300 rows < 400
    grow = [("I", 300, i, None, 1000 + i, "g", None, None, "g") for i in range(600)]
    assert apply(300, grow) == ("copy-on-write", 0)  # decided before the batch: 299 rows
    assert apply(400, [("U", 400, 0, None, 20, "twenty", None, None, "v"),
                       ("D", 400, 1, None, 160, *[None] * 4)]) == ("merge-on-read", 1)  # 899 >= 800
    shrink = [("D", 500, i, None, 1000 + i, *[None] * 4) for i in range(600)]
    assert apply(500, shrink) == ("merge-on-read", 2)  # 898 rows
    assert apply(600, [("U", 600, 0, None, 30, "thirty", None, None, "w")])[0] == "copy-on-write"  # 298 live
    assert apply(200, touch)[0] == "copy-on-write"  # a replay
    # Every batch is applied on the driver: copy-on-write ones rewrite the table (the one after the
    # shrink reads delete files), merge-on-read ones write position deletes (``driver_delta``).
    assert sized.apply_lanes.counts == {"driver": 6}
    want = {i: (str(i), f"doc{i}") for i in range(1, 301) if i not in (150, 160)}
    want.update({10: ("ten", "u"), 290: ("u", "u"), 20: ("twenty", "v"), 30: ("thirty", "w")})
    assert {r[0]: (r[1], r[4]) for r in rows_of(sized, TABLE).values()} == want
    con = duckdb_with("avro", "iceberg")
    try:
        scan = f"iceberg_scan('{iceberg_metadata_location(sized.settings, 'public', 'orders')}')"
        duck = {r[0]: (r[1], r[2]) for r in con.execute(f'SELECT id, "odd name, `quoted`", doc FROM {scan}').fetchall()}
    finally:
        con.close()
    assert duck == want
    # The owner's own mode is kept, however small the table.
    spark.sql(f"ALTER TABLE {name} SET TBLPROPERTIES ('write.merge.mode'='merge-on-read',"
              " 'write.update.mode'='merge-on-read', 'write.delete.mode'='merge-on-read')")
    java.refresh()
    assert apply(700, [("U", 700, 0, None, 40, "forty", None, None, "x")])[0] == "merge-on-read"
