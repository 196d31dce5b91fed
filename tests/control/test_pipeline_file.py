"""``headrace init`` against real databases: the type matrix and the awkward names of the end-to-end
suites, with tables it must refuse beside them. What it writes passes ``headrace check``, names
every refused table with its reason, keeps the values no type can hold as text, holds no password,
and (DuckLake) replicates as written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from headrace.cli import main
from headrace.config import load_config
from headrace.core.names import TableName
from headrace.pipeline import Pipeline
from tests.e2e import test_identifiers as identifiers
from tests.e2e import test_type_matrix as matrix
from tests.e2e.helpers import assert_same
from tests.e2e.test_pipeline import run_caught_up

ENV = "HR_INIT_TEST_DSN"


def _init(dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[str, dict[str, Any]]:
    """Run ``headrace init`` into a file; its text and its parsed YAML. The DSN is in the environment."""
    monkeypatch.setenv(ENV, dsn)
    path = tmp_path / "pipeline.yaml"
    assert main(["init", "--dsn-env", ENV, "--output", str(path), *args]) == 0
    text = path.read_text()
    return text, yaml.safe_load(text)


def _flat(text: str) -> str:
    """The file's words in one line, comment marks left out: a phrase wrapped over lines is found."""
    return " ".join(line.strip().lstrip("#").strip() for line in text.splitlines())


def _check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    code = main(["check", "-c", str(tmp_path / "pipeline.yaml")])
    out = capsys.readouterr().out
    assert code == 0, out
    return out


def _add_refused_tables(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE nokey (a int, b text); INSERT INTO nokey VALUES (1, 'x')")  # REPLICA IDENTITY DEFAULT
        conn.execute("CREATE TABLE nokey_full (a int, b text); ALTER TABLE nokey_full REPLICA IDENTITY FULL")
        conn.execute("CREATE TABLE grid (id int PRIMARY KEY, cells int[], price numeric(8,2), at timestamp);"
                     "INSERT INTO grid VALUES (1, '{{1,2},{3,4}}', 'NaN', '2000-01-01'), (2, '[0:1]={5,6}', 1, 'infinity')")


@pytest.mark.parametrize("target", ["iceberg", "ducklake"])
def test_the_type_matrix_gets_a_file_check_passes_on(source_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str], target: str) -> None:
    matrix._create(source_dsn)
    _add_refused_tables(source_dsn)
    text, raw = _init(source_dsn, tmp_path, monkeypatch, "--target", target)
    assert raw["source"] == {"dsn_env": ENV, "tables": ["public.grid", "public.matrix", "public.nokey_full"],
                             "columns_as_text": ["public.grid.cells", "public.grid.price"]}
    password = psycopg.conninfo.conninfo_to_dict(source_dsn).get("password")
    assert "dsn:" not in text and (not password or str(password) not in text)
    # The keyless table is named with its reason and fix, commented out.
    assert "# - public.nokey\n" in text
    assert "no primary key and REPLICA IDENTITY DEFAULT: add a primary key" in _flat(text)
    assert "ALTER TABLE public.nokey REPLICA IDENTITY FULL" in _flat(text)
    # Values seen: a timestamp past 294247 AD (any target) and, on Iceberg, infinite dates: clamp, with why.
    assert raw["values"] == {"infinity": "clamp"}
    assert "public.matrix.c_ts" in text and "timestamps after 294247 AD" in _flat(text)
    assert ("public.matrix.c_date" in text) == (target == "iceberg")
    assert list(raw["target"]) == [target]
    assert "kept as text (PostgreSQL's text form, no loss)" in _flat(text) and "c_money (money)" in _flat(text)
    out = _check(tmp_path, capsys)
    assert "config and source OK (3 tables)" in out


def test_names_a_ducklake_cannot_hold_are_refused_with_why_and_the_rest_replicates(
        source_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        spark: Any) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        for i, table in enumerate(identifiers.LISTED):
            identifiers._create(conn, table, 100 * i, twins=table.name != "select")  # "ID" and id but one
        identifiers._create(conn, TableName("Sales", "order items"), 900, twins=False)  # a case twin of a table
    _, ducklake = _init(source_dsn, tmp_path, monkeypatch, "--target", "ducklake", "--schemas", "Sales", "public",
                        "café")
    # Only public.select has no case-twin columns, and "Sales"."order items" shares its name but for case.
    assert ducklake["source"]["tables"] == ["public.\"select\""]
    text = _flat((tmp_path / "pipeline.yaml").read_text())
    assert 'public.".." ' in text and 'its columns "ID" and id differ only in case' in text
    assert '"Sales"."order items" beside "Sales"."Order Items"' in text
    _check(tmp_path, capsys)
    # What it wrote replicates as written (its paths are under the output's folder).
    pipeline = Pipeline(load_config(tmp_path / "pipeline.yaml"), spark=spark)
    run_caught_up(pipeline)
    assert assert_same(pipeline, source_dsn, 'public."select"') == 3
    # Iceberg holds every name: every table is listed.
    (tmp_path / "pipeline.yaml").unlink()
    _, iceberg = _init(source_dsn, tmp_path, monkeypatch, "--target", "iceberg")
    assert len(iceberg["source"]["tables"]) == len(identifiers.LISTED) + 1


def test_init_refuses_to_overwrite_and_names_an_unreachable_database(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "pipeline.yaml"
    path.write_text("keep me")
    assert main(["init", "--dsn", "postgresql://x@127.0.0.1:1/db", "--output", str(path)]) == 1
    assert "exists: choose another --output, or pass --force" in capsys.readouterr().err
    assert main(["init", "--dsn", "postgresql://x:secret@127.0.0.1:1/db", "--output", str(path), "--force"]) == 1
    err = capsys.readouterr().err
    assert "cannot connect to postgresql://x:***@127.0.0.1:1/db" in err and "secret" not in err
    assert path.read_text() == "keep me"
