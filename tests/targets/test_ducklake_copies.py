"""DuckLake copies written from the driver's Arrow: several tables to one commit, each all or nothing,
on every catalog kind, read back by a DuckDB that knows nothing of headrace."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from headrace.core.errors import UnsupportedError
from headrace.core.schema import Column, TableSchema, TypeKind
from headrace.source.postgres.throwaway import ThrowawayPostgres
from headrace.targets.ducklake.target import DuckLakeTarget
from tests.targets.test_ducklake_target import SIMPLE, ct, plain_duckdb, settings_for


def _table(name: str, oid: int) -> TableSchema:
    return dataclasses.replace(SIMPLE, oid=oid, name=name)


def _rows(n: int, lsn: int = 100) -> pa.Table:
    utc = pa.timestamp("us", tz="UTC")
    return pa.table({"id": pa.array(range(n), pa.int32()), "name": [f"n{i}" for i in range(n)],
                     "doc": pa.nulls(n, pa.string()), "_hr_lsn": pa.array([lsn] * n, pa.int64()),
                     "_hr_seq": pa.array([0] * n, pa.int64()), "_hr_commit_ts": pa.nulls(n, utc)})


def _snapshots(target: DuckLakeTarget) -> int:
    """The lake's snapshots so far: one a commit."""
    with target._lock:
        row = target._con.execute("SELECT count(*) FROM __ducklake_metadata_hr_lake.ducklake_snapshot").fetchone()
    assert row is not None
    return int(row[0])


def _queue_all(target: DuckLakeTarget, threads: list[threading.Thread]) -> None:
    """Start ``threads`` (each one copy) while "another commit" holds the lock, until all have queued."""
    with target._lock:
        for thread in threads:
            thread.start()
        while len(target._copies._waiting) < len(threads):
            threading.Event().wait(0.01)
    for thread in threads:
        thread.join()


@pytest.mark.parametrize("kind", ["duckdb", "sqlite", "postgres"])
def test_copies_waiting_together_commit_once_and_a_failing_one_fails_alone(
    kind: str, spark: Any, tmp_path: Path, pg_server: ThrowawayPostgres
) -> None:
    settings = settings_for(kind, tmp_path, pg_server)
    target = DuckLakeTarget(spark, settings, "p1")
    target.write_snapshot_arrow(_table("Twin", 1), _rows(1))  # a name the group's "twin" differs from by case
    tables = [_table(f"t{i}", 10 + i) for i in range(6)] + [_table("twin", 2)]
    results: dict[str, Any] = {}

    def copy(table: TableSchema) -> None:
        try:
            results[table.name] = target.write_snapshot_arrow(table, _rows(5 + table.oid))
        except Exception as exc:
            results[table.name] = exc

    before = _snapshots(target)
    _queue_all(target, [threading.Thread(target=copy, args=(t,)) for t in tables])
    after = _snapshots(target)
    target.close()
    assert {name: results[name] for name in results if name != "twin"} == {f"t{i}": 15 + i for i in range(6)}
    assert isinstance(results["twin"], UnsupportedError) and "differs only in case" in str(results["twin"])
    assert after - before == 6  # the group with the twin rolled back, then each table alone
    con = plain_duckdb(settings)
    try:
        names = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables"
                                           " WHERE table_catalog = 'lake' AND table_schema = 'public'").fetchall()}
        assert con.execute("SELECT count(*), sum(id) FROM lake.public.t3").fetchone() == (18, sum(range(18)))
    finally:
        con.close()
    assert names == {"Twin", *(f"t{i}" for i in range(6))}


def test_a_group_of_good_copies_is_one_commit_and_replace_and_new_shape_hold(
    spark: Any, tmp_path: Path
) -> None:
    settings = settings_for("duckdb", tmp_path)
    target = DuckLakeTarget(spark, settings, "p1")
    tables = [_table(f"g{i}", 20 + i) for i in range(5)]
    done: list[int | None] = []
    before = _snapshots(target)
    _queue_all(target, [threading.Thread(target=lambda t=t: done.append(target.write_snapshot_arrow(t, _rows(3))))
                        for t in tables])
    assert _snapshots(target) == before + 1
    assert done == [3] * 5
    # A copy again (a resync): the table holds the new rows only; in a new shape it is recreated.
    assert target.write_snapshot_arrow(tables[0], _rows(2, lsn=200)) == 2
    wider = dataclasses.replace(tables[1], columns=(*tables[1].columns, Column("extra", ct(TypeKind.LONG), 20)))
    rows = _rows(4).append_column("extra", pa.array([7] * 4, pa.int64()))
    rows = rows.select(["id", "name", "doc", "extra", "_hr_lsn", "_hr_seq", "_hr_commit_ts"])
    assert target.write_snapshot_arrow(wider, rows) == 4
    target.close()
    con = plain_duckdb(settings)
    try:
        assert con.execute("SELECT min(_hr_lsn), count(*) FROM lake.public.g0").fetchone() == (200, 2)
        assert con.execute("SELECT sum(extra) FROM lake.public.g1").fetchone() == (28,)
    finally:
        con.close()
