"""Change throughput and freshness, end to end, against pg_recvlogical on the same WAL.

Phase 1 (freshness): a steady mixed insert/update/delete load; a probe row is updated every
second and a poller reads the target until it shows each probe value: freshness = first seen in
the target - source commit (p50/p99).
Phase 2 (throughput): a burst of set-based changes is committed while the pipeline streams; the
time until the target has applied all of it gives changes/s end to end. The reference is
pg_recvlogical draining the same WAL (pgoutput, same publication) to /dev/null, timed in the same run.

    .venv/bin/python bench/change_throughput.py [--target iceberg|ducklake] [--seconds 60] [--burst 300000]
"""

from __future__ import annotations

import argparse
import json
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

from headrace.config import parse_config  # noqa: E402
from headrace.control.status import pipeline_status  # noqa: E402
from headrace.core.position import parse_lsn  # noqa: E402
from headrace.pipeline import Pipeline  # noqa: E402
from headrace.source.postgres.catalog import read_table_schema  # noqa: E402
from headrace.source.postgres.throwaway import ThrowawayPostgres, find_server_bin  # noqa: E402

SEED_ROWS = 100_000


def wait_for(predicate: Any, timeout: float, what: str) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise TimeoutError(what)
        time.sleep(0.1)
    return time.monotonic() - start


def caught_up(config: Any, lsn: int) -> bool:
    status = pipeline_status(config)
    return parse_lsn(status["captured_lsn"]) >= lsn and all(
        t["state"] == "STREAMING" and t["pending_changes"] == 0 for t in status["tables"])


def current_lsn(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])  # type: ignore[index]


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


def probe_freshness(dsn: str, pipeline: Pipeline, seconds: float) -> list[float]:
    """Update the probe once a second; poll the target; return commit→visible delays in seconds."""
    with psycopg.connect(dsn) as conn:
        schema = read_table_schema(conn, "public.bench_probe")
    committed: dict[int, float] = {}
    seen: dict[int, float] = {}
    done = threading.Event()

    def poll() -> None:
        while not done.is_set() or len(seen) < len(committed):
            rows = pipeline.target.read_table(schema).collect()
            now = time.monotonic()
            top = max((r["seq"] for r in rows), default=0)
            for k in committed:
                if k <= top and k not in seen:
                    seen[k] = now
            if done.is_set() and now - max(committed.values(), default=now) > 120:
                break
            time.sleep(0.2)

    poller = threading.Thread(target=poll)
    poller.start()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for k in range(1, int(seconds) + 1):
            conn.execute("UPDATE bench_probe SET seq = %s WHERE id = 1", (k,))
            committed[k] = time.monotonic()
            time.sleep(1.0)
    done.set()
    poller.join()
    return sorted(seen[k] - committed[k] for k in seen)


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


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
            "target": target, "staging": {"path": str(work / "staging"), "flush_seconds": 1.0},
            "apply": {"idle_sleep_seconds": 0.1}, "spark": {"master": "local[2]"},
        })
        pipeline = Pipeline(config)
        stop = threading.Event()
        runner = threading.Thread(target=pipeline.run, kwargs={"stop": stop})
        runner.start()
        lsn = current_lsn(dsn)
        results["initial_copy_s"] = round(wait_for(lambda: caught_up(config, lsn), 600, "initial copy"), 1)

        # Phase 1: freshness under a steady load.
        counter = [0]
        loader = threading.Thread(target=steady_load, args=(dsn, args.seconds, args.rate, counter))
        loader.start()
        delays = probe_freshness(dsn, pipeline, args.seconds)
        loader.join()
        results["steady_changes"] = counter[0]
        results["steady_rate_offered"] = round(counter[0] / args.seconds)
        results["freshness_p50_s"] = round(pct(delays, 50), 2)
        results["freshness_p99_s"] = round(pct(delays, 99), 2)
        results["freshness_samples"] = len(delays)
        lsn = current_lsn(dsn)
        wait_for(lambda: caught_up(config, lsn), 600, "catch-up after steady load")

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
        wait_for(lambda: caught_up(config, end_lsn), 1800, "burst")
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
