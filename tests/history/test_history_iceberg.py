"""Iceberg tables written in one history mode under their own names (no mirror), read back by DuckDB.

End to end from a real PostgreSQL: three tables, one per mode, under the workload of
``test_history_e2e`` (updates, one leaving a TOAST column unchanged, an insert, a delete, a key
change, a TRUNCATE, an added column, a re-insert), the source's state recorded at each moment; DuckDB's
``iceberg_scan`` (not our reader) runs the page's queries: scd2 "as of" each moment and the changelog
replayed up to it equal the recorded state, soft_delete keeps what was deleted. The light test writes
one batch straight through the history writer, replays it (a crash before the cursor moved) and
refuses a copy over the table.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from headrace.core.changes import UNCHANGED
from headrace.core.errors import TerminalError
from headrace.core.schema import Column, ColumnType, TableSchema, TypeKind
from headrace.core.spark_types import ValueRules
from headrace.history.queries import CHANGELOG_AS_OF, SCD2_AS_OF
from headrace.history.writer import apply_history
from headrace.log.codec import StagingBuffer, encode_row, write_staging_file
from headrace.pipeline import Pipeline
from headrace.readers import duckdb_with, iceberg_metadata_location
from tests.e2e.helpers import make_config
from tests.e2e.test_pipeline import run_caught_up
from tests.history.test_history_e2e import BIG, PHASES

OWN = {"s": "scd2", "c": "changelog", "d": "soft_delete"}  # table -> its one mode


def _state(conn: psycopg.Connection[Any]) -> tuple[dt.datetime, dict[str, set[tuple[Any, ...]]]]:
    moment = conn.execute("SELECT clock_timestamp()").fetchone()
    assert moment is not None
    return moment[0], {t: {tuple(r) for r in conn.execute(f"SELECT id, name, bal, md5(note) FROM {t}").fetchall()}
                       for t in OWN}


@pytest.mark.slow  # ~60 s: Spark MERGEs into three Iceberg tables over four rounds; the light one is below
def test_iceberg_tables_in_one_mode_under_their_own_names(source_dsn: str, tmp_path: Path, spark: Any) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        for t in OWN:
            conn.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, name text, bal int, note text)")
            conn.execute(f"INSERT INTO {t} SELECT g, 'a' || g, g * 10, {BIG} FROM generate_series(1, 4) g")
        moments = [_state(conn)]
    config = make_config(source_dsn, tmp_path, [f"public.{t}" for t in OWN], "iceberg",
                         history={"tables": {f"public.{t}": [mode] for t, mode in OWN.items()}})
    pipeline = Pipeline(config, spark=spark)
    run_caught_up(pipeline)
    for phase in PHASES:
        with psycopg.connect(source_dsn, autocommit=True) as conn:
            for statement in phase:
                for t in OWN:
                    conn.execute(statement.replace("acct", t))
            moments.append(_state(conn))
        run_caught_up(pipeline)
    assert sorted(p.name for p in (tmp_path / "warehouse" / "public").iterdir()) == sorted(OWN)  # no mirror, no t__mode
    con = duckdb_with("avro", "iceberg")
    try:
        scan = {t: f"iceberg_scan('{iceberg_metadata_location(pipeline.target.settings, 'public', t)}')"  # type: ignore[attr-defined]
                for t in OWN}

        def rows(sql: str, *params: Any) -> set[tuple[Any, ...]]:
            return {tuple(r) for r in con.execute(sql, list(params)).fetchall()}

        for i, (moment, state) in enumerate(moments):
            for t, query in (("s", SCD2_AS_OF), ("c", CHANGELOG_AS_OF)):
                got = rows(query.format(table=scan[t], columns="id, name, bal, md5(note)", key="id"), moment)
                assert got == state[t], f"{OWN[t]} as of moment {i}"
        final = moments[-1][1]
        assert rows(f"SELECT id, name, bal, md5(note) FROM {scan['d']} WHERE _hr_deleted_at IS NULL") == final["d"]
        # 3 deleted, 4 moved to 40, the truncate the rest
        assert rows(f"SELECT id FROM {scan['d']} WHERE _hr_deleted_at IS NOT NULL") == {(2,), (3,), (4,), (10,), (40,)}
        assert rows(f"SELECT count(*) FROM {scan['c']} WHERE _hr_op = 'T'") == {(1,)}
        assert rows(f"SELECT tier FROM {scan['s']} WHERE _hr_current AND id = 5") == {(3,)}  # the added column followed
        assert rows(f"SELECT count(*) FROM {scan['s']} WHERE _hr_current AND _hr_valid_to IS NOT NULL") == {(0,)}
    finally:
        con.close()
        pipeline.target.close()
    from headrace.verify.compare import Progress
    from headrace.verify.run import VerifyOptions, verify

    checks = verify(config, VerifyOptions(wait_seconds=1), Progress())  # no mirror to compare: said, not guessed
    assert len(checks) == 3 and all(c.error and "not a mirror of it; verify compares mirrors" in c.error for c in checks)


TEXT = ColumnType(TypeKind.STRING, "text")
TABLE = TableSchema(oid=91_001, schema="public", name="own_scd2",
                    columns=(Column("id", ColumnType(TypeKind.INT, "integer"), 23, nullable=False),
                             Column("v", TEXT, 25), Column("t", TEXT, 25)), key=("id",))


def _stage(path: Path, changes: list[tuple[str, int, int, int, str | None]]) -> str:
    """A staged file of (op, lsn, seq, id, v) changes; t left unchanged (TOAST) by every update."""
    buf = StagingBuffer()
    for op, lsn, seq, key, v in changes:
        unchanged = None
        if op == "D":
            data = json.dumps({"id": str(key)})
        else:
            data, unchanged = encode_row(("id", "v", "t"), (str(key), v, UNCHANGED if op == "U" else f"t{key}"))
        buf.append(op, lsn, seq, 1_700_000_000_000_000 + lsn, lsn, data, unchanged, None)
    write_staging_file(path, buf)
    return str(path)


def test_an_iceberg_table_as_its_scd2_table_replayed_and_not_copied_over(spark: Any, tmp_path: Path) -> None:
    """The copy (two rows) becomes the scd2 table at its first batch (an update leaving a TOAST column
    unchanged, filled from the open version; a delete; an insert); the batch replayed (a crash before
    the cursor moved) writes nothing; a resync's copy over it is refused; DuckDB reads it back."""
    from headrace.targets.iceberg.config import IcebergConfig
    from headrace.targets.iceberg.target import IcebergTarget

    target = IcebergTarget(spark, IcebergConfig(warehouse=str(tmp_path / "w"), catalog_name=f"hr_own{uuid.uuid4().hex[:8]}"), "own")
    copy = pa.table({"id": pa.array([1, 2], pa.int32()), "v": ["a", "b"], "t": ["big", "two"],
                     "_hr_lsn": pa.array([5, 5], pa.int64()), "_hr_seq": pa.array([0, 0], pa.int64()),
                     "_hr_commit_ts": pa.array([None, None], pa.timestamp("us", tz="UTC"))})
    target.write_snapshot_arrow(TABLE, copy)
    entries = [(1, _stage(tmp_path / "1.parquet", [("U", 10, 0, 1, "a1"), ("D", 10, 1, 2, None),
                                                   ("I", 11, 0, 3, "c")]))]
    writer = target.history()
    assert apply_history(writer, TABLE, ("scd2",), entries, None, ValueRules(), 0, own=True) == ["scd2"]
    assert apply_history(writer, TABLE, ("scd2",), entries, None, ValueRules(), 0, own=True) == []  # the replay
    with pytest.raises(TerminalError, match="is its scd2 table, holding its history, and a copy"):
        target.write_snapshot_arrow(TABLE, copy)
    con = duckdb_with("avro", "iceberg")
    try:
        scan = f"iceberg_scan('{iceberg_metadata_location(target.settings, 'public', 'own_scd2')}')"
        rows = con.execute(f"SELECT id, v, t, _hr_current, _hr_valid_from IS NULL FROM {scan}"
                           " ORDER BY id, _hr_lsn").fetchall()
    finally:
        con.close()
    assert rows == [(1, "a", "big", False, True), (1, "a1", "big", True, False), (2, "b", "two", False, True),
                    (3, "c", "t3", True, False)]


@pytest.mark.slow  # 13-40 s by load: Spark MERGEs into the scd2 table over two rounds; the light ones are above
def test_iceberg_tables_under_their_own_names_follow_schema_changes(source_dsn: str, tmp_path: Path,
                                                                    spark: Any) -> None:
    """A dropped column (kept, the default: NULL from the drop on), a renamed one and a widened one, in a
    changelog (appends) and an scd2 table (MERGEs) under their own names; DuckDB reads them back."""
    own = {"c": "changelog", "s": "scd2"}
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        for t in own:
            conn.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, name text, bal int, note text)")
            conn.execute(f"INSERT INTO {t} VALUES (1, 'a', 10, 'n1'), (2, 'b', 20, 'n2')")
    config = make_config(source_dsn, tmp_path, [f"public.{t}" for t in own], "iceberg",
                         history={"tables": {f"public.{t}": [mode] for t, mode in own.items()}})
    pipeline = Pipeline(config, spark=spark)
    run_caught_up(pipeline)
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        for t in own:
            conn.execute(f"UPDATE {t} SET bal = 11 WHERE id = 1")
            conn.execute(f"ALTER TABLE {t} DROP COLUMN note")
            conn.execute(f"ALTER TABLE {t} RENAME COLUMN name TO title")
            conn.execute(f"ALTER TABLE {t} ALTER COLUMN bal TYPE bigint")
            conn.execute(f"UPDATE {t} SET bal = 5000000000, title = 'two' WHERE id = 2")
            conn.execute(f"INSERT INTO {t} VALUES (3, 'c', 30)")
    run_caught_up(pipeline)
    con = duckdb_with("avro", "iceberg")
    try:
        for t, current in (("c", "_hr_op <> 'D'"), ("s", "_hr_current")):
            scan = f"iceberg_scan('{iceberg_metadata_location(pipeline.target.settings, 'public', t)}')"  # type: ignore[attr-defined]
            rows = con.execute(f"SELECT id, title, bal, note FROM {scan} WHERE {current} ORDER BY _hr_lsn, _hr_seq"
                               ).fetchall()
            expected = [(1, "a", 10, "n1"), (2, "b", 20, "n2"), (1, "a", 11, "n1"), (2, "two", 5_000_000_000, None),
                        (3, "c", 30, None)]
            if t == "s":  # the open versions
                expected = [(1, "a", 11, "n1"), (2, "two", 5_000_000_000, None), (3, "c", 30, None)]
            assert [tuple(r) for r in rows] == expected, t
    finally:
        con.close()
        pipeline.target.close()


def test_an_iceberg_changelog_batch_is_appended_on_the_driver_once(spark: Any, tmp_path: Path) -> None:
    """A table as its changelog: the batch (an update leaving a TOAST column unchanged, filled from the
    key's last change; a delete; an insert) is one append committed on the driver (no Spark job) with
    its offset, a replay appends nothing, and DuckDB reads the rows back."""
    from headrace.targets.iceberg.config import IcebergConfig
    from headrace.targets.iceberg.target import IcebergTarget

    target = IcebergTarget(spark, IcebergConfig(warehouse=str(tmp_path / "w"), catalog_name=f"hr_cl{uuid.uuid4().hex[:8]}"),
                           "own")
    table = dataclasses.replace(TABLE, oid=91_002, name="own_changelog")
    copy = pa.table({"id": pa.array([1, 2], pa.int32()), "v": ["a", "b"], "t": ["big", "two"],
                     "_hr_lsn": pa.array([5, 5], pa.int64()), "_hr_seq": pa.array([0, 0], pa.int64()),
                     "_hr_commit_ts": pa.array([None, None], pa.timestamp("us", tz="UTC"))})
    target.write_snapshot_arrow(table, copy)
    entries = [(1, _stage(tmp_path / "1.parquet", [("U", 10, 0, 1, "a1"), ("D", 10, 1, 2, None),
                                                   ("I", 11, 0, 3, "c")]))]
    writer = target.history()
    assert apply_history(writer, table, ("changelog",), entries, None, ValueRules(), 0, own=True) == ["changelog"]
    assert apply_history(writer, table, ("changelog",), entries, None, ValueRules(), 0, own=True) == []  # the replay
    name = target.table_name(table)
    summary = spark.sql(f"SELECT summary FROM {name}.snapshots ORDER BY committed_at DESC LIMIT 1").first()[0]
    assert summary["headrace.apply"] == "driver" and summary["headrace.history.offset"] == "1"
    con = duckdb_with("avro", "iceberg")
    try:
        scan = f"iceberg_scan('{iceberg_metadata_location(target.settings, 'public', 'own_changelog')}')"
        rows = con.execute(f"SELECT _hr_op, id, v, t, _hr_lsn FROM {scan} ORDER BY _hr_lsn, _hr_seq, id").fetchall()
    finally:
        con.close()
    assert rows == [("I", 1, "a", "big", 5), ("I", 2, "b", "two", 5), ("U", 1, "a1", "big", 10),
                    ("D", 2, None, None, 10), ("I", 3, "c", "t3", 11)]
