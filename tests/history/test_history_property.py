"""Property: any valid change sequence (inserts, updates leaving a TOAST column unchanged or not,
deletes, key changes, truncates), cut into any staged files and batches, written with crashes that
replay batches from the mirror's cursor, gives the reference model's changelog, scd2 and
soft_delete tables (``tests/history/model.py``); history may also be turned on after some batches
(the history tables then start from the mirror's rows, as after an initial copy).

Real staged files, the driver lane's batch build (``read_driver_batch``) and a real DuckLake target
(mirror, cursor and history tables in one lake); no Spark.
"""

from __future__ import annotations

import itertools
import json
import os
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from headrace.core.changes import UNCHANGED
from headrace.core.schema import Column, ColumnType, TableSchema, TypeKind
from headrace.core.spark_types import ValueRules
from headrace.engines.driver.batch import read_driver_batch
from headrace.history.writer import apply_history
from headrace.log.codec import StagingBuffer, encode_row, write_staging_file
from headrace.log.facts import FileFacts
from headrace.targets.ducklake.config import DuckLakeConfig
from headrace.targets.ducklake.target import DuckLakeTarget
from tests.history.model import Model

settings.register_profile("history-ci", max_examples=int(os.environ.get("HISTORY_EXAMPLES", "10")), deadline=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture],
                          phases=[Phase.explicit, Phase.reuse, Phase.generate])  # shrinking a failure takes minutes
settings.register_profile("history-nightly", settings.get_profile("history-ci"), max_examples=300,
                          phases=list(Phase))
# Per test, not loaded for the process: the apply property tests in the same worker keep their own profile.
_PROFILE = settings.get_profile("history-nightly" if os.environ.get("HYPOTHESIS_PROFILE") == "nightly" else "history-ci")

BASE_US = 1_700_000_000_000_000  # staged commit time of lsn 0 (a change's time is BASE_US + its lsn)
KEYS = (1, 2, 3, 4)
MODES = ("changelog", "scd2", "soft_delete")
_tables = itertools.count(1)
_FACTS: dict[str, FileFacts] = {}  # staged path -> its facts, as capture registers them
# (kind, key, other key, value, starts a transaction, leaves t unchanged)
INTENT = st.tuples(st.sampled_from("IUUDKT"), st.sampled_from(KEYS), st.sampled_from(KEYS),
                   st.integers(0, 9), st.booleans(), st.booleans())


@contextmanager
def _lake(root: Path) -> Iterator[DuckLakeTarget]:
    """A lake of its own per example: a DuckLake commit costs more the more tables the lake holds."""
    target = DuckLakeTarget(None, DuckLakeConfig(catalog=str(root / "meta.ducklake"),  # type: ignore[arg-type]
                                                 data_path=str(root / "data")), "hist")
    try:
        yield target
    finally:
        target.close()


def _schema() -> TableSchema:
    n = next(_tables)
    text = ColumnType(TypeKind.STRING, "text")
    return TableSchema(oid=70_000 + n, schema="public", name=f"hist_{n}",
                       columns=(Column("id", ColumnType(TypeKind.INT, "integer"), 23, nullable=False),
                                Column("v", text, 25), Column("t", text, 25)),
                       key=("id",))


def _changes(intents: list[tuple[str, int, int, int, bool, bool]]) -> list[tuple[Any, ...]]:
    """Changes valid for the table as PostgreSQL emits them: (op, lsn, seq, id, v, t, old id);
    t None on an update: left unchanged (TOAST). Key changes always send t (the driver lane sends a
    key change leaving TOAST unchanged to Spark)."""
    live: set[int] = set()
    out: list[tuple[Any, ...]] = []
    lsn, seq = 100, 0
    for kind, key, other, value, new_txn, toast in intents:
        if new_txn or not out:
            lsn, seq = lsn + 10, 0
        seq += 1
        v, t = f"{kind}{value}", f"t{lsn}.{seq}"
        if kind == "T":
            out.append(("T", lsn, seq, None, None, None, None))
            live.clear()
        elif key not in live:
            out.append(("I", lsn, seq, key, v, t, None))
            live.add(key)
        elif kind == "D":
            out.append(("D", lsn, seq, key, None, None, None))
            live.remove(key)
        elif kind == "K" and other not in live:
            out.append(("U", lsn, seq, other, v, t, key))
            live.remove(key)
            live.add(other)
        else:
            out.append(("U", lsn, seq, key, v, None if toast else t, None))
    return out


def _stage(path: Path, changes: list[tuple[Any, ...]]) -> str:
    buf = StagingBuffer()
    for op, lsn, seq, key, v, t, old in changes:
        unchanged = None
        if op == "T":
            data = None
        elif op == "D":
            data = json.dumps({"id": str(key)})
        else:
            data, unchanged = encode_row(("id", "v", "t"), (str(key), v, UNCHANGED if t is None else t))
        old_key = json.dumps({"id": str(old)}) if old is not None else None
        buf.append(op, lsn, seq, BASE_US + lsn, lsn, data, unchanged, old_key)
    write_staging_file(path, buf)
    _FACTS[str(path)] = buf.facts
    return str(path)


def _apply(lake: DuckLakeTarget, table: TableSchema, files: list[str], cursor: int, end: int, history: bool,
           mirror: bool, modes: tuple[str, ...] = MODES, own: bool = False) -> None:
    """The batch of files cursor+1..end as ``execute_batch`` writes it: history tables, then the mirror
    (skipped by a crash between the two, and for a table in one mode under its own name, ``own``)."""
    entries = [(i + 1, files[i]) for i in range(cursor, end)]
    if history:
        apply_history(lake.history(), table, modes, entries, None, ValueRules(), cursor, own)  # type: ignore[arg-type]
    if mirror:
        paths = [p for _, p in entries]
        built = read_driver_batch(paths, table, None, ValueRules(), [_FACTS[p] for p in paths])
        lake.apply_arrow_batch(table, built.changes, built.truncate_before, end)


def _read(lake: DuckLakeTarget, table: TableSchema, mode: str, columns: str, own: bool = False) -> list[tuple[Any, ...]]:
    name = lake.history().name(table, mode, own)  # type: ignore[attr-defined]
    with lake._lock:
        return lake._con.execute(f"SELECT {columns} FROM {name}").fetchall()


def _us(column: str) -> str:
    return f"epoch_us({column}) - {BASE_US}"  # the lsn a test commit time stands for


@settings(_PROFILE)
@given(intents=st.lists(INTENT, min_size=1, max_size=16), data=st.data())
def test_history_tables_equal_the_model(intents: list[tuple[str, int, int, int, bool, bool]], data: Any,
                                        tmp_path_factory: pytest.TempPathFactory) -> None:
    with _lake(tmp_path_factory.mktemp("history_lake")) as lake:
        _check(intents, data, lake, tmp_path_factory)


@settings(_PROFILE)
@given(intents=st.lists(INTENT, min_size=1, max_size=16), data=st.data(), mode=st.sampled_from(MODES))
def test_a_table_in_one_mode_under_its_own_name_equals_the_model(
        intents: list[tuple[str, int, int, int, bool, bool]], data: Any, mode: str,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """No mirror: the files before history is on stand for the initial copy (they land in the table in the
    mirror's shape), the first batch turns it into the mode's table, and TOAST columns left unchanged are
    filled from the table itself. A crash replays from an older cursor, cut into other batches."""
    with _lake(tmp_path_factory.mktemp("history_lake")) as lake:
        _check(intents, data, lake, tmp_path_factory, (mode,))


def _check(intents: list[tuple[str, int, int, int, bool, bool]], data: Any, lake: DuckLakeTarget,
           tmp_path_factory: pytest.TempPathFactory, own: tuple[str, ...] = ()) -> None:
    """``own``: the table is written in this one mode under its own name (else MODES beside the mirror)."""
    modes = own or MODES
    changes = _changes(intents)
    folder = tmp_path_factory.mktemp("history_files")
    cuts = sorted(data.draw(st.sets(st.integers(1, len(changes) - 1), max_size=5), label="cuts")) \
        if len(changes) > 1 else []
    bounds = [0, *cuts, len(changes)]
    files = [_stage(folder / f"{i}.parquet", changes[a:b]) for i, (a, b) in enumerate(itertools.pairwise(bounds))]
    table = _schema()
    lake.ensure_table(table)
    model = Model()
    off_until = data.draw(st.integers(0, len(files) - 1), label="files applied before history is on")

    cursor, crashes = 0, 0
    while cursor < len(files):
        history = cursor >= off_until
        end = min(len(files), cursor + data.draw(st.integers(1, 3), label="batch files"))
        if not history:
            end = min(end, off_until)
        crash = history and crashes < 3 and data.draw(st.booleans(), label="crash between history and mirror")
        _apply(lake, table, files, cursor, end, history, not crash and not (own and history), modes, bool(own))
        if crash:
            crashes += 1
            continue
        for op, lsn, seq, key, v, t, old in changes[bounds[cursor]:bounds[end]]:
            model.apply(op, lsn, seq, lsn, key, v, t, old)
        cursor = end
        if cursor == off_until and off_until:
            model.seed()
    # a restart replaying the last batch
    _apply(lake, table, files, len(files) - 1, len(files), True, not own, modes, bool(own))
    if own:
        assert lake.read_cursor(table) == len(files)  # committed with the history table's rows

    if "changelog" in modes:
        changelog = _read(lake, table, "changelog", f"_hr_op, id, v, t, _hr_lsn, _hr_seq, _hr_xid,"
                                                    f" {_us('_hr_commit_ts')}", bool(own))
        assert Counter(r[:7] for r in changelog) == Counter(model.changelog)
        assert all(r[7] == r[4] for r in changelog)  # commit time of the change
    if "scd2" in modes:
        scd2 = _read(lake, table, "scd2", f"id, v, t, {_us('_hr_valid_from')}, {_us('_hr_valid_to')}, _hr_current,"
                                          " _hr_lsn, _hr_seq", bool(own))
        assert Counter(scd2) == Counter(tuple(v) for v in model.versions)
    if "soft_delete" in modes:
        soft = _read(lake, table, "soft_delete", f"id, v, t, {_us('_hr_deleted_at')}", bool(own))
        assert {r[0]: list(r[1:]) for r in soft} == model.soft
        assert len(soft) == len(model.soft)


def test_a_history_table_resumes_behind_the_mirror_without_losing_its_rows(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """As after a resync (the mirror took batches the history did not see): the history keeps every row
    it has, logs ``history.gap``, and goes on from the mirror's cursor."""
    changes = _changes([("I", 1, 1, 0, True, False), ("I", 2, 1, 0, True, False), ("U", 1, 1, 1, True, False),
                        ("D", 2, 1, 0, True, False), ("U", 1, 1, 2, True, False)])
    files = [_stage(tmp_path / f"{i}.parquet", [c]) for i, c in enumerate(changes)]
    table = _schema()
    with _lake(tmp_path / "lake") as lake:
        lake.ensure_table(table)
        _apply(lake, table, files, 0, 2, history=True, mirror=True)
        _apply(lake, table, files, 2, 4, history=False, mirror=True)  # the gap: a resync's copy took these
        with caplog.at_level("WARNING", logger="headrace.history"):
            _apply(lake, table, files, 4, 5, history=True, mirror=True)
        assert any(r.getMessage() == "history.gap" for r in caplog.records)
        ops = sorted(r[:2] for r in _read(lake, table, "changelog", "_hr_op, id"))
        assert ops == [("I", 1), ("I", 2), ("U", 1)]  # the two inserts, then the update after the gap
        current = [r[:2] for r in _read(lake, table, "scd2", "id, v, _hr_current") if r[2]]
        assert sorted(current) == [(1, "U2"), (2, "I0")]  # key 2's delete fell in the gap: still open


def test_maintenance_compacts_the_history_tables_too(tmp_path: Path) -> None:
    """``headrace maintain`` and the run's passes take a table's history tables with it."""
    from headrace.core.maintenance import MaintenancePolicy
    from headrace.run.maintenance import history_tables

    changes = _changes([("I", k, 1, 0, True, False) for k in KEYS] + [("U", k, 1, 1, True, False) for k in KEYS])
    files = [_stage(tmp_path / f"{i}.parquet", [c]) for i, c in enumerate(changes)]
    table = _schema()
    with _lake(tmp_path / "lake") as lake:
        lake.ensure_table(table)
        for i in range(len(files)):
            _apply(lake, table, files, i, i + 1, history=True, mirror=True)
        tables = history_tables(lake, table, MODES)
        assert [t.target_table for t in tables] == [f"{table.name}__{m}" for m in MODES]
        before = {m: _read(lake, table, m, "count(*)") for m in MODES}
        for history in tables:
            lake.maintain(history, MaintenancePolicy(retention_seconds=0, keep_last=1, orphan_age_seconds=0))
            files_after = lake.table_files(history)
            assert files_after is not None and files_after.data_files <= 2, history.target_table
        assert {m: _read(lake, table, m, "count(*)") for m in MODES} == before  # rows untouched


@pytest.mark.parametrize("own", [False, True], ids=["beside the mirror", "under its own name"])
def test_a_keyless_table_has_a_changelog_of_its_row_images(tmp_path: Path, own: bool) -> None:
    """REPLICA IDENTITY FULL: identical rows are kept apart, an update is logged with its new image; as
    [mirror, changelog] or as [changelog] (the table itself, its copy's row becoming an ``I`` row)."""
    bag = TableSchema(oid=79_999, schema="public", name="bag", key=(), replica_identity="f",
                      columns=(Column("a", ColumnType(TypeKind.INT, "integer"), 23), Column("b", ColumnType(
                          TypeKind.STRING, "text"), 25)))
    buf = StagingBuffer()
    for op, lsn, row, old in (("I", 10, (1, "x"), None), ("I", 10, (1, "x"), None), ("U", 11, (2, "y"), (1, "x")),
                              ("D", 12, (1, "x"), None), ("T", 13, None, None)):
        data = None if row is None else json.dumps({"a": str(row[0]), "b": row[1]})
        old_row = None if old is None else json.dumps({"a": str(old[0]), "b": old[1]})
        buf.append(op, lsn, 1 + buf.op.count(op), BASE_US + lsn, lsn, data, None, old_row)
    path = tmp_path / "bag.parquet"
    write_staging_file(path, buf)
    with _lake(tmp_path / "lake") as lake:
        lake.ensure_table(bag)
        if own:  # the copy: one row, in the mirror's shape
            lake._con.execute(f"INSERT INTO {lake._qualified(bag)} VALUES (7, 'c', 5, 0, NULL)")
        assert apply_history(lake.history(), bag, ("changelog",), [(1, str(path))], None, ValueRules(), 0, own) == [
            "changelog"]
        with pytest.raises(Exception, match="history mode scd2 needs a key"):
            apply_history(lake.history(), bag, ("scd2",), [(1, str(path))], None, ValueRules(), 0)
        rows = sorted(_read(lake, bag, "changelog", "_hr_lsn, _hr_op, a, b", own))
    copied = [(5, "I", 7, "c")] if own else []
    assert rows == [*copied, (10, "I", 1, "x"), (10, "I", 1, "x"), (11, "U", 2, "y"), (12, "D", 1, "x"),
                    (13, "T", None, None)]


def test_a_copy_does_not_replace_a_table_that_is_its_own_history(tmp_path: Path) -> None:
    """A resync of a table written as [scd2] is refused (its copy would throw the history away); the
    versions stay."""
    import pyarrow as pa

    from headrace.core.errors import TerminalError

    files = [_stage(tmp_path / "0.parquet", _changes([("I", 1, 1, 0, True, False), ("U", 1, 1, 1, True, False)]))]
    table = _schema()
    with _lake(tmp_path / "lake") as lake:
        lake.ensure_table(table)
        _apply(lake, table, files, 0, 1, True, False, ("scd2",), True)
        copy = pa.table({"id": pa.array([1], pa.int32()), "v": ["c"], "t": ["c"], "_hr_lsn": pa.array([9], pa.int64()),
                         "_hr_seq": pa.array([0], pa.int64()),
                         "_hr_commit_ts": pa.array([None], pa.timestamp("us", tz="UTC"))})
        with pytest.raises(TerminalError, match="is its scd2 table, holding its history, and a copy"):
            lake.write_snapshot_arrow(table, copy, replace=True)
        assert sorted(_read(lake, table, "scd2", "v, _hr_current", own=True)) == [("I0", False), ("U1", True)]
