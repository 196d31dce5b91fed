"""Freshness with several busy tables, ``apply.concurrency`` 1 against N, in the same process and run.

Six tables take a steady mixed load between them (``--rate`` changes/s, transactions of 20 changes on
one table each); once a second a probe row of every table is updated in its own transaction;
freshness = the table's first ``apply.batch`` event whose applied LSN reaches the probe's commit -
the source commit (p50/p99 over every table's probes). Nothing polls the target. Each concurrency
setting runs its own pipeline against the same server, one after the other; the machine's load
average is printed beside each.

    .venv/bin/python bench/concurrent_apply.py [--target iceberg|ducklake] [--seconds 40] [--rate 1000]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.change_throughput import AppliedLog, caught_up, current_lsn, pct, wait_for  # noqa: E402
from headrace.config import parse_config  # noqa: E402
from headrace.core.position import parse_lsn  # noqa: E402
from headrace.pipeline import Pipeline  # noqa: E402
from headrace.source.postgres.throwaway import ThrowawayPostgres  # noqa: E402

TABLES = [f"busy{i}" for i in range(6)]
SEED_ROWS = 2_000


def load(dsn: str, seconds: float, rate: int, stop: threading.Event) -> None:
    """About ``rate`` changes/s over the tables: 60% update, 25% insert, 15% delete."""
    rng = random.Random(1)
    next_id = {t: SEED_ROWS + 1 for t in TABLES}
    deadline = time.monotonic() + seconds
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline and not stop.is_set():
            tick = time.monotonic()
            table = rng.choice(TABLES)
            with conn.transaction():
                for _ in range(20):
                    roll = rng.random()
                    if roll < 0.6:
                        conn.execute(f"UPDATE {table} SET v = v + 1 WHERE id = %s", (rng.randint(2, next_id[table]),))
                    elif roll < 0.85:
                        conn.execute(f"INSERT INTO {table} VALUES (%s, 0, repeat('x', 60))", (next_id[table],))
                        next_id[table] += 1
                    else:
                        conn.execute(f"DELETE FROM {table} WHERE id = %s", (rng.randint(2, next_id[table]),))
            time.sleep(max(0.0, 20 / rate - (time.monotonic() - tick)))


def probes(dsn: str, applied: AppliedLog, seconds: float) -> list[float]:
    """Every second, row 1 of each table updated in its own transaction; the delays until applied."""
    committed: list[tuple[str, float, int]] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        for k in range(int(seconds)):
            for table in TABLES:
                with conn.transaction():
                    conn.execute(f"UPDATE {table} SET v = %s WHERE id = 1", (-k,))
                    lsn = parse_lsn(conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])  # type: ignore[index]
                committed.append((f"public.{table}", time.monotonic(), lsn))
            time.sleep(1.0)
    deadline = time.monotonic() + 180
    delays = []
    for table, at, lsn in committed:
        while True:
            seen = [t for t, name, applied_lsn in applied.batches if name == table and applied_lsn >= lsn]
            if seen or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if seen:
            delays.append(min(seen) - at)
    return delays


def one_run(dsn: str, work: Path, target_kind: str, concurrency: int, seconds: float, rate: int) -> dict[str, Any]:
    target: dict[str, Any] = (
        {"iceberg": {"warehouse": str(work / "warehouse"), "catalog_name": f"c{concurrency}"}}
        if target_kind == "iceberg"
        else {"ducklake": {"catalog": str(work / "lake.ducklake"), "data_path": str(work / "lake")}}
    )
    config = parse_config({
        "name": f"conc{concurrency}", "source": {"dsn": dsn, "tables": [f"public.{t}" for t in TABLES]},
        "target": target, "staging": {"path": str(work / "staging")},
        "apply": {"idle_sleep_seconds": 0.1, "concurrency": concurrency}, "spark": {"master": "local[2]"},
    })
    pipeline = Pipeline(config)
    applied = AppliedLog()
    logger = logging.getLogger("headrace.materialize")
    logger.addHandler(applied)
    logger.setLevel(logging.INFO)
    stop = threading.Event()
    runner = threading.Thread(target=pipeline.run, kwargs={"stop": stop})
    runner.start()
    try:
        wait_for(lambda: caught_up(config, current_lsn(dsn)), 900, "initial copy")
        load_before = os.getloadavg()[0]
        loader = threading.Thread(target=load, args=(dsn, seconds, rate, stop))
        loader.start()
        batches_before = len(applied.batches)
        delays = probes(dsn, applied, seconds)
        loader.join()
        return {"concurrency": concurrency, "freshness_p50_s": round(pct(delays, 50), 2),
                "freshness_p99_s": round(pct(delays, 99), 2), "samples": len(delays),
                "batches": len(applied.batches) - batches_before,
                "load_avg_1m": [round(load_before, 1), round(os.getloadavg()[0], 1)]}
    finally:
        stop.set()
        runner.join()
        logger.removeHandler(applied)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", choices=["iceberg", "ducklake"], default="iceberg")
    parser.add_argument("--seconds", type=float, default=40)
    parser.add_argument("--rate", type=int, default=1000, help="steady load over all tables, changes/s")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    args = parser.parse_args()
    results = []
    with ThrowawayPostgres() as pg:
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            for table in TABLES:
                conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, v int, payload text);"
                             f"INSERT INTO {table} SELECT g, 0, repeat('x', 60) FROM generate_series(1, {SEED_ROWS}) g")
        for concurrency in args.concurrency:
            work = Path(tempfile.mkdtemp(prefix=f"headrace-conc{concurrency}-"))
            results.append(one_run(pg.dsn, work, args.target, concurrency, args.seconds, args.rate))
            print(json.dumps(results[-1]), flush=True)
    print(json.dumps({"target": args.target, "runs": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
