"""Apply cost against table size: the same burst of random-key changes into tables of 1M, 10M (50M)
rows, on both targets (issue 22: at most 1.5x from 1M to 10M rows).

Per size, one throwaway server is seeded once (``INSERT ... SELECT generate_series``) and used by
each target in turn: `headrace run` copies the table, then, while it streams,
1. an idle run: one row changes; the time until headrace has applied it is the pipeline's fixed
   latency (flush wait, wake-up, one small batch); a first such change, before, is a warm-up;
2. the burst: ``--burst`` changes (80% updates, 10% deletes, 10% inserts of keys drawn uniformly
   over the whole table, so every part of the table is touched) in transactions of 1,000.
Reported per burst: end to end (last commit until headrace has applied everything) net of the idle
run, and the apply seconds headrace itself logs (sum over the burst's ``apply.batch`` events).
``--repeat`` bursts per table; the median is kept. Plots apply time against table size.

    .venv/bin/python bench/table_size.py --smoke
    .venv/bin/python bench/table_size.py --sizes 1000000,10000000,50000000 [--targets iceberg,ducklake]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
import yaml
from harness import (
    ROOT,
    Headrace,
    caught_up,
    compare_with_source,
    insert_lsn,
    load_average,
    pyplot,
    save_figure,
    wait_for,
    write_config,
)

from headrace.source.postgres.throwaway import ThrowawayPostgres  # noqa: E402

TXN_CHANGES = 1_000


def seed(dsn: str, rows: int) -> float:
    """The table of ``rows`` rows; seconds it took."""
    started = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE sized (id bigint PRIMARY KEY, v int NOT NULL, note text)")
        conn.execute("INSERT INTO sized SELECT g, 0, md5(g::text) FROM generate_series(1, %s) g", (rows,))
        conn.execute("VACUUM ANALYZE sized")
    return time.monotonic() - started


def applied_after(config: Path, dsn: str, change: str, params: tuple[Any, ...], check: Any) -> float:
    """Run ``change`` and wait until headrace has applied it; seconds from its commit."""
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        conn.execute(change, params)
        lsn = insert_lsn(conn)
    return applied_since(config, lsn, check)


def applied_since(config: Path, lsn: int, check: Any) -> float:
    """Seconds until headrace has applied every change up to the commit after WAL position ``lsn``.

    ``lsn`` is read inside the last transaction, before its COMMIT: capture passes it with that commit.
    A position read after the commit may lie past it (autovacuum's WAL after a burst), which capture
    only passes at its next heartbeat, when the source has been quiet for ``staging.heartbeat_seconds``
    (one 1M-row run of three took 10 s longer so)."""
    return wait_for(lambda: caught_up(config, lsn), 1800, "the change applied", check, poll=0.1)


def burst(dsn: str, rows: int, changes: int, next_id: int, rng: random.Random) -> tuple[int, int]:
    """``changes`` random-key changes in transactions of ``TXN_CHANGES``; returns the next free id and
    the WAL position read just before the last COMMIT."""
    lsn = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(max(1, changes // TXN_CHANGES)):
            ups = [rng.randint(1, rows) for _ in range(TXN_CHANGES * 8 // 10)]
            dels = [rng.randint(1, rows) for _ in range(TXN_CHANGES // 10)]
            ins = list(range(next_id, next_id + TXN_CHANGES - len(ups) - len(dels)))
            next_id += len(ins)
            with conn.transaction():
                conn.execute("UPDATE sized SET v = v + 1 WHERE id = ANY(%s)", (ups,))
                conn.execute("DELETE FROM sized WHERE id = ANY(%s)", (dels,))
                conn.execute("INSERT INTO sized SELECT g, 1, 'new' FROM unnest(%s::bigint[]) g", (ins,))
                lsn = insert_lsn(conn)
    return next_id, lsn


def run_one(server: ThrowawayPostgres, kind: str, rows: int, args: argparse.Namespace) -> dict[str, Any]:
    name = f"size_{kind}_{rows}"
    work = Path(tempfile.mkdtemp(prefix=f"headrace-{name}-"))
    config = write_config(work, name, server.dsn, {"tables": ["public.sized"]}, kind,
                          staging=({} if args.flush_seconds is None else {"flush_seconds": args.flush_seconds}))
    raw = yaml.safe_load(config.read_text())
    if args.driver_key_rows is not None:
        raw["target"][kind]["driver_key_rows"] = args.driver_key_rows
    if args.engine is not None:
        raw["engine"] = args.engine
    config.write_text(yaml.safe_dump(raw))
    headrace = Headrace(config, work / "headrace.log")
    started = time.monotonic()
    headrace.start()
    with psycopg.connect(server.dsn) as conn:  # inserts go above every key (an earlier target's too)
        next_id = max(rows, conn.execute("SELECT max(id) FROM sized").fetchone()[0] or 0) + 1  # type: ignore[index]
    rng = random.Random(rows)
    idle, net, applied = [], [], []
    try:
        headrace.wait_streaming(server.dsn, name, 1, timeout=7200)
        copy = time.monotonic() - started
        time.sleep(5)
        # warm-up, not measured: the first change after the copy pays for Spark's first MERGE plan
        applied_after(config, server.dsn, "UPDATE sized SET v = v + 1 WHERE id = 1", (), headrace.check_alive)
        for _ in range(args.repeat):
            idle.append(applied_after(config, server.dsn, "UPDATE sized SET v = v + 1 WHERE id = %s",
                                      (rng.randint(1, rows),), headrace.check_alive))
            since = time.time()
            next_id, lsn = burst(server.dsn, rows, args.burst, next_id, rng)
            total = applied_since(config, lsn, headrace.check_alive)
            net.append(total - idle[-1])
            applied.append(sum(b.seconds for b in headrace.batches() if b.at >= since))
    finally:
        headrace.stop()
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                         " WHERE slot_name = %s", (f"headrace_{name}",))
    matches = compare_with_source(config, server.dsn, {"public.sized": "count(*), sum(v), sum(id)"})
    return {"target": kind, "rows": rows, "burst": args.burst, "copy_s": round(copy, 1),
            "driver_key_rows": args.driver_key_rows, "engine": args.engine or "auto",
            "target_equals_source": matches["public.sized"]["equal"],
            "idle_run_s": round(statistics.median(idle), 2), "burst_net_s": round(statistics.median(net), 2),
            "burst_apply_s": round(statistics.median(applied), 2), "load_avg": load_average(),
            "runs": {"idle_s": [round(x, 2) for x in idle], "net_s": [round(x, 2) for x in net],
                     "apply_s": [round(x, 2) for x in applied]}}


def plot(results: list[dict[str, Any]], png: Path) -> None:
    """Burst time (net end to end, solid; headrace's apply seconds, dashed) against table size."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for kind in sorted({r["target"] for r in results}):
        rs = sorted((r for r in results if r["target"] == kind), key=lambda r: r["rows"])
        line = ax.plot([r["rows"] for r in rs], [r["burst_net_s"] for r in rs], marker="o", label=f"{kind}, net")
        ax.plot([r["rows"] for r in rs], [r["burst_apply_s"] for r in rs], marker="x", ls="--",
                color=line[0].get_color(), label=f"{kind}, apply.batch seconds")
    ax.set_xscale("log")
    ax.set_xlabel("rows in the target table")
    ax.set_ylabel(f"seconds for a {results[0]['burst']:,}-change burst")
    ax.set_ylim(bottom=0)
    save_figure(fig, png, ax)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="10K and 100K rows, a 5K burst, once")
    ap.add_argument("--sizes", default="1000000,10000000")
    ap.add_argument("--targets", default="iceberg,ducklake")
    ap.add_argument("--burst", type=int, default=25_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--flush-seconds", type=float, default=None, help="staging.flush_seconds (unset: the default)")
    ap.add_argument("--driver-key-rows", type=int, default=None,
                    help="target.<iceberg|ducklake>.driver_key_rows (default: headrace's, 20M)")
    ap.add_argument("--engine", choices=["auto", "spark", "driver"], help="engine (unset: the default, auto)")
    ap.add_argument("--json", default=str(ROOT / "docs" / "table_size.json"))
    ap.add_argument("--png", default=str(ROOT / "docs" / "img" / "table_size.png"))
    args = ap.parse_args()
    if args.smoke:
        args.sizes, args.burst, args.repeat = "10000,100000", 5_000, 1
    results = []
    for rows in (int(x) for x in args.sizes.split(",")):
        with ThrowawayPostgres() as server:
            seeded = seed(server.dsn, rows)
            print(f"{rows:,} rows seeded in {seeded:.0f} s", flush=True)
            for kind in args.targets.split(","):
                result = run_one(server, kind, rows, args)
                print(json.dumps(result), flush=True)
                results.append(result)
    for kind in args.targets.split(","):
        rs = sorted((r for r in results if r["target"] == kind), key=lambda r: r["rows"])
        for r in rs:  # the goal: 10M rows at most 1.5x the burst time of 1M rows
            r["net_vs_smallest"] = round(r["burst_net_s"] / max(rs[0]["burst_net_s"], 0.01), 2)
            r["apply_vs_smallest"] = round(r["burst_apply_s"] / max(rs[0]["burst_apply_s"], 0.01), 2)
    print(f"\n{'target':9} {'rows':>11} {'copy s':>7} {'idle s':>7} {'net s':>7} {'apply s':>8} {'net x':>6}"
          f" {'apply x':>7} {'load':>5}")
    for r in results:
        print(f"{r['target']:9} {r['rows']:>11,} {r['copy_s']:>7} {r['idle_run_s']:>7} {r['burst_net_s']:>7}"
              f" {r['burst_apply_s']:>8} {r['net_vs_smallest']:>6} {r['apply_vs_smallest']:>7} {r['load_avg']:>5}")
    Path(args.json).write_text(json.dumps(results, indent=1))
    plot(results, Path(args.png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
