"""``driver_delta.KeyIndex`` (its ``core.key_rows.KeyRows``) against a model: after any run of batches (updates, deletes, re-inserts,
new keys), a batch's candidates are exactly the live rows holding its keys, wherever they are (the
sorted rows, the rows appended since, after a sort again), for integer keys found by binary search
and for other keys by ``is_in``."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from headrace.engines.driver import key_rows
from headrace.engines.driver.key_rows import IDX as _IDX
from headrace.engines.driver.key_rows import KeyRows
from headrace.targets.iceberg.driver_delta import _FILE, _POS, KeyIndex

SCHEMA = {"int64": pa.int64(), "int32": pa.int32(), "string": pa.string()}


def _table(keys: list[object], key_type: pa.DataType, file: int) -> pa.Table:
    n = len(keys)
    return pa.table({"id": pa.array(keys, key_type), "_hr_lsn": pa.array([file] * n, pa.int64()),
                     "_hr_seq": pa.array(range(n), pa.int64()), _FILE: pa.array([file] * n, pa.int32()),
                     _POS: pa.array(range(n), pa.int64())})


@pytest.mark.parametrize("key_type", ["int64", "int32", "string"])
@pytest.mark.parametrize("layout", ["sorted", "chunks", "shuffled"])
def test_candidates_follow_every_batch(key_type: str, layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``chunks``: as files are read, each sorted, in another order (kept as they are, reordered);
    ``shuffled``: sorted once."""
    monkeypatch.setattr(key_rows, "RESORT_APPENDED", 300)  # appended rows trigger a sort within the run
    arrow = SCHEMA[key_type]
    rng = random.Random(7)

    def key(i: int) -> object:
        return f"k{i:06d}" if key_type == "string" else i

    first = list(range(1, 3001))
    if layout == "shuffled":
        rng.shuffle(first)
    rows = _table([key(i) for i in first], arrow, 0)
    if layout == "chunks":
        first = [*range(2001, 3001), *range(1, 1001), *range(1001, 2001)]
        rows = pa.concat_tables([_table([key(i) for i in first[at:at + 1000]], arrow, 0) for at in (0, 1000, 2000)])
        rows = rows.set_column(4, _POS, pa.array(range(3000), pa.int64()))
    index = KeyIndex(1, ["f0"], KeyRows(rows), whole=True)
    assert len(index.keys._runs) == (0 if key_type == "string" else 3 if layout == "chunks" else 1)
    model = {key(i): (0, at) for at, i in enumerate(first)}  # live key -> (file, row number)
    next_key = 10_000
    for batch in range(1, 60):
        wanted = [key(rng.randint(1, next_key)) for _ in range(rng.randint(1, 400))]
        found = index.candidates(pa.array(wanted, arrow))
        got = sorted(zip(found.column("id").to_pylist(), found.column(_FILE).to_pylist(),
                         found.column(_POS).to_pylist(), strict=True))
        assert got == sorted((k, *model[k]) for k in set(wanted) if k in model), batch
        # Replace or delete some of the rows found; write new versions of some, and new keys.
        hits = found.column(_IDX).to_numpy()
        chosen = [i for i in range(len(hits)) if rng.random() < 0.7]
        removed = hits[chosen]
        keys_removed = [found.column("id")[i].as_py() for i in chosen]
        for k in keys_removed:
            del model[k]
        rewritten = [k for k in keys_removed if rng.random() < 0.6]
        fresh = [key(next_key + i) for i in range(rng.randint(0, 80))]
        next_key += len(fresh)
        added = _table(rewritten + fresh, arrow, batch).select(["id", "_hr_lsn", "_hr_seq"])
        index.advance(batch + 1, removed, added, f"f{batch}" if added.num_rows else None)
        if added.num_rows:
            for at, k in enumerate(rewritten + fresh):
                model[k] = (len(index.locations) - 1, at)
        assert int(index.keys.live.sum()) == len(model), batch
    assert index.snapshot_id == 60


def test_duplicate_integer_keys_fall_back_to_is_in() -> None:
    """Binary search finds one row of a key: a table holding a key twice is searched with ``is_in``."""
    index = KeyIndex(1, ["f0"], KeyRows(_table([3, 1, 2, 3], pa.int64(), 0)), whole=True)
    assert not index.keys._runs
    found = index.candidates(pa.array([3], pa.int64()))
    assert sorted(found.column(_POS).to_pylist()) == [0, 3]


def test_an_empty_table() -> None:
    index = KeyIndex(None, [], KeyRows(_table([], pa.int64(), 0)), whole=True)
    assert index.candidates(pa.array([1], pa.int64())).num_rows == 0
    index.advance(2, np.zeros(0, dtype=np.int64), _table([1], pa.int64(), 1).select(["id", "_hr_lsn", "_hr_seq"]),
                  "f1")
    assert index.candidates(pa.array([1], pa.int64())).column(_FILE).to_pylist() == [0]
