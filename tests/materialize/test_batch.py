"""read_change_batch on hand-written staging files: dedup, key changes, truncate, skip, TOAST."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from headrace.core.changes import UNCHANGED, Value
from headrace.core.position import Position
from headrace.core.schema import Column, ColumnType, TableSchema, TypeKind
from headrace.engines.spark import batch as spark_batch
from headrace.engines.spark.batch import read_change_batch
from headrace.log.codec import StagingBuffer, encode_row, write_staging_file
from headrace.log.facts import FileFacts

INT = ColumnType(TypeKind.INT, "integer")
TEXT = ColumnType(TypeKind.STRING, "text")
TABLE = TableSchema(
    oid=1,
    schema="public",
    name="t",
    columns=(Column("id", INT, 23), Column("name", TEXT, 25), Column("doc", TEXT, 25)),
    key=("id",),
)
NAMES = TABLE.column_names


def _stage(path: Path, changes: list[tuple[Any, ...]]) -> str:
    """Write (op, lsn, seq, values, old_key) tuples as one staging file."""
    buf = StagingBuffer()
    for op, lsn, seq, values, old_key in changes:
        data, unchanged = encode_row(NAMES, values) if values is not None else (None, None)
        buf.append(op, lsn, seq, 1_700_000_000_000_000 + lsn, 7, data, unchanged, old_key)
    write_staging_file(path, buf)
    return str(path)


def _rows(spark: SparkSession, files: list[str], skip: Position | None = None) -> tuple[Any, ...]:
    batch = read_change_batch(spark, files, TABLE, skip)
    rows = sorted(
        (r.id, r.name, r.doc, r._hr_lsn, r._hr_seq, r._hr_op, r._hr_unchanged)
        for r in batch.changes.collect()
    )
    return rows, batch.truncate_before, batch.rows_in


def row(i: int, name: Value, doc: Value = "d") -> tuple[Value, ...]:
    return (str(i), name, doc)


def test_last_change_per_key_wins_across_files(spark: SparkSession, tmp_path: Path) -> None:
    f1 = _stage(tmp_path / "1.parquet", [("I", 10, 1, row(1, "a"), None), ("I", 10, 2, row(2, "b"), None)])
    f2 = _stage(
        tmp_path / "2.parquet",
        [
            ("U", 20, 1, row(1, "a2"), None),
            ("D", 20, 2, ("2", None, None), None),
            ("I", 30, 1, row(3, ""), None),
        ],
    )
    rows, trunc, rows_in = _rows(spark, [f2, f1])
    assert rows == [
        (1, "a2", "d", 20, 1, "U", None),
        (2, None, None, 20, 2, "D", None),
        (3, "", "d", 30, 1, "I", None),  # empty string stays empty, not NULL
    ]
    assert trunc is None and rows_in == 5


def test_key_change_deletes_old_key_first(spark: SparkSession, tmp_path: Path) -> None:
    f = _stage(
        tmp_path / "1.parquet",
        [
            ("I", 10, 1, row(1, "a"), None),
            ("U", 20, 1, row(5, "a"), json.dumps({"id": "1"})),
            # the old key is reused later in the batch: that insert wins over the delete
            ("U", 30, 1, row(6, "x"), json.dumps({"id": "5"})),
            ("I", 30, 2, row(5, "again"), None),
        ],
    )
    rows, _, rows_in = _rows(spark, [f])
    assert rows == [
        (1, None, None, 20, 1, "D", None),
        (5, "again", "d", 30, 2, "I", None),
        (6, "x", "d", 30, 1, "U", None),
    ]
    assert rows_in == 4


def test_truncate_keeps_only_later_changes(spark: SparkSession, tmp_path: Path) -> None:
    f = _stage(
        tmp_path / "1.parquet",
        [
            ("I", 10, 1, row(1, "a"), None),
            ("T", 11, 1, None, None),
            ("I", 12, 1, row(2, "b"), None),
            ("T", 13, 1, None, None),
            ("I", 14, 1, row(1, "c"), None),
        ],
    )
    rows, trunc, _ = _rows(spark, [f])
    assert trunc == Position(13, 1)
    assert rows == [(1, "c", "d", 14, 1, "I", None)]


def test_skip_through_drops_changes_in_the_copy(spark: SparkSession, tmp_path: Path) -> None:
    f = _stage(
        tmp_path / "1.parquet",
        [
            ("I", 10, 1, row(1, "a"), None),
            ("T", 10, 2, None, None),
            ("U", 20, 1, row(1, "b"), None),
            ("I", 20, 2, row(2, "c"), None),
            ("I", 30, 1, row(3, "d"), None),
        ],
    )
    rows, trunc, rows_in = _rows(spark, [f], skip=Position(20, 1))
    assert trunc is None  # the truncate is already reflected in the copy
    assert rows == [(2, "c", "d", 20, 2, "I", None), (3, "d", "d", 30, 1, "I", None)]
    assert rows_in == 5


def test_unchanged_toast_column_takes_earlier_value_in_batch(spark: SparkSession, tmp_path: Path) -> None:
    f = _stage(
        tmp_path / "1.parquet",
        [
            ("U", 10, 1, ("1", "a", "big v2"), None),
            ("U", 11, 1, ("1", "b", UNCHANGED), None),  # doc came earlier in this batch
            ("U", 11, 2, ("2", "c", UNCHANGED), None),  # doc only in the target
            ("U", 12, 1, ("3", "x", None), None),
            ("U", 13, 1, ("3", "y", UNCHANGED), None),  # an explicit NULL counts as sent
        ],
    )
    rows, _, _ = _rows(spark, [f])
    assert rows == [
        (1, "b", "big v2", 11, 1, "U", None),
        (2, "c", None, 11, 2, "U", "doc"),
        (3, "y", None, 13, 1, "U", None),
    ]


def test_composite_key(spark: SparkSession, tmp_path: Path) -> None:
    table = TableSchema(
        oid=2,
        schema="public",
        name="c",
        columns=(Column("a", INT, 23), Column("b", TEXT, 25), Column("v", INT, 23)),
        key=("a", "b"),
    )
    buf = StagingBuffer()
    for op, lsn, vals, old in [
        ("I", 1, ("1", "x", "10"), None),
        ("I", 2, ("1", "y", "20"), None),
        ("U", 3, ("1", "x", "11"), None),
        ("U", 4, ("2", "y", "21"), json.dumps({"a": "1", "b": "y"})),
    ]:
        data, unchanged = encode_row(table.column_names, vals)
        buf.append(op, lsn, 1, 0, 1, data, unchanged, old)
    write_staging_file(tmp_path / "c.parquet", buf)
    batch = read_change_batch(spark, [str(tmp_path / "c.parquet")], table, None)
    rows = sorted((r.a, r.b, r.v, r._hr_op) for r in batch.changes.collect())
    assert rows == [(1, "x", 11, "U"), (1, "y", None, "D"), (2, "y", 21, "U")]


def test_key_change_leaving_toast_unchanged_takes_the_old_keys_value(spark: SparkSession, tmp_path: Path) -> None:
    def moved(new: int, old: int, name: str, doc: Value = UNCHANGED) -> tuple[Any, ...]:
        return (str(new), name, doc), json.dumps({"id": str(old)})

    f = _stage(
        tmp_path / "1.parquet",
        [
            ("U", 10, 1, row(1, "a", UNCHANGED), None),
            ("U", 20, 1, *moved(5, 1, "b")),  # doc only in the target, under the old key 1
            ("U", 30, 1, *moved(7, 5, "c")),  # and again: still key 1's target row
            ("U", 10, 2, row(2, "x", "sent2"), None),
            ("U", 20, 2, *moved(6, 2, "y")),  # doc sent earlier in the batch under the old key
            ("U", 21, 1, row(3, "z", "sent3"), None),
            ("U", 22, 1, *moved(8, 3, "z")),
            ("U", 23, 1, *moved(9, 8, "z")),  # two hops back to the value sent under key 3
            ("U", 24, 1, row(4, "w", UNCHANGED), None),  # an ordinary unchanged value: the key's own row
        ],
    )
    batch = read_change_batch(spark, [f], TABLE, None)
    rows = sorted(
        (r.id, r.name, r.doc, r._hr_op, r._hr_unchanged, r._hr_from.id if r._hr_from else None)
        for r in batch.changes.collect()
    )
    assert rows == [
        (1, None, None, "D", None, None),
        (2, None, None, "D", None, None),
        (3, None, None, "D", None, None),
        (4, "w", None, "U", "doc", None),
        (5, None, None, "D", None, None),
        (6, "y", "sent2", "U", None, None),
        (7, "c", None, "U", "doc", 1),
        (8, None, None, "D", None, None),
        (9, "z", "sent3", "U", None, None),
    ]


def _spark_work(spark: SparkSession, group: str) -> tuple[int, int, int]:
    """(jobs, stages, tasks) Spark ran under job group ``group``, once the listener bus has them all."""
    tracker = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + 10
    while True:
        jobs = [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup(group)]
        if jobs and all(j is not None and j.status == "SUCCEEDED" for j in jobs) or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    stages = [tracker.getStageInfo(s) for j in jobs if j is not None for s in j.stageIds]
    return len(jobs), len(stages), sum(s.numTasks for s in stages if s is not None)


def test_small_batch_is_built_by_one_job_of_one_task(spark: SparkSession, tmp_path: Path) -> None:
    files = [_stage(tmp_path / f"{n}.parquet", [("I", n, 1, row(n, "a"), None), ("U", n, 2, row(1, f"v{n}"), None)])
             for n in range(1, 4)]
    facts = [FileFacts(inserts=1, updates=1, update_without_old=True)] * 3  # as capture registers them: no scan job
    sc = spark.sparkContext
    sc.setJobGroup("small-batch", "one small batch")
    try:
        changes = read_change_batch(spark, files, TABLE, None, facts=facts).changes.collect()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    assert sorted((r.id, r.name) for r in changes) == [(1, "v3"), (2, "a"), (3, "a")]
    assert _spark_work(spark, "small-batch") == (1, 1, 1)  # no shuffle, no second plan


@pytest.mark.parametrize("case", ["toast", "key-toast"])
def test_one_partition_or_shuffled_the_batch_is_the_same(spark: SparkSession, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    changes = [
        ("U", 10, 1, row(1, "a", "big"), None),
        ("U", 11, 1, row(1, "b", UNCHANGED), None),
        ("I", 11, 2, row(2, "c"), None),
        ("D", 12, 1, ("2", None, None), None),
        ("U", 13, 1, row(3, "x", UNCHANGED), None),
    ]
    if case == "key-toast":
        changes.append(("U", 14, 1, ("4", "y", UNCHANGED), json.dumps({"id": "1"})))
    files = [_stage(tmp_path / "1.parquet", changes[:3]), _stage(tmp_path / "2.parquet", changes[3:])]

    def built() -> list[tuple[Any, ...]]:
        return sorted(tuple(r) for r in read_change_batch(spark, files, TABLE, Position(10, 1)).changes.collect())

    one_task = built()
    monkeypatch.setattr(spark_batch, "ONE_TASK_ROWS", 0)
    assert built() == one_task
