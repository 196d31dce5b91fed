"""End to end from a real PostgreSQL: a table written as mirror, changelog, scd2 and soft_delete at once.

The source's state is recorded at several moments (after a commit, before the next) while a workload
of inserts, updates, deletes, key changes, a TOAST column left unchanged, a TRUNCATE, an added
column and a re-insert runs; the scd2 table queried "as of" each moment, and the changelog replayed
up to it, equal the recorded state (with the queries docs/history.md gives, ``history.queries``);
soft_delete holds the live rows and keeps the deleted ones with their deletion time. DuckLake on a
SQLite catalog, so a second DuckDB connection reads the lake while the pipeline holds it.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import psycopg
import pytest

from headrace.history.changes import tuples
from headrace.history.queries import (
    CHANGELOG_AS_OF,
    CHANGELOG_AS_OF_SPARK,
    CHANGELOG_BETWEEN,
    SCD2_AS_OF,
    SCD2_AS_OF_SPARK,
)
from headrace.pipeline import Pipeline
from headrace.targets.ducklake import extension
from headrace.targets.ducklake.config import DuckLakeConfig
from tests.e2e.helpers import assert_same, make_config, source_rows
from tests.e2e.test_pipeline import run_caught_up

MODES = ["mirror", "changelog", "scd2", "soft_delete"]
BIG = "(SELECT string_agg(md5(random()::text || g::text), '') FROM generate_series(1, 3200) g)"  # 100 KB, TOASTed

PHASES = [
    [  # updates, an insert, a delete, a key change, a TOAST column left unchanged, two changes to one key
        "UPDATE acct SET bal = bal + 10 WHERE id IN (1, 2)",
        "UPDATE acct SET name = 'two' WHERE id = 2",
        "INSERT INTO acct VALUES (10, 'ten', 100, 'x')",
        "DELETE FROM acct WHERE id = 3",
        "UPDATE acct SET id = 40 WHERE id = 4",
    ],
    [  # a TRUNCATE, new rows, an added column
        "TRUNCATE acct",
        f"INSERT INTO acct VALUES (1, 'one again', 1, {BIG}), (5, 'five', 5, 'y')",
        "ALTER TABLE acct ADD COLUMN tier int",
        "UPDATE acct SET tier = 2 WHERE id = 5",
    ],
    [  # a delete, a re-insert of the deleted key, an update leaving the TOAST column unchanged
        "DELETE FROM acct WHERE id = 5",
        "INSERT INTO acct VALUES (5, 'five again', 55, 'z', 3)",
        "UPDATE acct SET bal = 2 WHERE id = 1",
    ],
]


def _state(conn: psycopg.Connection[Any]) -> tuple[dt.datetime, set[tuple[Any, ...]]]:
    moment = conn.execute("SELECT clock_timestamp()").fetchone()
    rows = conn.execute("SELECT id, name, bal, md5(note) FROM acct").fetchall()
    assert moment is not None
    return moment[0], {tuple(r) for r in rows}


def _lake(tmp_path: Path) -> Any:
    return extension.connect(DuckLakeConfig(catalog=f"sqlite:{tmp_path / 'lake' / 'meta.sqlite'}",
                                            data_path=str(tmp_path / "lake" / "data")))


def _as_of(con: Any, sql: str, table: str, moment: dt.datetime) -> set[tuple[Any, ...]]:
    query = sql.format(table=f"hr_lake.public.{table}", columns="id, name, bal, md5(note)", key="id")
    return {tuple(r) for r in con.execute(query, [moment]).fetchall()}


@pytest.mark.slow  # ~45 s on a quiet machine (four runs of the pipeline); tests/history/test_history_property.py is the light one
@pytest.mark.parametrize("engine", ["auto", "spark"])
def test_history_tables_follow_a_workload(source_dsn: str, tmp_path: Path, spark: Any, engine: str) -> None:
    # engine spark: the mirror's batches are Spark jobs; the history tables are built on the driver either way.
    pipeline, moments = _run_workload(source_dsn, tmp_path, spark, "ducklake-sqlite", engine)
    con = _lake(tmp_path)
    try:
        for i, (moment, rows) in enumerate(moments):
            assert _as_of(con, SCD2_AS_OF, "acct__scd2", moment) == rows, f"scd2 as of moment {i}"
            assert _as_of(con, CHANGELOG_AS_OF, "acct__changelog", moment) == rows, f"changelog up to moment {i}"
        between = CHANGELOG_BETWEEN.format(table="hr_lake.public.acct__changelog", columns="id")
        ops = tuples(con.execute(between, [moments[0][0], moments[1][0]]).arrow())  # fetchall would need pytz
        assert [(op, key) for op, _, key in ops] == [("U", 1), ("U", 2), ("U", 2), ("I", 10), ("D", 3), ("D", 4),
                                                     ("I", 40)]
        _check_tables(lambda sql: con.execute(sql.replace("{t}", "hr_lake.public.acct")).fetchall())
    finally:
        con.close()


@pytest.mark.slow  # ~60 s: Spark MERGEs into Iceberg
def test_history_tables_follow_a_workload_on_iceberg(source_dsn: str, tmp_path: Path, spark: Any) -> None:
    pipeline, moments = _run_workload(source_dsn, tmp_path, spark, "iceberg")
    schema = source_rows(source_dsn, "public.acct")[0]
    history = pipeline.target.history()

    def rows(sql: str) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in spark.sql(sql).collect()]

    for i, (moment, expected) in enumerate(moments):
        at = f"TIMESTAMP '{moment.isoformat()}'"
        for query, mode in ((SCD2_AS_OF_SPARK, "scd2"), (CHANGELOG_AS_OF_SPARK, "changelog")):
            got = rows(query.format(table=history.name(schema, mode), columns="id, name, bal, md5(note)", key="id",
                                    moment=at))
            assert set(got) == expected, f"{mode} as of moment {i}"
    _check_tables(lambda sql: rows(sql.replace("{t}__soft_delete", history.name(schema, "soft_delete"))
                                   .replace("{t}__scd2", history.name(schema, "scd2"))
                                   .replace("{t}__changelog", history.name(schema, "changelog"))))


def _run_workload(source_dsn: str, tmp_path: Path, spark: Any, target: str,
                  engine: str = "auto") -> tuple[Pipeline, list[Any]]:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, name text, bal int, note text)")
        conn.execute(f"INSERT INTO acct SELECT g, 'a' || g, g * 10, {BIG} FROM generate_series(1, 4) g")
        start = _state(conn)
    config = make_config(source_dsn, tmp_path, ["public.acct"], target,
                         history={"tables": {"public.acct": MODES}}, engine=engine)
    pipeline = Pipeline(config, spark=spark)
    run_caught_up(pipeline)
    moments = [start]
    for phase in PHASES:
        with psycopg.connect(source_dsn, autocommit=True) as conn:
            for statement in phase:
                conn.execute(statement)
            moments.append(_state(conn))
        run_caught_up(pipeline)
    assert assert_same(pipeline, source_dsn, "public.acct") == 2
    return pipeline, moments


def _check_tables(rows: Any) -> None:
    """soft_delete keeps every row ever deleted; the changelog has the TRUNCATE; scd2 has the added column."""
    live = rows("SELECT id, name, tier FROM {t}__soft_delete WHERE _hr_deleted_at IS NULL ORDER BY id")
    assert [tuple(r) for r in live] == [(1, "one again", None), (5, "five again", 3)]
    gone = rows("SELECT id FROM {t}__soft_delete WHERE _hr_deleted_at IS NOT NULL ORDER BY id")
    assert [tuple(r) for r in gone] == [(2,), (3,), (4,), (10,), (40,)]  # 3 deleted, 4 moved to 40, the truncate the rest
    ops = rows("SELECT _hr_op, count(*) FROM {t}__changelog GROUP BY 1 ORDER BY 1")
    assert dict(ops)["T"] == 1
    tiers = rows("SELECT tier FROM {t}__scd2 WHERE _hr_current AND id = 5")
    assert [tuple(r) for r in tiers] == [(3,)]  # the added column followed


def test_a_pipeline_in_mode_scd2_writes_each_table_as_its_scd2_table(source_dsn: str, tmp_path: Path) -> None:
    """``history: mode: scd2``: the table keeps its name and is the scd2 table, no mirror beside it. The
    copy's rows are its first open versions; updates (one leaving a TOAST column unchanged: filled from
    the open version), an insert, a delete and a key change follow; DuckDB reads it "as of" each moment.
    DuckLake on a SQLite catalog, built on the driver (no Spark)."""
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, name text, bal int, note text)")
        conn.execute(f"INSERT INTO acct SELECT g, 'a' || g, g * 10, {BIG} FROM generate_series(1, 4) g")
        moments = [_state(conn)]
    config = make_config(source_dsn, tmp_path, ["public.acct"], "ducklake-sqlite", history={"mode": "scd2"})
    pipeline = Pipeline(config)
    run_caught_up(pipeline)
    for phase in (PHASES[0], ["UPDATE acct SET bal = 7 WHERE id = 1", "DELETE FROM acct WHERE id = 2"]):
        with psycopg.connect(source_dsn, autocommit=True) as conn:
            for statement in phase:
                conn.execute(statement)
            moments.append(_state(conn))
        run_caught_up(pipeline)
    con = _lake(tmp_path)
    try:
        tables = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = 'hr_lake'"
                                            " AND schema_name = 'public'").fetchall()}
        assert tables == {"acct"}  # no mirror, no acct__scd2
        for i, (moment, rows) in enumerate(moments):
            assert _as_of(con, SCD2_AS_OF, "acct", moment) == rows, f"scd2 as of moment {i}"
        versions = con.execute("SELECT id, bal, _hr_current, _hr_valid_from IS NULL FROM hr_lake.public.acct"
                               " WHERE id IN (1, 4) ORDER BY _hr_lsn, _hr_seq").fetchall()
        # the copy's version (no commit time), two updates of 1, then 4 closed by its key change
        assert versions == [(1, 10, False, True), (4, 40, False, True), (1, 20, False, False), (1, 7, True, False)]
        notes = con.execute("SELECT count(DISTINCT md5(note)), count(*) FILTER (WHERE note IS NULL)"
                            " FROM hr_lake.public.acct WHERE id = 1").fetchall()
        assert notes == [(1, 0)]  # the TOAST column the updates left unchanged, in every version
    finally:
        con.close()
    from headrace.verify.compare import Progress
    from headrace.verify.run import VerifyOptions, verify

    (check,) = verify(config, VerifyOptions(wait_seconds=1), Progress())  # no mirror to compare: said, not guessed
    assert check.error is not None and "not a mirror of it; verify compares mirrors" in check.error


def test_a_keyless_table_as_its_changelog(source_dsn: str, tmp_path: Path) -> None:
    """REPLICA IDENTITY FULL, written as [changelog]: the copy's rows are ``I`` rows, identical rows stay
    apart, an update of one of two identical rows is one ``U`` with its new image, a delete one ``D``
    with the whole old row."""
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE bag (a int, b text)")
        conn.execute("ALTER TABLE bag REPLICA IDENTITY FULL")
        conn.execute("INSERT INTO bag VALUES (1, 'x'), (1, 'x'), (2, 'y')")
    config = make_config(source_dsn, tmp_path, ["public.bag"], "ducklake-sqlite",
                         history={"tables": {"public.bag": ["changelog"]}})
    pipeline = Pipeline(config)
    run_caught_up(pipeline)
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO bag VALUES (1, 'x')")
        conn.execute("UPDATE bag SET b = 'z' WHERE ctid = (SELECT min(ctid) FROM bag WHERE a = 1)")
        conn.execute("DELETE FROM bag WHERE a = 2")
        source = sorted(tuple(r) for r in conn.execute("SELECT a, b FROM bag").fetchall())
    run_caught_up(pipeline)
    con = _lake(tmp_path)
    try:
        rows = con.execute("SELECT _hr_op, a, b FROM hr_lake.public.bag ORDER BY _hr_lsn, _hr_seq, a, b").fetchall()
        assert [tuple(r) for r in rows] == [("I", 1, "x"), ("I", 1, "x"), ("I", 2, "y"),  # the copy
                                            ("I", 1, "x"), ("U", 1, "z"), ("D", 2, "y")]
    finally:
        con.close()
    assert source == [(1, "x"), (1, "x"), (1, "z")]
