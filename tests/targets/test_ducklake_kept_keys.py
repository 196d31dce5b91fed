"""DuckLake's kept keys (``kept_keys``) against a model: batches of updates, deletes, re-inserts and
new keys, replays, a TRUNCATE, a write the index did not make and an index that lies all leave the
table exactly as the model says, on each kind of catalog; and the index is what found the rows."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from headrace.core.position import Position
from headrace.source.postgres.throwaway import ThrowawayPostgres
from headrace.targets.ducklake import kept_keys
from headrace.targets.ducklake.target import DuckLakeTarget
from tests.targets.test_ducklake_copies import _rows, _table
from tests.targets.test_ducklake_group_apply import _changes
from tests.targets.test_ducklake_target import settings_for

TABLE = 'hr_lake."public"."kk"'  # as the target names it


def _contents(target: DuckLakeTarget) -> dict[int, tuple[str, int]]:
    with target._lock:
        rows = target._con.execute(f"SELECT id, name, _hr_lsn FROM {TABLE}").fetchall()
    assert len(rows) == len({r[0] for r in rows}), "a key twice"
    return {r[0]: (r[1], r[2]) for r in rows}


def _batch(changes: list[tuple[int, str]], lsn: int) -> pa.Table:
    """One batch: ``(id, op)`` per change, one change a key, as the pipeline's dedup leaves it."""
    parts = [_changes([k], op, lsn, "v") for k, op in changes]
    batch = pa.concat_tables(parts)
    return batch.set_column(batch.schema.get_field_index("_hr_seq"), "_hr_seq",
                            pa.array(range(batch.num_rows), pa.int64()))


@pytest.mark.parametrize("kind", ["duckdb", "sqlite", "postgres"])
def test_kept_keys_follow_every_batch(kind: str, spark: Any, tmp_path: Path, pg_server: ThrowawayPostgres,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kept_keys, "INDEX_FROM_ROWS", 0)
    monkeypatch.setattr(kept_keys, "LARGE_BATCH", 1)  # batches of a tenth of the table still use the index
    target = DuckLakeTarget(spark, settings_for(kind, tmp_path, pg_server), "p1")
    table = _table("kk", 77)
    target.write_snapshot_arrow(table, _rows(300))  # ids 0..299 at LSN 100
    model: dict[int, tuple[str, int]] = {i: (f"n{i}", 100) for i in range(300)}
    rng = random.Random(5)
    found = 0
    real_find = target._keys.find

    def counting_find(*args: Any) -> Any:
        nonlocal found
        result = real_find(*args)
        found += result is not None
        return result

    monkeypatch.setattr(target._keys, "find", counting_find)
    next_key, lsn = 300, 100
    for step in range(40):
        lsn += 10
        offset = step + 1
        keys = rng.sample(sorted(model), min(len(model), 25))
        gone = [k for k in range(next_key) if k not in model]
        changes = [(k, rng.choice("UUUD")) for k in keys]
        changes += [(k, "I") for k in rng.sample(gone, min(len(gone), 5))]
        changes += [(next_key + i, "I") for i in range(5)]
        next_key += 5
        if step == 20:  # a write no batch made: the index is stale and read again
            with target._lock:
                target._con.execute(f"INSERT INTO {TABLE} (id, name, _hr_lsn, _hr_seq) VALUES (9999, 'x', 1, 0)")
            model[9999] = ("x", 1)
            changes.append((9999, "U"))
        batch = _batch(changes, lsn)
        if step == 30:  # the index lies about a row: the delete disagrees, the batch is applied by the join
            index = target._keys._cache._indexes[TABLE]
            rows = index.keys.rows
            rowids = pa.array([v + 10**9 for v in rows.column("rowid").to_pylist()], pa.int64())
            index.keys.rows = rows.set_column(rows.schema.get_field_index("rowid"), "rowid", rowids)
        truncate = Position(lsn - 5, 0) if step == 35 else None
        if truncate is not None:
            model.clear()
        target.apply_arrow_batch(table, batch, truncate, offset)
        for k, op in changes:
            if op == "D":
                model.pop(k, None)
            else:
                model[k] = ("v" + str(k), lsn)
        assert _contents(target) == model, step
        if step % 7 == 3:  # a replay changes nothing
            target.apply_arrow_batch(table, batch, None, offset)
            assert _contents(target) == model, step
    assert TABLE in target._keys._refused  # the lying index was caught and left
    assert found >= 25  # the index found the rows of most batches (not after it lied)
    target.close()


def test_the_index_follows_the_table_without_reading_it_again(
    spark: Any, tmp_path: Path, pg_server: ThrowawayPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the first batch reads it, the index is carried by each commit: not read again."""
    monkeypatch.setattr(kept_keys, "INDEX_FROM_ROWS", 0)
    monkeypatch.setattr(kept_keys, "LARGE_BATCH", 1)
    target = DuckLakeTarget(spark, settings_for("duckdb", tmp_path, pg_server), "p1")
    table = _table("kk", 78)
    target.write_snapshot_arrow(table, _rows(50))
    reads = 0
    real_read = target._keys._read

    def counting_read(*args: Any) -> Any:
        nonlocal reads
        reads += 1
        return real_read(*args)

    monkeypatch.setattr(target._keys, "_read", counting_read)
    for i in range(5):
        target.apply_arrow_batch(table, _changes([i, 100 + i], "U" if i % 2 else "I", 200 + i), None, i + 1)
    assert reads == 1
    assert target._keys._cache._indexes[TABLE].held_rows == 50 + 5 + 5  # replaced rows stay until a sort
    assert len(_contents(target)) == 55
    target.close()


def test_a_large_batch_joins_the_table_and_lets_the_index_go(
    spark: Any, tmp_path: Path, pg_server: ThrowawayPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch of more than 1/LARGE_BATCH of the table's rows is applied by the join, the index
    dropped; the next small batch reads it again; the table stays what the batches say."""
    monkeypatch.setattr(kept_keys, "INDEX_FROM_ROWS", 0)
    target = DuckLakeTarget(spark, settings_for("duckdb", tmp_path, pg_server), "p1")
    table = _table("kk", 79)
    target.write_snapshot_arrow(table, _rows(640))
    model: dict[int, tuple[str, int]] = {i: (f"n{i}", 100) for i in range(640)}
    found: list[bool] = []
    real_find = target._keys.find

    def recording_find(*args: Any) -> Any:
        result = real_find(*args)
        found.append(result is not None)
        return result

    monkeypatch.setattr(target._keys, "find", recording_find)
    steps = [[(1, "U"), (2, "U")], [(1, "U"), (3, "D")],  # 2 rows of 640: the index
             [(k, "U") for k in range(100, 160)] + [(700, "I")],  # 61 rows > 640/32: the join
             [(5, "U"), (700, "U")]]  # small again: the index, read again
    for offset, changes in enumerate(steps, start=1):
        lsn = 100 + 10 * offset
        found.clear()
        target.apply_arrow_batch(table, _batch(changes, lsn), None, offset)
        for k, op in changes:
            if op == "D":
                model.pop(k)
            else:
                model[k] = ("v" + str(k), lsn)
        assert _contents(target) == model, offset
        assert found[0] is (offset != 3), offset
        assert (TABLE in target._keys._cache._indexes) is (offset != 3), offset
    target.close()
