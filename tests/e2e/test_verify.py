"""End to end: ``headrace verify`` against a running pipeline, on both targets.

Equal tables exit 0; differences made on the target behind the pipeline's back (a row changed,
deleted, added, a NULL turned into a value, a key duplicated) are named exactly, key and columns;
under a live workload nothing is reported that is not there.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from headrace.config import parse_config
from headrace.pipeline import Pipeline
from headrace.source.postgres.throwaway import free_port
from headrace.verify import compare
from headrace.verify.compare import Progress
from headrace.verify.run import VerifyOptions, report, verify
from tests.e2e.helpers import assert_same, raw_config, running, wait_until, workload

TARGETS = ["ducklake-sqlite", "iceberg"]  # a DuckDB-file catalog is locked by the running pipeline


def _same(pipeline: Pipeline, dsn: str, table: str) -> bool:
    """``assert_same``, false until the target table exists."""
    try:
        assert_same(pipeline, dsn, table)
    except AssertionError:
        return False
    except Exception:  # the copy has not created the table yet
        return False
    return True


def _verify_cli(path: Path, *args: str) -> tuple[int, list[dict[str, Any]], str]:
    done = subprocess.run([sys.executable, "-m", "headrace.cli", "verify", "-c", str(path), "--json", *args],
                          capture_output=True, text=True, timeout=300)
    return done.returncode, [json.loads(line) for line in done.stdout.splitlines() if line.strip()], done.stderr


def _tamper(pipeline: Pipeline, target: str, statements: list[str]) -> None:
    """Run ``statements`` on the target table ``{t}`` behind the pipeline's back (it is stopped)."""
    schema = next(r.schema for r in pipeline.setup().tables())
    if target == "iceberg":
        name = pipeline.config.target.table_name(pipeline.config.name, schema.table_name)
        for statement in statements:
            pipeline.spark.sql(statement.format(t=name))
        return
    from headrace import readers

    con = readers.ducklake(pipeline.config.target.settings)  # type: ignore[arg-type]
    try:
        for statement in statements:
            con.execute(statement.format(t='lake.public.items'))
    finally:
        con.close()


@pytest.mark.parametrize("target", TARGETS)
def test_verify_names_each_difference(source_dsn: str, tmp_path: Path, spark: Any, target: str) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("""
            CREATE TABLE items (id bigint PRIMARY KEY, v int, note text, price numeric(10,2), f double precision,
                                r real, ts timestamptz, day date, raw bytea, tag uuid);
            INSERT INTO items SELECT g, g % 7, CASE WHEN g % 10 = 0 THEN NULL ELSE 'n' || g END, g * 1.25,
                                     g / 3.0, g / 7.0, '2024-01-01'::timestamptz + g * interval '1.5 s',
                                     '2024-01-01'::date + g, decode(md5(g::text), 'hex'), md5(g::text)::uuid
                              FROM generate_series(1, 300) g;
            INSERT INTO items VALUES (1000, NULL, NULL, NULL, 'NaN', '-Infinity', NULL, NULL, NULL, NULL),
                                     (1001, -1, 'x', 0, 1e20, 100, '1999-12-31 23:59:59.999999+00', '0001-01-01',
                                      '', NULL);
        """)
    raw = raw_config(source_dsn, tmp_path, ["public.items"], target, api={"listen": f"127.0.0.1:{free_port()}"})
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw))
    pipeline = Pipeline(parse_config(raw), spark=spark)
    with running(pipeline):
        wait_until(lambda: _same(pipeline, source_dsn, "public.items"), 120, "the copy")
        code, tables, err = _verify_cli(path)
        assert code == 0, json.dumps(tables)
        assert [(t["table"], t["status"], t["rows_source"], t["rows_target"]) for t in tables] == [
            ("public.items", "equal", 302, 302)]
    _tamper(pipeline, target, [
        "UPDATE {t} SET v = v + 1000 WHERE id = 11",  # a value changed
        "DELETE FROM {t} WHERE id = 12",  # a row deleted
        "INSERT INTO {t} SELECT 5000, v, note, price, f, r, ts, day, raw, tag, 1, _hr_seq, _hr_commit_ts"
        " FROM {t} WHERE id = 13",  # a row added
        "UPDATE {t} SET note = 'was null', f = 2.5 WHERE id = 20",  # a NULL turned into a value (and a float)
        "INSERT INTO {t} SELECT * FROM {t} WHERE id = 14",  # a key duplicated
    ])
    with running(pipeline):
        with psycopg.connect(source_dsn, autocommit=True) as conn:
            conn.execute("UPDATE items SET v = 99 WHERE id = 50")  # a change the pipeline applies meanwhile
        code, tables, err = _verify_cli(path, "--repair")
        assert code == 1, err
        assert tables[0]["repair"] == "resync requested: the table is copied again"
        wait_until(lambda: _same(pipeline, source_dsn, "public.items"), 120, "the resync")
        code, after, err = _verify_cli(path)
        assert (code, after[0]["status"]) == (0, "equal"), err
    (result,) = tables
    assert result["status"] == "different"
    found = {tuple(d["key"]): (d["kind"], d["columns"]) for d in result["differences"]}
    assert found == {
        (11,): ("changed", ["v"]),
        (12,): ("missing", []),
        (5000,): ("extra", []),
        (20,): ("changed", ["note", "f"]),
        (14,): ("duplicated", []),
    }
    status = subprocess.run([sys.executable, "-m", "headrace.cli", "status", "-c", str(path), "--json"],
                            capture_output=True, text=True, timeout=120, check=True)
    (shown,) = [t["verify"] for t in json.loads(status.stdout)["tables"]]
    assert (shown["status"], shown["differences"]) == ("equal", 0)


@pytest.mark.parametrize("target", TARGETS)
def test_verify_under_load_reports_nothing_false(source_dsn: str, tmp_path: Path, spark: Any, target: str) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("""
            CREATE TABLE items (id bigint PRIMARY KEY, v int, note text);
            CREATE TABLE lines (order_id bigint, line int, qty int, PRIMARY KEY (order_id, line));
            CREATE TABLE bag (a int, b text);
            ALTER TABLE bag REPLICA IDENTITY FULL;
            INSERT INTO items SELECT g, 0, repeat('x', 20) FROM generate_series(1, 1000) g;
            INSERT INTO lines SELECT g, l, l FROM generate_series(1, 400) g, generate_series(1, 2) l;
            INSERT INTO bag SELECT g % 5, 'b' FROM generate_series(1, 50) g;
        """)
    config = parse_config(raw_config(source_dsn, tmp_path, ["public.items", "public.lines", "public.bag"], target))
    pipeline = Pipeline(config, spark=spark)
    with running(pipeline):
        wait_until(lambda: _same(pipeline, source_dsn, "public.items"), 120, "the copy")
        with workload(source_dsn, seed=39):
            for _ in range(2):
                checks = verify(config, VerifyOptions(), Progress())
                results = [report(c, 1.0) for c in checks]
                assert [(r["table"], r["status"], r["differences"]) for r in results] == [
                    ("public.bag", "equal", []), ("public.items", "equal", []), ("public.lines", "equal", [])]


def test_verify_keyless_tables_as_multisets(source_dsn: str, tmp_path: Path, spark: Any,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("""
            CREATE TABLE bag (a int, b text);
            ALTER TABLE bag REPLICA IDENTITY FULL;
            INSERT INTO bag SELECT g % 50, CASE WHEN g % 3 = 0 THEN NULL ELSE 'b' END FROM generate_series(1, 200) g;
            CREATE TABLE other (id int PRIMARY KEY);
            INSERT INTO other VALUES (1);
        """)
    raw = raw_config(source_dsn, tmp_path, ["public.bag", "public.other"], "ducklake-sqlite",
                     api={"listen": f"127.0.0.1:{free_port()}"})
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw))
    pipeline = Pipeline(parse_config(raw), spark=spark)
    with running(pipeline):
        wait_until(lambda: _same(pipeline, source_dsn, "public.bag"), 120, "the copy")
    from headrace import readers

    con = readers.ducklake(pipeline.config.target.settings)  # type: ignore[arg-type]
    try:
        con.execute("DELETE FROM lake.public.bag WHERE a = 7 AND b IS NULL")  # its one copy of (7, NULL)
        con.execute("INSERT INTO lake.public.bag SELECT * FROM lake.public.bag WHERE a = 8 AND b = 'b'")  # 3 copies -> 6
    finally:
        con.close()
    with running(pipeline):
        code, tables, err = _verify_cli(path, "--tables", "bag")
        assert code == 1, err
        (result,) = tables
        found = sorted((d["key"], d["source_rows"], d["target_rows"]) for d in result["differences"])
        assert found == [([7, None], 1, 0), ([8, "b"], 3, 6)]
        code, tables, err = _verify_cli(path, "--tables", "public.other", "--sample", "0.5")
        assert (code, [(t["table"], t["status"], t["sample"]) for t in tables]) == (0, [("public.other", "equal", 0.5)])
        subprocess.run([sys.executable, "-m", "headrace.cli", "pause", "-c", str(path), "public.other"],
                       check=True, capture_output=True, timeout=60)
        wait_until(lambda: _verify_cli(path, "--tables", "other", "--wait", "1")[1][0]["status"] == "error", 30,
                   "the pause")
        code, tables, err = _verify_cli(path, "--tables", "bag", "other")  # not waiting --wait for a paused table
        assert code == 2, err
        assert [(t["table"], t["status"]) for t in tables] == [("public.bag", "different"), ("public.other", "error")]
        assert "(the table is PAUSED): verify compares a running pipeline" in tables[1]["error"]
        monkeypatch.setattr(compare, "MAX_ROWS_COMPARED", 1)  # as for a target far from its source
        (check,) = verify(pipeline.config, VerifyOptions(tables=("public.bag",)), Progress())
        shown = report(check, 1.0)
        assert (shown["status"], shown["differences"]) == ("different", [])
        assert shown["differing_rows_not_listed"] >= 7
