"""DuckLake change batches of several tables in one commit: each with its own cursor, replays change
nothing, and a batch that fails fails alone."""

from __future__ import annotations

import dataclasses
import os
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from headrace.core.schema import TableSchema
from headrace.source.postgres.throwaway import ThrowawayPostgres
from headrace.targets.ducklake import batches
from headrace.targets.ducklake.target import DuckLakeTarget
from tests.targets.test_ducklake_copies import _rows, _snapshots, _table
from tests.targets.test_ducklake_target import plain_duckdb, settings_for


def _changes(ids: list[int], op: str, lsn: int, name: str = "new") -> pa.Table:
    """A keyed batch in the row shape: ``op`` on each id at ``lsn``."""
    n = len(ids)
    utc = pa.timestamp("us", tz="UTC")
    names = [None if op == "D" else f"{name}{i}" for i in ids]
    return pa.table({"id": pa.array(ids, pa.int32()), "name": pa.array(names, pa.string()),
                     "doc": pa.nulls(n, pa.string()), "_hr_lsn": pa.array([lsn] * n, pa.int64()),
                     "_hr_seq": pa.array(range(n), pa.int64()), "_hr_commit_ts": pa.nulls(n, utc),
                     "_hr_op": pa.array([op] * n, pa.string()), "_hr_unchanged": pa.nulls(n, pa.string())})


def _apply_together(target: DuckLakeTarget, writes: list[tuple[TableSchema, pa.Table, int]]) -> dict[str, Any]:
    """Apply ``writes`` (table, batch, offset) from one thread each, all queued while "another commit"
    holds the lock, so they meet in one group; each table's outcome (None or its error)."""
    results: dict[str, Any] = {}

    def apply(table: TableSchema, batch: pa.Table, offset: int) -> None:
        try:
            target.apply_arrow_batch(table, batch, None, offset)
            results[table.name] = None
        except Exception as exc:
            results[table.name] = exc

    threads = [threading.Thread(target=apply, args=w) for w in writes]
    with target._lock:
        for thread in threads:
            thread.start()
        while len(target._batches._waiting) < len(threads):
            threading.Event().wait(0.01)
    for thread in threads:
        thread.join()
    return results


@pytest.mark.parametrize("kind", ["duckdb", "sqlite"])
def test_batches_waiting_together_commit_once_each_with_its_cursor_and_replay_changes_nothing(
    kind: str, spark: Any, tmp_path: Path, pg_server: ThrowawayPostgres
) -> None:
    settings = settings_for(kind, tmp_path, pg_server)
    target = DuckLakeTarget(spark, settings, "p1")
    tables = [_table(f"t{i}", 10 + i) for i in range(5)]
    for table in tables:
        target.write_snapshot_arrow(table, _rows(10))  # ids 0..9 at LSN 100
    writes = [(t, _changes([1, 2, 20 + i], "U" if i % 2 else "I", 200 + i), 7 + i) for i, t in enumerate(tables)]
    writes.append((tables[0], _changes([3], "D", 300), 99))  # a second batch of t0, after its first
    before = _snapshots(target)
    results = _apply_together(target, writes)
    assert _snapshots(target) - before == 1  # one DuckLake commit for six batches
    assert results == {t.name: None for t in tables}
    assert {t.name: target.read_cursor(t) for t in tables} == {t.name: 7 + i for i, t in enumerate(tables)} | {"t0": 99}
    replay = _apply_together(target, writes)  # replayed: nothing changes
    assert replay == {t.name: None for t in tables}
    target.close()
    con = plain_duckdb(settings)
    try:
        for i, table in enumerate(tables):
            rows = con.execute(f"SELECT id, name, _hr_lsn FROM lake.public.{table.name} ORDER BY id").fetchall()
            gone = {3} if i == 0 else set()
            expected = [(k, f"new{k}" if k in (1, 2) else f"n{k}", 200 + i if k in (1, 2) else 100)
                        for k in range(10) if k not in gone] + [(20 + i, f"new{20 + i}", 200 + i)]
            assert rows == expected, table.name
        cursors = con.execute("SELECT table_oid, count(*) FROM lake._headrace.cursor GROUP BY ALL").fetchall()
        assert sorted(cursors) == [(t.oid, 2) for t in tables]  # a row a table a commit (t0's two batches: one)
    finally:
        con.close()


def test_a_failing_batch_in_a_group_fails_alone_and_keeps_its_cursor(
    spark: Any, tmp_path: Path, pg_server: ThrowawayPostgres
) -> None:
    settings = settings_for("duckdb", tmp_path, pg_server)
    target = DuckLakeTarget(spark, settings, "p1")
    good = [_table(f"g{i}", 20 + i) for i in range(3)]
    for table in good:
        target.write_snapshot_arrow(table, _rows(3))
    missing = _table("missing", 30)  # never created: its batch cannot apply
    writes = [(t, _changes([1], "U", 400), 5) for t in good] + [(missing, _changes([1], "U", 400), 5)]
    results = _apply_together(target, writes)
    assert {name: results[name] for name in results if name != "missing"} == {t.name: None for t in good}
    assert results["missing"] is not None and "missing" in str(results["missing"])
    assert [target.read_cursor(t) for t in good] == [5, 5, 5]
    assert target.read_cursor(missing) is None
    target.close()


def test_a_keyless_batch_commits_alone(spark: Any, tmp_path: Path, pg_server: ThrowawayPostgres) -> None:
    """A keyless batch is a multiset delta applied exactly once: never in a group that may be retried."""
    settings = settings_for("duckdb", tmp_path, pg_server)
    target = DuckLakeTarget(spark, settings, "p1")
    table = dataclasses.replace(_table("bag", 40), key=())
    target.write_snapshot_arrow(table, _rows(2))
    delta = _rows(2, lsn=500).append_column("_hr_op", pa.array(["I", "I"])) \
        .append_column("_hr_unchanged", pa.array([None, None], pa.string()))  # row images: two rows added
    before = _snapshots(target)
    target.apply_arrow_batch(table, delta, None, 3)
    assert target._batches._waiting == [] and _snapshots(target) - before == 1
    assert target.read_cursor(table) == 3
    target.close()
    con = plain_duckdb(settings)
    try:
        assert con.execute("SELECT count(*) FROM lake.public.bag").fetchone() == (4,)
    finally:
        con.close()


def test_cursor_rows_are_appended_and_pruned_to_each_tables_newest_and_small_tables_take_one_thread(
    spark: Any, tmp_path: Path, pg_server: ThrowawayPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batches, "PRUNE_ROWS", 3)
    settings = settings_for("duckdb", tmp_path, pg_server)
    other = DuckLakeTarget(spark, settings, "p2")  # another pipeline's cursors in the same lake stay
    with other._lock, other._transaction(_table("t0", 10)):
        other.write_cursors({10: 5})
    other.close()
    target = DuckLakeTarget(spark, settings, "p1")
    tables = [_table(f"t{i}", 10 + i) for i in range(2)]
    for table in tables:
        target.write_snapshot_arrow(table, _rows(10))
    for n in range(5):
        for i, table in enumerate(tables):
            target.apply_arrow_batch(table, _changes([1], "U", 200 + 10 * n + i), None, 10 * n + i)
        assert {t.name: target.read_cursor(t) for t in tables} == {"t0": 10 * n, "t1": 10 * n + 1}
    threads = "SELECT current_setting('threads')"
    assert target._con.execute(threads).fetchone() == (1,)  # small tables' batches: one DuckDB thread
    target.write_snapshot_arrow(tables[0], _rows(10))  # a copy: the default again
    assert target._con.execute(threads).fetchone() == (os.cpu_count(),)
    target.close()
    con = plain_duckdb(settings)
    try:
        rows = con.execute("SELECT pipeline, table_oid, log_offset FROM lake._headrace.cursor ORDER BY rowid").fetchall()
    finally:
        con.close()
    # a row a batch (each commits alone); the 4th, 7th and 10th commits first pruned each table to its newest
    assert rows == [("p2", 10, 5), ("p1", 11, 31), ("p1", 10, 40), ("p1", 11, 41)]
