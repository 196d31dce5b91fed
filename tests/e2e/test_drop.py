"""``headrace drop``: refused while running; afterwards nothing left on the source, in state, in staging
or (with ``--targets``) in the target; a second drop finds nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from headrace.core.errors import SourceError
from headrace.pipeline import Pipeline
from headrace.source.postgres.throwaway import ThrowawayPostgres
from headrace.teardown import drop_pipeline, survey
from tests.e2e.helpers import assert_same, make_config, raw_config, running, wait_until


def _target_tables(pipeline: Pipeline) -> set[str]:
    """Tables in the target, read without the state (which drop removes)."""
    config = pipeline.config
    if config.target.kind == "ducklake":
        from headrace.targets.ducklake import extension

        con = extension.connect(config.target.settings, alias="lake_check")
        try:
            rows = con.execute("SELECT table_schema || '.' || table_name FROM information_schema.tables"
                               " WHERE table_catalog = 'lake_check' AND table_schema <> '_headrace'").fetchall()
        finally:
            con.close()
        return {r[0] for r in rows}
    assert config.target.kind == "iceberg"
    catalog = config.target.settings.catalog_name
    try:
        rows = pipeline.spark.sql(f"SHOW TABLES IN {catalog}.public").collect()
    except Exception:  # the namespace itself is gone
        return set()
    return {f"public.{r.tableName}" for r in rows}


def _copied(pipeline: Pipeline, dsn: str, rows: int) -> bool:
    try:
        return assert_same(pipeline, dsn, "public.items") == rows
    except Exception:  # the target table is not created yet
        return False


@pytest.mark.parametrize("target", ["iceberg", "ducklake"])
def test_drop_refused_while_running_then_leaves_nothing(pg_server: ThrowawayPostgres, source_dsn: str,
                                                         tmp_path: Path, spark: Any, target: str) -> None:
    state_db = f"{source_dsn.rsplit('/', 1)[1]}_state"
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{state_db}"')
    state_dsn = pg_server.dsn_for(state_db)
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, v text);"
                     "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 20) g")
    config = make_config(source_dsn, tmp_path, ["public.items"], target, source={"state_dsn": state_dsn})
    pipeline = Pipeline(config, spark)
    with running(pipeline):
        wait_until(lambda: _copied(pipeline, source_dsn, 20), 120, "items copied")
        with psycopg.connect(source_dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO items VALUES (21, 'streamed')")
        wait_until(lambda: assert_same(pipeline, source_dsn, "public.items") == 21, 60, "a change applied")
        with pytest.raises(SourceError, match="is running.*Stop the `headrace run` process"):
            drop_pipeline(config, targets=True)
    assert _target_tables(pipeline) == {"public.items"}
    assert list((tmp_path / "staging").rglob("*")), "nothing staged: the test proves nothing about staging"

    done = drop_pipeline(config, targets=True, open_target=lambda: Pipeline(config, spark).target)
    assert any("replication slot headrace_t" in line for line in done), done
    assert any("schema _headrace" in line for line in done), done

    assert survey(config).nothing
    with psycopg.connect(source_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'headrace_t%'"
                            ).fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM pg_publication").fetchone() == (0,)
    with psycopg.connect(state_dsn) as conn:
        assert conn.execute("SELECT to_regnamespace('_headrace')").fetchone() == (None,)
    assert not (tmp_path / "staging" / "t").exists()
    assert _target_tables(Pipeline(config, spark)) == set()
    assert drop_pipeline(config, targets=True) == []  # idempotent: nothing left
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{state_db}" WITH (FORCE)')


def test_drop_keeps_other_pipelines_and_needs_yes_off_a_terminal(source_dsn: str, tmp_path: Path) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY)")
    ours, theirs = (make_config(source_dsn, tmp_path / n, ["public.items"], name=n) for n in ("ours", "theirs"))
    Pipeline(ours).setup().close()
    Pipeline(theirs).setup().close()
    path = tmp_path / "ours.yaml"
    path.write_text(yaml.safe_dump(raw_config(source_dsn, tmp_path / "ours", ["public.items"], name="ours")))
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    cli = [sys.executable, "-m", "headrace.cli", "drop", "-c", str(path)]

    refused = subprocess.run(cli, capture_output=True, text=True, stdin=subprocess.DEVNULL, env=env, timeout=120)
    assert refused.returncode == 1
    assert "pass --yes to confirm" in refused.stderr
    assert not survey(ours).nothing

    dropped = subprocess.run([*cli, "--yes"], capture_output=True, text=True, env=env, timeout=120)
    assert dropped.returncode == 0, dropped.stderr
    assert "replication slot headrace_ours" in dropped.stdout
    assert survey(ours).nothing
    remaining = survey(theirs)
    assert remaining.slot == "headrace_theirs" and remaining.state_rows > 0  # the schema stays for them

    again = subprocess.run([*cli, "--yes"], capture_output=True, text=True, env=env, timeout=120)
    assert again.returncode == 0 and "nothing left to drop" in again.stdout
