"""Kill the fan-out process between a destination's commit and its cursor write; the re-run must end
with exactly the rows of a crash-free run (keyed and append-only modes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fanout.helpers import Setup, run_caught_up
from tests.fanout.test_pipeline import HISTORY, TENANTS, seed_rows


def run_cli(config_path: Path, crash_at: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HEADRACE_LOG_LEVEL": "WARNING"}
    env.pop("HEADRACE_CRASH_AT", None)
    if crash_at:
        env["HEADRACE_CRASH_AT"] = crash_at
    return subprocess.run(
        [sys.executable, "-m", "headrace.cli", "run", "-c", str(config_path), "--until-caught-up"],
        env=env, capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[2],
    )


def scenario(root: Path, key_columns: list[str], crash: bool) -> dict[str, list[tuple[object, ...]]]:
    """Seed, then apply HISTORY; with ``crash``, through the CLI dying once in each phase."""
    setup = Setup(root)
    seed_rows(setup)
    config = setup.config(TENANTS, routing={"key_columns": key_columns})
    path = root / "fanout.yaml"
    path.write_text(json.dumps(config.model_dump(mode="json")))
    # Dies after the second lake's seed commit, then after the first lake's change commit.
    for crash_at in ("fanout.after_destination_commit:2", "fanout.after_destination_commit:1"):
        if crash:
            died = run_cli(path, crash_at)
            assert died.returncode == 137, died.stderr
            assert "crash point fanout.after_destination_commit" in died.stderr
            done = run_cli(path)
            assert done.returncode == 0, done.stderr
        else:
            run_caught_up(config)
        if crash_at.endswith(":2"):
            setup.write(*HISTORY)
    return {d: setup.held(d) for d in TENANTS}


@pytest.mark.parametrize("key_columns", [["event_id"], []], ids=["keyed", "append-only"])
def test_crash_between_destination_commit_and_cursor(tmp_path: Path, key_columns: list[str]) -> None:
    crashed = scenario(tmp_path / "crashed", key_columns, crash=True)
    clean = scenario(tmp_path / "clean", key_columns, crash=False)
    assert crashed == clean
    assert any(crashed.values())
