"""Each change rule, fed to both engines: the same staged files give the same batch from Spark
(``engines.spark.batch``) and from DuckDB on the driver (``engines.driver.batch``), and that batch is
the one the rule says. One test per rule, named after the functions both engines define."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from headrace.core.changes import UNCHANGED
from headrace.core.position import Position
from headrace.core.rows import unchanged_token
from headrace.core.schema import TableSchema
from headrace.core.spark_types import ValueRules
from headrace.engines.driver.batch import read_driver_batch
from headrace.engines.driver.keyless import net_row_changes as driver_net
from headrace.engines.spark.batch import read_change_batch
from headrace.engines.spark.keyless import net_row_changes as spark_net
from headrace.log.facts import FileFacts
from headrace.targets.ducklake.files import to_arrow
from tests.materialize.test_driver_batch import TABLE, _sorted, _stage

RULES = ValueRules("public.r", "stop", True)
AT = "2024-01-01 10:00:00+00"


def _both(spark: Any, tmp_path: Path, files: list[list[tuple[Any, ...]]], skip: Position | None = None
          ) -> list[dict[str, Any]]:
    """The batch of ``files`` (each a list of staged changes) from both engines: asserted equal, returned
    as rows sorted by key, each ``(id, name, doc, op, unchanged, lsn, seq)``."""
    staged = [_stage(tmp_path / f"{i}.parquet", TABLE.column_names, changes) for i, changes in enumerate(files)]
    paths, facts = [p for p, _ in staged], [f for _, f in staged]
    known: list[FileFacts | None] = list(facts)
    driver = read_driver_batch(paths, TABLE, skip, RULES, known)
    spark_batch = read_change_batch(spark, paths, TABLE, skip, RULES, facts=known)
    assert (driver.truncate_before, driver.rows_in) == (spark_batch.truncate_before, spark_batch.rows_in)
    assert isinstance(driver.changes, pa.Table)
    theirs = _sorted(to_arrow(spark_batch.changes), ["id"])
    assert _sorted(driver.changes, ["id"]) == theirs
    return [{"id": r["id"], "name": r["name"], "doc": r["doc"], "op": r["_hr_op"], "unchanged": r["_hr_unchanged"],
             "at": (r["_hr_lsn"], r["_hr_seq"])} for r in theirs]


def _row(key: int, name: str | None, doc: Any = None) -> tuple[str, str | None, Any, str]:
    return (str(key), name, doc, AT)


def test_change_order(spark: Any, tmp_path: Path) -> None:
    """The last change is the last by (commit position, ordinal), not by file or row order: the
    second file holds an earlier transaction, and one transaction's ordinals are staged backwards."""
    late = [("U", 300, 2, _row(1, "last"), None), ("U", 300, 1, _row(1, "before"), None),
            ("U", 300, 1, _row(2, "two, later"), None)]
    early = [("I", 100, 1, _row(1, "first"), None), ("I", 200, 7, _row(2, "two"), None)]
    rows = _both(spark, tmp_path, [late, early])
    assert [(r["id"], r["name"], r["at"]) for r in rows] == [(1, "last", (300, 2)), (2, "two, later", (300, 1))]


def test_after_position(spark: Any, tmp_path: Path) -> None:
    """Changes at or before the skip point (the copy holds them) and before the batch's last truncate
    are dropped; a truncate at or before the skip point is in the copy already."""
    changes = [("I", 100, 1, _row(1, "copied"), None), ("T", 100, 2, None, None), ("I", 100, 3, _row(2, "after"), None),
               ("I", 200, 1, _row(3, "later"), None)]
    rows = _both(spark, tmp_path, [changes], skip=Position(100, 2))
    assert [(r["id"], r["name"]) for r in rows] == [(2, "after"), (3, "later")]
    rows = _both(spark, tmp_path / "t", [changes], skip=Position(100, 1))
    assert [(r["id"], r["name"]) for r in rows] == [(2, "after"), (3, "later")]


def test_key_changes(spark: Any, tmp_path: Path) -> None:
    """An update that changed the key is a delete of the old key and the new row, at one position."""
    changes = [("I", 100, 1, _row(1, "one"), None),
               ("U", 200, 1, _row(5, "moved"), json.dumps({"id": "1"}))]
    rows = _both(spark, tmp_path, [changes])
    assert [(r["id"], r["name"], r["op"], r["at"]) for r in rows] == [
        (1, None, "D", (200, 1)), (5, "moved", "U", (200, 1))]


def test_last_change_per_key(spark: Any, tmp_path: Path) -> None:
    """One row per key, the last change's: a delete carries the key only; a re-insert after a delete wins."""
    changes = [("I", 100, 1, _row(1, "a"), None), ("U", 100, 2, _row(1, "b"), None), ("D", 110, 1, _row(1, None), None),
               ("I", 100, 3, _row(2, "x"), None), ("D", 120, 1, _row(2, None), None), ("I", 130, 1, _row(2, "y"), None),
               ("I", 100, 4, _row(3, "gone"), None), ("D", 140, 1, _row(3, None), None)]
    rows = _both(spark, tmp_path, [changes])
    assert [(r["id"], r["name"], r["op"]) for r in rows] == [(1, None, "D"), (2, "y", "I"), (3, None, "D")]


def test_toast_fill(spark: Any, tmp_path: Path) -> None:
    """A TOAST column an update left unchanged takes the latest value sent for its key in the batch (a
    sent NULL counts); with none sent, it stays unchanged for the target to keep."""
    changes = [("I", 100, 1, _row(1, "a", "long text"), None), ("U", 110, 1, _row(1, "b", UNCHANGED), None),
               ("U", 100, 2, _row(2, "c", None), None), ("U", 110, 2, _row(2, "d", UNCHANGED), None),
               ("U", 100, 3, _row(3, "e", UNCHANGED), None)]
    rows = _both(spark, tmp_path, [changes])
    assert [(r["id"], r["name"], r["doc"], r["unchanged"]) for r in rows] == [
        (1, "b", "long text", None), (2, "d", None, None), (3, "e", None, unchanged_token("doc"))]


BAG = TableSchema(oid=8, schema="public", name="bag", columns=TABLE.columns, key=())


def test_row_images_and_net_row_changes(spark: Any, tmp_path: Path) -> None:
    """A table without a key: each change as the row images it adds and removes (an update removes its
    old row, staged whole, and adds its new one), folded per distinct row into a multiset delta."""
    old = json.dumps({"id": "1", "name": "a", "doc": None, "at": AT})
    changes = [("I", 100, 1, _row(1, "a"), None), ("I", 100, 2, _row(1, "a"), None), ("I", 100, 3, _row(1, "a"), None),
               ("U", 110, 1, _row(1, "b"), old), ("D", 120, 1, _row(1, "a"), None),
               ("I", 130, 1, _row(2, "gone"), None), ("D", 140, 1, _row(2, "gone"), None),
               ("D", 150, 1, _row(3, "was there"), None)]
    path, facts = _stage(tmp_path / "bag.parquet", BAG.column_names, changes)
    driver = read_driver_batch([path], BAG, None, RULES, [facts])
    spark_batch = read_change_batch(spark, [path], BAG, None, RULES, facts=[facts])
    assert isinstance(driver.changes, pa.Table)
    images = ["id", "name", "_hr_lsn", "_hr_seq"]
    assert _sorted(driver.changes, images) == _sorted(to_arrow(spark_batch.changes), images)
    ours = _net_rows(driver_net(driver.changes, BAG))
    theirs = _net_rows(to_arrow(spark_net(spark_batch.changes, BAG)))
    assert ours == theirs
    assert [(r["id"], r["name"], r["_hr_delta"], r["_hr_lsn"]) for r in theirs] == [
        (1, "a", 1, 100), (1, "b", 1, 110), (3, "was there", -1, None)]


def _net_rows(net: pa.Table) -> list[dict[str, Any]]:
    assert net.schema.field("_hr_delta").type == pa.int32()
    rows = net.drop_columns(["at", "_hr_commit_ts"]).to_pylist()
    return sorted(rows, key=lambda r: (r["id"], r["name"], r["_hr_delta"]))
