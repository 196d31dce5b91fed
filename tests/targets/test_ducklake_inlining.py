"""DuckLake's data inlining for small change batches: no Parquet file a batch, and the rows written out
as one file once enough have gathered (``targets/ducklake/inlining.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pytest

from headrace.targets.ducklake import inlining
from headrace.targets.ducklake.target import DuckLakeTarget
from tests.targets.test_ducklake_copies import _rows, _table
from tests.targets.test_ducklake_group_apply import _changes
from tests.targets.test_ducklake_target import plain_duckdb, settings_for


def _files(target: DuckLakeTarget, name: str) -> tuple[int, int]:
    """The table's live data files and its rows in them (``ducklake_table_info``: files only)."""
    with target._lock:
        row = target._con.execute("SELECT file_count, file_size_bytes FROM ducklake_table_info('hr_lake')"
                                  " WHERE table_name = ?", [name]).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_small_batches_add_no_file_and_are_written_out_together(spark: Any, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inlining, "FLUSH_ROWS", 12)
    target = DuckLakeTarget(spark, settings_for("duckdb", tmp_path), "p1")
    table = _table("small", 11)
    target.write_snapshot_arrow(table, _rows(2000))  # over inline_rows (1,000): a Parquet file
    assert _files(target, "small")[0] == 1
    for i in range(2):  # 10 changed rows: under FLUSH_ROWS, kept in the catalog
        target.apply_arrow_batch(table, _changes([i * 5 + k for k in range(5)], "U", 200 + i), None, 1 + i)
    assert _files(target, "small")[0] == 1
    target.apply_arrow_batch(table, _changes([3000, 3001, 3], "I", 300), None, 3)  # 13 rows: written out
    files, _ = _files(target, "small")
    assert files == 2
    assert target.read_cursor(table) == 3
    target.close()
    con = plain_duckdb(settings_for("duckdb", tmp_path))
    try:
        rows = dict(con.execute("SELECT id, name FROM lake.public.small").fetchall())
    finally:
        con.close()
    assert len(rows) == 2002
    assert all(rows[k] == f"new{k}" for k in range(10)) and rows[3000] == "new3000" and rows[3] == "new3"
    assert rows[10] == "n10"


def test_inline_rows_zero_writes_a_file_a_batch(spark: Any, tmp_path: Path) -> None:
    settings = settings_for("duckdb", tmp_path).model_copy(update={"inline_rows": 0})
    target = DuckLakeTarget(spark, settings, "p1")
    table = _table("filed", 12)
    target.write_snapshot_arrow(table, _rows(10))
    target.apply_arrow_batch(table, _changes([1, 2], "U", 200), None, 1)
    assert _files(target, "filed")[0] == 2
    target.close()


def test_a_failed_flush_is_not_the_committed_batchs_error(spark: Any, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: object) -> None:
        raise duckdb.IOException("the catalog went away")

    monkeypatch.setattr(inlining, "FLUSH_ROWS", 3)
    monkeypatch.setattr(inlining, "flush", broken)
    target = DuckLakeTarget(spark, settings_for("duckdb", tmp_path), "p1")
    table = _table("kept", 13)
    target.write_snapshot_arrow(table, _rows(10))
    target.apply_arrow_batch(table, _changes([1, 2, 3, 4], "U", 200), None, 1)  # past FLUSH_ROWS: the flush fails
    assert target.read_cursor(table) == 1  # committed, and the apply did not raise
    target.close()


def test_a_small_copy_writes_a_file_and_the_batches_after_it_are_inlined(spark: Any, tmp_path: Path) -> None:
    """A copy never inlines (a table's first inlined write creates its inlined-data table in the
    catalog, which made each small table's copy commit 3.5x dearer): a copy of fewer rows than
    ``inline_rows`` is a Parquet file, and the small batches after it still go into the catalog."""
    target = DuckLakeTarget(spark, settings_for("duckdb", tmp_path), "p1")
    table = _table("tiny", 13)
    target.write_snapshot_arrow(table, _rows(10))  # 10 rows, under inline_rows (1,000)
    assert _files(target, "tiny")[0] == 1
    target.apply_arrow_batch(table, _changes([1, 2], "U", 200), None, 1)
    assert _files(target, "tiny")[0] == 1  # the batch's rows are in the catalog
    assert target.read_cursor(table) == 1
    target.close()
    con = plain_duckdb(settings_for("duckdb", tmp_path))
    try:
        assert con.execute("SELECT count(*), count(*) FILTER (WHERE name LIKE 'new%') FROM lake.public.tiny"
                           ).fetchone() == (10, 2)
    finally:
        con.close()
