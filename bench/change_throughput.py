"""Change throughput and freshness, end to end, against pg_recvlogical on the same WAL.

Phase 1 (freshness): a steady mixed insert/update/delete load; a probe row is updated every
second in its own transaction; freshness = the target commit of the batch that holds it - the
source commit (p50/p99), taken from the materializer's apply.batch events (nothing polls the target).
Phase 2 (throughput): a burst of set-based changes is committed while the pipeline streams; the
time until the target has applied all of it gives changes/s end to end. The reference is
pg_recvlogical draining the same WAL (pgoutput, same publication) to /dev/null, timed in the same run.

    .venv/bin/python bench/change_throughput.py [--target iceberg|ducklake] [--seconds 60] [--burst 300000]
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import pct, wait_for  # noqa: E402

from headrace.config import parse_config  # noqa: E402
from headrace.control.status import pipeline_status  # noqa: E402
from headrace.core.position import parse_lsn  # noqa: E402
from headrace.pipeline import Pipeline  # noqa: E402
from headrace.source.postgres.throwaway import ThrowawayPostgres, find_server_bin  # noqa: E402

SEED_ROWS = 100_000


def caught_up(config: Any, lsn: int) -> bool:
    status = pipeline_status(config)
    return "captured_lsn" in status and parse_lsn(status["captured_lsn"]) >= lsn and all(
        t["state"] == "STREAMING" and t["pending_changes"] == 0 for t in status["tables"])


def current_lsn(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return parse_lsn(conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])  # type: ignore[index]


def steady_load(dsn: str, seconds: float, rate: int, counter: list[int]) -> None:
    """About ``rate`` changes per second in transactions of 50: 60% update, 25% insert, 15% delete."""
    rng = random.Random(1)
    next_id = SEED_ROWS + 1
    deadline = time.monotonic() + seconds
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            tick = time.monotonic()
            with conn.transaction():
                for _ in range(50):
                    roll = rng.random()
                    if roll < 0.6:
                        conn.execute("UPDATE bench_items SET v = v + 1, updated_at = now() WHERE id = %s",
                                     (rng.randint(1, next_id),))
                    elif roll < 0.85:
                        conn.execute("INSERT INTO bench_items VALUES (%s, 0, repeat('x', 60), now())", (next_id,))
                        next_id += 1
                    else:
                        conn.execute("DELETE FROM bench_items WHERE id = %s", (rng.randint(1, next_id),))
            counter[0] += 50
            time.sleep(max(0.0, 50 / rate - (time.monotonic() - tick)))


class AppliedLog(logging.Handler):
    """Collects the materializer's ``apply.batch`` events: (monotonic time, table, applied LSN)."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[tuple[float, str, int]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() == "apply.batch":
            fields = record.__dict__
            self.batches.append((time.monotonic(), fields["table"], parse_lsn(fields["applied_lsn"])))


def probe_freshness(dsn: str, applied: AppliedLog, seconds: float) -> list[float]:
    """Update the probe once a second; freshness = its batch's target commit - the source commit.

    Each probe update is its own transaction; the WAL insert position read just before its COMMIT
    is above every earlier probe commit and at or below its own, so the first probe batch whose
    applied LSN reaches it is the one that made the update visible. Nothing polls the target.
    """
    committed: list[tuple[float, int]] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        for k in range(1, int(seconds) + 1):
            with conn.transaction():
                conn.execute("UPDATE bench_probe SET seq = %s WHERE id = 1", (k,))
                before = parse_lsn(conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])  # type: ignore[index]
            committed.append((time.monotonic(), before))
            time.sleep(1.0)
    deadline = time.monotonic() + 120
    delays = []
    for at, lsn in committed:
        while True:
            seen = [t for t, table, applied_lsn in applied.batches
                    if table == "public.bench_probe" and applied_lsn >= lsn]
            if seen or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if seen:
            delays.append(min(seen) - at)
    return sorted(delays)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", choices=["iceberg", "ducklake"], default="iceberg")
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--rate", type=int, default=2000, help="steady load, changes/s")
    parser.add_argument("--burst", type=int, default=300_000, help="changes in the throughput burst")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="headrace-bench-"))
    results: dict[str, Any] = {"target": args.target}
    with ThrowawayPostgres() as pg:
        dsn = pg.dsn
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"""
                CREATE TABLE bench_items (id bigint PRIMARY KEY, v int, payload text, updated_at timestamptz);
                INSERT INTO bench_items SELECT g, 0, repeat('x', 60), now() FROM generate_series(1, {SEED_ROWS}) g;
                CREATE TABLE bench_probe (id int PRIMARY KEY, seq bigint);
                INSERT INTO bench_probe VALUES (1, 0);
            """)
        target: dict[str, Any] = (
            {"iceberg": {"warehouse": str(work / "warehouse")}} if args.target == "iceberg"
            else {"ducklake": {"catalog": str(work / "lake.ducklake"), "data_path": str(work / "lake")}}
        )
        config = parse_config({
            "name": "bench", "source": {"dsn": dsn, "tables": ["public.bench_items", "public.bench_probe"]},
            "target": target, "staging": {"path": str(work / "staging")},
            "apply": {"idle_sleep_seconds": 0.1}, "spark": {"master": "local[2]"},
        })
        pipeline = Pipeline(config)
        applied = AppliedLog()
        logging.getLogger("headrace.materialize").addHandler(applied)
        logging.getLogger("headrace.materialize").setLevel(logging.INFO)
        stop = threading.Event()
        runner = threading.Thread(target=pipeline.run, kwargs={"stop": stop})
        runner.start()
        lsn = current_lsn(dsn)
        results["initial_copy_s"] = round(wait_for(lambda: caught_up(config, lsn), 600, "initial copy", poll=0.1), 1)

        # Phase 1: freshness under a steady load.
        counter = [0]
        loader = threading.Thread(target=steady_load, args=(dsn, args.seconds, args.rate, counter))
        loader.start()
        delays = probe_freshness(dsn, applied, args.seconds)
        loader.join()
        results["steady_changes"] = counter[0]
        results["steady_rate_offered"] = round(counter[0] / args.seconds)
        results["freshness_p50_s"] = round(pct(delays, 50), 2)
        results["freshness_p99_s"] = round(pct(delays, 99), 2)
        results["freshness_samples"] = len(delays)
        lsn = current_lsn(dsn)
        wait_for(lambda: caught_up(config, lsn), 600, "catch-up after steady load", poll=0.1)

        # Phase 2: a burst, end to end, and pg_recvlogical over the same WAL.
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_create_logical_replication_slot('bench_ref', 'pgoutput')")
            start = time.monotonic()
            per_txn = 10_000
            for lo in range(1, args.burst + 1, per_txn):
                conn.execute("UPDATE bench_items SET v = v + 1 WHERE id BETWEEN %s AND %s",
                             (lo, lo + per_txn - 1))
        burst_changes = args.burst if args.burst <= SEED_ROWS else None
        with psycopg.connect(dsn) as conn:
            burst_changes = conn.execute("SELECT count(*) FROM bench_items WHERE id <= %s",
                                         (args.burst,)).fetchone()[0]  # type: ignore[index]
        end_lsn = current_lsn(dsn)
        wait_for(lambda: caught_up(config, end_lsn), 1800, "burst", poll=0.1)
        elapsed = time.monotonic() - start
        results["burst_changes"] = burst_changes
        results["burst_end_to_end_s"] = round(elapsed, 2)
        results["burst_changes_per_s"] = round(burst_changes / elapsed)
        stop.set()
        runner.join()

        recv = find_server_bin("pg_recvlogical")
        from headrace.core.position import format_lsn

        t0 = time.monotonic()
        subprocess.run([recv, "-d", dsn, "--slot", "bench_ref", "--start", "-o", "proto_version=1",
                        "-o", "publication_names=headrace_bench", "-E", format_lsn(end_lsn), "-f", "/dev/null",
                        "--no-loop"], check=True, capture_output=True, timeout=1800)
        ref = time.monotonic() - t0
        results["pg_recvlogical_s"] = round(ref, 2)
        results["pg_recvlogical_changes_per_s"] = round(burst_changes / ref)
        results["ratio_vs_pg_recvlogical"] = round(ref / elapsed, 3)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
