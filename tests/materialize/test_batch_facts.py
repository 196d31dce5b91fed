"""read_change_batch with the facts capture registered gives the same batch as with the Spark job
that finds them (truncates before and after the skip point, TOAST, key moves with TOAST, keyless),
and runs fewer Spark jobs."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from headrace.core.batch import ChangeBatch
from headrace.core.changes import UNCHANGED, Value
from headrace.core.errors import TerminalError
from headrace.core.position import Position
from headrace.core.schema import Column, ColumnType, TableSchema, TypeKind
from headrace.core.spark_types import ValueRules
from headrace.engines.spark.batch import read_change_batch
from headrace.log.codec import StagingBuffer, encode_row, write_staging_file
from headrace.log.facts import FileFacts

INT = ColumnType(TypeKind.INT, "integer")
TEXT = ColumnType(TypeKind.STRING, "text")
KEYED = TableSchema(1, "public", "t", (Column("id", INT, 23), Column("name", TEXT, 25), Column("doc", TEXT, 25)),
                    ("id",))
KEYLESS = TableSchema(2, "public", "bag", (Column("id", INT, 23), Column("v", TEXT, 25)), ())

Staged = tuple[str, int, int, str | None, str | None, str | None]  # op, lsn, seq, data, unchanged, old_key


def _stage(path: Path, rows: list[Staged]) -> tuple[str, FileFacts]:
    buf = StagingBuffer()
    for op, lsn, seq, data, unchanged, old_key in rows:
        buf.append(op, lsn, seq, 1_700_000_000_000_000 + lsn, 7, data, unchanged, old_key)
    write_staging_file(path, buf)
    return str(path), buf.facts


def _keyed(intents: list[tuple[str, int, int, int, bool, bool]]) -> list[Staged]:
    """Changes as PostgreSQL would send them for KEYED: TOAST unchanged only in updates."""
    live: set[int] = set()
    out: list[Staged] = []
    lsn, seq = 100, 0
    for kind, key, other, value, new_txn, toast in intents:
        if new_txn or not out:
            lsn, seq = lsn + 10, 0
        seq += 1
        doc: Value = UNCHANGED if toast else f"d{value}"
        if kind == "T":
            out.append(("T", lsn, seq, None, None, None))
            live.clear()
        elif key not in live:
            data, _ = encode_row(KEYED.column_names, (str(key), f"n{value}", f"d{value}"))
            out.append(("I", lsn, seq, data, None, None))
            live.add(key)
        elif kind == "D":
            out.append(("D", lsn, seq, json.dumps({"id": str(key)}), None, None))
            live.discard(key)
        elif kind == "K" and other not in live:
            data, unchanged = encode_row(KEYED.column_names, (str(other), f"n{value}", doc))
            out.append(("U", lsn, seq, data, unchanged, json.dumps({"id": str(key)})))
            live.discard(key)
            live.add(other)
        else:
            data, unchanged = encode_row(KEYED.column_names, (str(key), f"n{value}", doc))
            out.append(("U", lsn, seq, data, unchanged, None))
    return out


def _same(with_facts: ChangeBatch, scanned: ChangeBatch) -> None:
    assert with_facts.changes.columns == scanned.changes.columns
    assert (with_facts.rows_in, with_facts.truncate_before, with_facts.values_changed) == \
        (scanned.rows_in, scanned.truncate_before, scanned.values_changed)
    assert Counter(tuple(r) for r in with_facts.changes.collect()) == Counter(tuple(r) for r in scanned.changes.collect())


INTENT = st.tuples(st.sampled_from("IUDKT"), st.integers(1, 4), st.integers(1, 4), st.integers(0, 9), st.booleans(),
                   st.booleans())


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(intents=st.lists(INTENT, min_size=1, max_size=14), data=st.data())
def test_facts_give_the_batch_the_scan_gives(intents: list[tuple[str, int, int, int, bool, bool]], data: Any,
                                             spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> None:
    changes = _keyed(intents)
    folder = tmp_path_factory.mktemp("facts")
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(changes) - 1)), max_size=3), label="cuts"))
    bounds = [0, *[c for c in cuts if c < len(changes)], len(changes)]
    staged = [_stage(folder / f"{i}.parquet", changes[a:b]) for i, (a, b) in enumerate(itertools.pairwise(bounds))]
    files, facts = [p for p, _ in staged], [f for _, f in staged]
    # The copy's position anywhere in (or around) the batch: truncates before and after it.
    positions = [Position(lsn, seq) for _, lsn, seq, *_ in changes]
    skip = data.draw(st.none() | st.sampled_from([Position(100, 0), *positions]), label="skip")
    _same(read_change_batch(spark, files, KEYED, skip, facts=facts), read_change_batch(spark, files, KEYED, skip))


def _keyless_rows(bad_update_at: int | None = None) -> list[Staged]:
    def row(i: int, v: str) -> str:
        return encode_row(KEYLESS.column_names, (str(i), v))[0]
    rows: list[Staged] = [
        ("I", 10, 1, row(1, "a"), None, None),
        ("I", 10, 2, row(1, "a"), None, None),  # a duplicate row
        ("T", 20, 1, None, None, None),
        ("I", 30, 1, row(2, "b"), None, None),
        ("U", 40, 1, row(2, "c"), None, row(2, "b")),
        ("D", 50, 1, row(1, "a"), None, None),
    ]
    if bad_update_at is not None:  # REPLICA IDENTITY DEFAULT on a keyless table: no old row
        rows.append(("U", bad_update_at, 1, row(3, "x"), None, None))
    return rows


@pytest.mark.parametrize("skip", [None, Position(15, 0), Position(25, 0)])
def test_keyless_facts_give_the_batch_the_scan_gives(spark: SparkSession, tmp_path: Path,
                                                     skip: Position | None) -> None:
    f, facts = _stage(tmp_path / "k.parquet", _keyless_rows())
    _same(read_change_batch(spark, [f], KEYLESS, skip, facts=[facts]), read_change_batch(spark, [f], KEYLESS, skip))


def test_a_keyless_update_without_old_row_is_refused_only_after_the_skip_point(spark: SparkSession,
                                                                                tmp_path: Path) -> None:
    f, facts = _stage(tmp_path / "k.parquet", _keyless_rows(bad_update_at=35))
    for with_facts in ([facts], None):
        with pytest.raises(TerminalError, match="REPLICA IDENTITY FULL"):
            read_change_batch(spark, [f], KEYLESS, Position(25, 0), facts=with_facts)
        # Before the copy's position it is in the copy already: no error either way.
        read_change_batch(spark, [f], KEYLESS, Position(60, 0), facts=with_facts)


def test_clamped_values_are_still_counted_with_facts(spark: SparkSession, tmp_path: Path) -> None:
    ts = TableSchema(3, "public", "ts", (Column("id", INT, 23), Column("at", ColumnType(TypeKind.DATE, "date"), 1082)),
                     ("id",))
    rows: list[Staged] = [("I", 10, 1, encode_row(ts.column_names, ("1", "infinity"))[0], None, None)]
    f, facts = _stage(tmp_path / "c.parquet", rows)
    rules = ValueRules(infinity="clamp")
    batch = read_change_batch(spark, [f], ts, None, rules, facts=[facts])
    assert batch.values_changed == read_change_batch(spark, [f], ts, None, rules).values_changed
    assert batch.values_changed


def test_an_entry_without_facts_takes_the_scan(spark: SparkSession, tmp_path: Path) -> None:
    a, fa = _stage(tmp_path / "a.parquet", _keyed([("I", 1, 1, 1, True, False), ("T", 1, 1, 1, True, False)]))
    b, _ = _stage(tmp_path / "b.parquet", _keyed([("I", 2, 1, 2, True, False)]))
    # Written by the previous version: the second entry has no facts, so the scan answers (rows of both).
    batch = read_change_batch(spark, [a, b], KEYED, None, facts=[fa, None])
    assert batch.rows_in == 3 and batch.truncate_before == Position(120, 1)


def _jobs(spark: SparkSession, group: str, run: Any) -> int:
    sc = spark.sparkContext
    sc.setJobGroup(group, "count the jobs of one batch")
    try:
        run()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    return len(sc.statusTracker().getJobIdsForGroup(group))


def test_facts_spare_the_batch_a_spark_job(spark: SparkSession, tmp_path: Path) -> None:
    f, facts = _stage(tmp_path / "j.parquet", _keyed([("I", 1, 1, 1, False, False), ("U", 1, 1, 2, True, True)]))

    def plan(with_facts: list[FileFacts | None] | None) -> Any:
        return lambda: read_change_batch(spark, [f], KEYED, None, facts=with_facts)
    scanned = _jobs(spark, "hr-facts-scan", plan(None))
    known = _jobs(spark, "hr-facts-known", plan([facts]))
    assert known < scanned
