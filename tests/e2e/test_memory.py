"""Memory under a burst: with backpressure on, a burst of 15x the bound keeps the ``headrace run``
process's resident memory within the bound docs/guarantees.md states.

The process is a real ``headrace run`` subprocess; its RSS is the Python driver's own (Spark's JVM
is a child process with its own memory, bounded by Spark's settings).
"""

from __future__ import annotations

import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from headrace.config import parse_config
from headrace.pipeline import Pipeline
from headrace.state.lifecycle import TableState
from tests.e2e.helpers import assert_same, raw_config, run_command, wait_until, wal_insert_lsn

BOUND_ROWS = 2_000  # staging.max_pending_rows
FLUSH_ROWS = 500
TXNS, ROWS_PER_TXN = 60, 500  # 30 000 rows of about 1 KiB: 15x the bound
# The documented bound (docs/guarantees.md): peak RSS <= RSS when streaming idle + this much.
RSS_ALLOWANCE_MIB = 150


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    """A memory figure of a live process from /proc (VmRSS: now; VmHWM: its peak so far), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"/proc/{pid}/status has no {field}")


def settled(pid: int, samples: int = 3, within_kib: int = 2048) -> Callable[[], bool]:
    """A ``wait_until`` condition: the process's RSS moved by at most ``within_kib`` over its last
    ``samples`` polls (the run is idle, not still growing after its start and copy)."""
    seen: list[int] = []

    def check() -> bool:
        seen.append(rss_kib(pid))
        last = seen[-samples:]
        return len(last) == samples and max(last) - min(last) <= within_kib

    return check


def test_a_burst_of_15x_the_bound_keeps_rss_bounded(source_dsn: str, tmp_path: Path, spark: Any) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE burst (id int PRIMARY KEY, payload text);"
                     "INSERT INTO burst SELECT g, 'seed' FROM generate_series(1, 100) g")
    raw = raw_config(source_dsn, tmp_path, ["public.burst"], target="ducklake",
                     staging={"max_pending_rows": BOUND_ROWS, "flush_rows": FLUSH_ROWS},
                     spark={"master": "local[1]"})
    state = Pipeline(parse_config(raw)).setup()
    log_path = tmp_path / "run.log"
    samples: list[int] = []
    with log_path.open("w") as log, subprocess.Popen(run_command(raw, tmp_path), stdout=subprocess.DEVNULL,
                                                     stderr=log) as proc:
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.05):
                samples.append(rss_kib(proc.pid))

        sampler = threading.Thread(target=sample)
        try:
            wait_until(lambda: [r.state for r in state.tables()] == [TableState.STREAMING], 240,
                       "public.burst never reached STREAMING")
            idle = wal_insert_lsn(source_dsn)
            wait_until(lambda: state.captured_lsn() >= idle and state.log_index.pending_totals()[0] == 0, 60,
                       "the copy's tail was not applied")
            wait_until(settled(proc.pid), 60, "the run's memory did not settle", every=0.5)
            baseline = rss_kib(proc.pid)
            sampler.start()
            with psycopg.connect(source_dsn, autocommit=True) as conn:
                for t in range(TXNS):
                    first = 1000 + t * ROWS_PER_TXN
                    # ~1 KiB of text that does not compress away: 31 md5 hex strings
                    conn.execute("INSERT INTO burst SELECT g, repeat(md5(g::text), 31)"
                                 " FROM generate_series(%s::int, %s::int) g", (first, first + ROWS_PER_TXN - 1))
            end = wal_insert_lsn(source_dsn)
            wait_until(lambda: state.captured_lsn() >= end and state.log_index.pending_totals()[0] == 0, 300,
                       "the burst was not applied")
            peak = rss_kib(proc.pid, "VmHWM")
        finally:
            done.set()
            if sampler.is_alive():
                sampler.join()
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            finally:
                proc.kill()  # a no-op once it exited; otherwise the with block would wait for ever
                state.close()
    text = log_path.read_text()
    assert "capture.paused" in text, text[-3000:]  # backpressure engaged
    print(f"rss baseline {baseline // 1024} MiB, sampled peak {max(samples) // 1024} MiB, "
          f"VmHWM {peak // 1024} MiB, pauses {text.count('capture.paused')}")
    check = Pipeline(parse_config(raw), spark=spark)
    try:
        assert assert_same(check, source_dsn, "public.burst") == 100 + TXNS * ROWS_PER_TXN
    finally:
        check.target.close()
    assert peak <= baseline + RSS_ALLOWANCE_MIB * 1024, (baseline, max(samples), peak)
