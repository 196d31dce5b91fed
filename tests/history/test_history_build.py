"""The builders on their own (pure functions): a keyless changelog, a key change, TOAST filled from
the row before the batch, several versions of one key in one batch."""

from __future__ import annotations

import datetime as dt

from headrace.core.schema import Column, ColumnType, TableSchema, TypeKind
from headrace.history import build
from headrace.history.changes import Change, Key

T0 = dt.datetime(2026, 11, 27, tzinfo=dt.timezone.utc)
TEXT = ColumnType(TypeKind.STRING, "text")
KEYED = TableSchema(1, "public", "t", (Column("id", ColumnType(TypeKind.INT, "integer"), 23), Column("v", TEXT, 25),
                                       Column("big", TEXT, 25)), key=("id",))
BAG = TableSchema(2, "public", "bag", (Column("a", ColumnType(TypeKind.INT, "integer"), 23),), key=())


def _at(lsn: int) -> dt.datetime:
    return T0 + dt.timedelta(seconds=lsn)


def _before(keys: list[Key]) -> dict[Key, build.Row]:
    return {k: {"id": k[0], "v": "old", "big": "BIG"} for k in keys if k == (1,)}


def test_a_keyless_changelog_holds_the_row_images_as_sent() -> None:
    changes = [Change("I", 10, 1, _at(10), 7, {"a": 1}), Change("I", 10, 2, _at(10), 7, {"a": 1}),
               Change("D", 11, 1, _at(11), 8, {"a": 1}), Change("T", 12, 1, _at(12), 9, {})]
    rows = build.changelog_rows(BAG, changes, lambda keys: {})
    assert [(r[build.OP], r["a"], r[build.XID]) for r in rows] == [("I", 1, 7), ("I", 1, 7), ("D", 1, 8), ("T", None, 9)]


def test_a_key_change_with_toast_left_unchanged_takes_the_value_from_the_row_before() -> None:
    changes = [Change("U", 10, 1, _at(10), 1, {"id": 1, "v": "a", "big": None}, unchanged=frozenset({"big"})),
               Change("U", 10, 2, _at(10), 1, {"id": 2, "v": "b", "big": None}, old_key={"id": 1},
                      unchanged=frozenset({"big"})),
               Change("U", 11, 1, _at(11), 2, {"id": 2, "v": "c", "big": None}, unchanged=frozenset({"big"}))]
    rows = build.changelog_rows(KEYED, changes, _before)
    assert [(r[build.OP], r["id"], r["v"], r["big"]) for r in rows] == [
        ("U", 1, "a", "BIG"), ("D", 1, None, None), ("I", 2, "b", "BIG"), ("U", 2, "c", "BIG")]
    scd2 = build.scd2_batch(KEYED, changes, _before)
    assert scd2.closes == {(1,): build.Event(10, 1, _at(10))}  # the version before the batch
    assert [(v["id"], v["v"], v["big"], v[build.CURRENT], v[build.VALID_TO]) for v in scd2.versions] == [
        (1, "a", "BIG", False, _at(10)), (2, "b", "BIG", False, _at(11)), (2, "c", "BIG", True, None)]
    soft = build.soft_delete_batch(KEYED, changes, _before)
    assert {k: (r["v"], r[build.DELETED_AT]) for k, r in soft.rows.items()} == {(1,): ("a", _at(10)),
                                                                                 (2,): ("c", None)}
