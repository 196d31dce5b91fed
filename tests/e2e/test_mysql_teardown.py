"""``headrace reset`` and ``headrace drop`` for a MariaDB pipeline: refused while it runs (its binlog
reader's lock in state), reset starts over from the server's position then with a new copy (the
target equal to the source again, changes made while reset streamed), drop leaves nothing in state,
staging or (with ``--targets``) the target. Both through the command line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from headrace.config import parse_config
from headrace.core.errors import SourceError
from headrace.pipeline import Pipeline
from headrace.source.mysql.catalog import table_id
from headrace.state.lifecycle import TableState
from headrace.teardown import drop_pipeline, survey
from tests.e2e.helpers import raw_config, running, wait_until
from tests.e2e.test_mysql import _run, shop, state_dsn  # noqa: F401 -- fixtures shared with test_mysql
from tests.e2e.test_mysql_ddl import _same, _state_of


def test_mysql_reset_and_drop_from_the_command_line(
        mariadb_server: Any, shop: tuple[str, str], state_dsn: str, tmp_path: Path, spark: Any) -> None:  # noqa: F811
    database, root = shop
    _run(root, "CREATE TABLE items (id INT PRIMARY KEY, v INT)", "INSERT INTO items VALUES (1, 1), (2, 2)")
    raw = raw_config(mariadb_server.dsn_for(database), tmp_path, [f"{database}.items"], "ducklake",
                     source={"state_dsn": state_dsn})
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw))
    config = parse_config(raw)
    items = table_id(database, "items")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "headrace.cli", *args, "-c", str(path), "--yes"],
                              capture_output=True, text=True, env=env, timeout=120)

    pipeline = Pipeline(config, spark=spark)
    with running(pipeline):
        wait_until(lambda: _state_of(state_dsn, items) == TableState.STREAMING, 180, "items to stream")
        with pytest.raises(SourceError, match="is running: its binlog reader holds the pipeline's lock"):
            drop_pipeline(config, targets=False)
        refused = cli("reset")
        assert refused.returncode != 0 and "is running" in refused.stderr, refused.stderr
    assert survey(config).state_rows > 0

    # Changed while stopped, then reset: the next run reads the binlog from now and copies items again.
    _run(root, "INSERT INTO items VALUES (3, 3)", "DELETE FROM items WHERE id = 1")
    reset = cli("reset")
    assert reset.returncode == 0, reset.stderr
    assert "binlog position" in reset.stdout and "copies every table again" in reset.stdout, reset.stdout
    assert "replication slot" not in reset.stdout
    assert survey(config).state_rows == 0 and not survey(config).tables

    pipeline = Pipeline(config, spark=spark)
    with running(pipeline):
        wait_until(lambda: _state_of(state_dsn, items) == TableState.STREAMING, 180, "items copied again")
        _run(root, "INSERT INTO items VALUES (4, 4)")
        wait_until(lambda: _same(pipeline, state_dsn, root, database, "items", items) == 3, 60,
                   "the target equal to the source after the reset", every=0.5)

    dropped = cli("drop", "--targets")
    assert dropped.returncode == 0, dropped.stderr
    assert "rows in the _headrace state tables" in dropped.stdout and "target table" in dropped.stdout
    assert survey(config).nothing
    assert not (tmp_path / "staging" / "t").exists()
    again = cli("drop")
    assert again.returncode == 0 and "nothing left to drop" in again.stdout
