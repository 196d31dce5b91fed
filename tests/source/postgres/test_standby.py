"""A hot standby as the source: check and run refuse it with the fix, no traceback (issue 41: run died
with ``ReadOnlySqlTransaction: cannot execute ALTER PUBLICATION in a read-only transaction``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
import yaml

from headrace.source.postgres.throwaway import ThrowawayPostgres


def test_a_standby_source_is_refused_by_check_and_run_with_the_fix(tmp_path: Path) -> None:
    with ThrowawayPostgres() as primary:
        with psycopg.connect(primary.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE items (id int PRIMARY KEY, v text); INSERT INTO items VALUES (1, 'a')")
        standby = ThrowawayPostgres().start_standby(primary)
        try:
            config = tmp_path / "pipeline.yaml"
            config.write_text(yaml.safe_dump({
                "name": "standby", "source": {"dsn": standby.dsn, "tables": ["public.items"]},
                "target": {"ducklake": {"catalog": str(tmp_path / "lake.ducklake"), "data_path": str(tmp_path / "d")}},
                "staging": {"path": str(tmp_path / "staging")}}))
            for command in ("check", "run"):
                result = subprocess.run([sys.executable, "-m", "headrace.cli", command, "-c", str(config)],
                                        capture_output=True, text=True, timeout=120)
                output = result.stdout + result.stderr
                assert result.returncode == 1, output[-2000:]
                assert "hot standby" in output and "point source.dsn at the primary" in output, output[-2000:]
                assert "Traceback" not in output, output[-3000:]
        finally:
            standby.stop()
