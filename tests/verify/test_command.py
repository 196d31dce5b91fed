"""The verify command's edges that need no pipeline: could not run (exit 2, one sentence), the
metrics of a recorded result."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from headrace.control.live_metrics import verify_gauges


def _verify(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "headrace.cli", "verify", "-c", str(config), *args],
                          capture_output=True, text=True, timeout=120)


def test_a_pipeline_never_started_cannot_be_verified(source_dsn: str, tmp_path: Path) -> None:
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump({
        "name": "never", "source": {"dsn": source_dsn, "tables": ["public.t"]},
        "target": {"ducklake": {"catalog": f"sqlite:{tmp_path / 'meta.sqlite'}", "data_path": str(tmp_path / "d")}},
        "staging": {"path": str(tmp_path / "staging")}}))
    done = _verify(config)
    assert done.returncode == 2
    assert done.stderr.strip() == "error: pipeline never has not started yet: run `headrace run` first"
    assert done.stdout == ""
    done = _verify(config, "--sample", "1.5")
    assert (done.returncode, done.stderr.strip()) == (
        2, "error: --sample 1.5: give a fraction above 0 and at most 1")


def test_metrics_show_the_last_result() -> None:
    tables = [{"table": "public.a", "verify": {"status": "different", "differences": 3,
                                              "checked_at": "2026-11-27T03:00:00+00:00"}},
              {"table": "public.b", "verify": None}]
    got = {(m.name, tuple(s.labels.values()), s.value) for m in verify_gauges(tables) for s in m.samples}
    assert got == {("headrace_verify_differences", ("public.a",), 3.0), ("headrace_verify_equal", ("public.a",), 0.0),
                   ("headrace_verify_last_run_timestamp_seconds", ("public.a",), 1795748400.0)}
