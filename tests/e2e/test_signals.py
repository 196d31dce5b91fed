"""Graceful stop: SIGTERM under load makes ``headrace run`` flush, acknowledge and exit 0 within
``STOP_TIMEOUT_SECONDS``; a restart then converges. A stop that cannot finish in time, or a second
signal, ends the process at once (exit 128 + signal)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from headrace.cli import STOP_TIMEOUT_SECONDS
from headrace.config import parse_config
from headrace.pipeline import Pipeline
from headrace.state.lifecycle import TableState
from tests.e2e.helpers import (
    assert_same,
    changes_in_flight,
    create_items_and_lines,
    raw_config,
    run_command,
    slot_position,
    wait_until,
    workload,
)
from tests.e2e.test_pipeline import run_caught_up

TABLES = ("public.items", "public.lines")


def test_sigterm_under_load_stops_in_time_and_a_restart_converges(source_dsn: str, tmp_path: Path,
                                                                  spark: Any) -> None:
    create_items_and_lines(source_dsn, 300)
    raw = raw_config(source_dsn, tmp_path, list(TABLES), target="ducklake",
                     spark={"master": "local[1]"})
    config = parse_config(raw)
    state = Pipeline(config).setup()
    cmd = run_command(raw, tmp_path)
    log_path = tmp_path / "run.log"
    try:
        with log_path.open("w") as log, subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log) as proc:
            try:
                wait_until(lambda: all(r.state is TableState.STREAMING for r in state.tables()), 240,
                           "the tables never reached STREAMING")
                with workload(source_dsn, seed=9):
                    # Warm (each table has applied a batch: the first Spark jobs of a process are
                    # the slow ones), with changes in flight: buffered, staged, being applied.
                    wait_until(lambda: all(f"apply.batch table={t}" in log_path.read_text() for t in TABLES), 120,
                               "no batch applied")
                    wait_until(changes_in_flight(source_dsn, state), 60, "no changes in flight")
                    signalled = time.monotonic()
                    proc.send_signal(signal.SIGTERM)
                    code = proc.wait(STOP_TIMEOUT_SECONDS + 15)
                    stop_seconds = time.monotonic() - signalled
            finally:
                proc.kill()  # a no-op once it exited; otherwise the with block would wait for ever
        text = log_path.read_text()
        assert code == 0, text[-3000:]
        assert stop_seconds <= STOP_TIMEOUT_SECONDS, stop_seconds
        assert "run.stopping" in text and "run.stop " in text and "run.stop_forced" not in text, text[-3000:]
        # What capture had registered is acknowledged: the slot is at (or, forwarded by keepalives,
        # past) the registered position, and start-up checks pass on the restart below.
        assert slot_position(source_dsn, config.slot_name)[1] >= state.captured_lsn()
        print(f"stopped {stop_seconds:.1f} s after SIGTERM")
    finally:
        state.close()
    run_caught_up(Pipeline(config, spark=spark))  # the restart (in this process: no second JVM to start)
    check = Pipeline(config, spark=spark)
    try:
        assert assert_same(check, source_dsn, "public.items") > 250
        assert assert_same(check, source_dsn, "public.lines") > 250
    finally:
        check.target.close()


# A process that installs headrace's stop handlers and then never stops (no JVM needed).
_HANGS = """
import time
from headrace.cli import _stop_on_signals
from headrace.logs import setup_logging
setup_logging()
stop = _stop_on_signals(timeout=1.0)
print("ready", flush=True)
stop.wait()
time.sleep(60)
"""


def _hanging_process() -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", _HANGS], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_a_stop_that_overruns_its_bound_or_a_second_signal_exits_at_once() -> None:
    with _hanging_process() as proc:
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 128 + signal.SIGTERM
        assert 0.9 <= time.monotonic() - signalled < 5
        assert proc.stderr is not None and "run.stop_forced" in proc.stderr.read()
    with _hanging_process() as proc:
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 128 + signal.SIGINT
        assert time.monotonic() - signalled < 0.9  # before the 1 s bound
