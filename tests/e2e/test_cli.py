"""The command line as users run it: check, run --until-caught-up, status --json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import yaml

from headrace.source.postgres.throwaway import ThrowawayPostgres


def headrace(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "headrace.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def write_config(tmp_path: Path, tables: list[str], dsn_env: str = "HR_TEST_DSN") -> Path:
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump({
        "name": "cli",
        "source": {"dsn_env": dsn_env, "tables": tables},
        "target": {"iceberg": {"warehouse": str(tmp_path / "wh"), "namespace": "lake"}},
        "staging": {"path": str(tmp_path / "staging"), "flush_seconds": 0.5},
        "spark": {"master": "local[1]"},
    }))
    return path


def test_check_lists_every_problem(source_dsn: str, tmp_path: Path) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE keyless (a int, b text); CREATE TABLE good (id int PRIMARY KEY)")
    config = write_config(tmp_path, ["public.keyless", "public.missing", "public.good"])
    result = headrace("check", "-c", str(config), env={"HR_TEST_DSN": source_dsn})
    assert result.returncode == 1, result.stdout + result.stderr
    assert "public.keyless" in result.stdout and "primary key" in result.stdout
    assert "public.missing" in result.stdout
    assert "public.good" not in result.stdout

    # Discovering a schema: the keyless table will be skipped, which is not a problem for check.
    raw = yaml.safe_load(config.read_text())
    raw["source"] = {"dsn_env": "HR_TEST_DSN", "schemas": ["public"]}
    config.write_text(yaml.safe_dump(raw))
    result = headrace("check", "-c", str(config), env={"HR_TEST_DSN": source_dsn})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "public.good: key (id)" in result.stdout
    assert "public.keyless: will be skipped" in result.stdout and "primary key" in result.stdout


def test_check_reports_wal_level(tmp_path: Path) -> None:
    with ThrowawayPostgres(settings={"wal_level": "replica"}) as pg:
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE good (id int PRIMARY KEY)")
        config = write_config(tmp_path, ["public.good"])
        result = headrace("check", "-c", str(config), env={"HR_TEST_DSN": pg.dsn})
        assert result.returncode == 1
        assert "wal_level" in result.stdout and "logical" in result.stdout
        result = headrace("run", "-c", str(config), "--until-caught-up", env={"HR_TEST_DSN": pg.dsn})
        assert result.returncode == 1 and "wal_level" in result.stderr


def test_bad_config_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"name": "x", "source": {"dsn": "x"}, "target": {}, "staging": {}}))
    result = headrace("check", "-c", str(path))
    assert result.returncode == 1
    assert "staging.path" in result.stderr and "target" in result.stderr


def test_run_until_caught_up_then_status(source_dsn: str, tmp_path: Path) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, v text);"
                     "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 100) g")
    secret_dsn = source_dsn.replace("postgres@", "postgres:s3cret@")  # trust auth ignores it
    config = write_config(tmp_path, ["public.items"])
    env = {"HR_TEST_DSN": secret_dsn}
    result = headrace("run", "-c", str(config), "--until-caught-up", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "s3cret" not in result.stderr + result.stdout  # credentials never reach the logs
    assert "snapshot.done" in result.stderr
    status = json.loads(headrace("status", "-c", str(config), "--json", env=env).stdout)
    assert status["pipeline"] == "cli"
    assert status["slot"]["name"] == "headrace_cli" and status["slot"]["confirmed_flush_lsn"]
    (table,) = status["tables"]
    assert table["table"] == "public.items" and table["state"] == "STREAMING"
    assert table["rows_copied"] == 100 and table["error"] is None
    assert {"snapshot_lsn", "applied_lsn", "lag_bytes", "rows_applied"} <= set(table)
