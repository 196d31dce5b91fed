"""Freshness under a steady load over many tables, and lag under pgbench (issue 22).

Freshness mode (default): N busy tables (``--tables``) take ``--rate`` changes/s between them (60%
update, 25% insert, 15% delete, in transactions of ``--txn-changes`` changes, each on one random busy
table), for ``--seconds``, while M idle tables (``--idle-tables``, e.g. 0,200) sit in the same
pipeline. One writer connection records, per transaction, the WAL insert position read just before
its COMMIT and the wall time right after COMMIT returns. headrace runs as a child process logging
JSON; its ``apply.batch`` events give (table, applied LSN = the commit LSN of the batch's last
transaction, time). A transaction is in the first batch of its table whose applied LSN reaches the
position read before its COMMIT (one writer: every earlier commit on that table lies below it), so
freshness = that batch's log time - the source commit time. Nothing polls the target. The first
``--warmup`` seconds are left out (Spark's first jobs compile). CPU and RSS of the driver + JVM are
sampled from /proc during the load.

pgbench mode (``--pgbench-minutes``): `pgbench -i` tables (pgbench_history has no key: REPLICA
IDENTITY FULL) replicated while pgbench runs at full speed; slot lag and the staged backlog are
sampled every 2 s; then the time to catch up after pgbench stops.

    .venv/bin/python bench/freshness.py --smoke
    .venv/bin/python bench/freshness.py --tables 10 --idle-tables 0,200 --rate 1000 --seconds 120
    .venv/bin/python bench/freshness.py --tables 10 --rate 1000 --seconds 120 --storage local,s3
    .venv/bin/python bench/freshness.py --pgbench-minutes 5 [--pgbench-scale 10 --pgbench-clients 4]
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import yaml
from harness import (
    ROOT,
    BatchEvent,
    Headrace,
    ObjectStore,
    Sampler,
    caught_up,
    compare_with_source,
    cpu_seconds,
    cpu_used,
    insert_lsn,
    load_average,
    parse_lsn,
    parse_ts,
    pct,
    pyplot,
    target_config,
    thread_cpu,
    tree_pids,
    wait_for,
    write_config,
)
from pgbench_lag import plot_lag, run_pgbench  # noqa: E402

from headrace.source.postgres.throwaway import ThrowawayPostgres  # noqa: E402

SEED_ROWS = 2_000  # per busy table: small, so the bench measures the flow, not table size


@dataclass(frozen=True)
class Commit:
    """One source transaction: its table, the WAL position read just before COMMIT, the commit time."""

    table: str
    lsn_before: int
    at: float
    changes: int


def create_tables(dsn: str, busy: int, idle: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS fresh CASCADE")
        conn.execute("CREATE SCHEMA fresh")
        for i in range(busy):
            conn.execute(f"CREATE TABLE fresh.b{i} (id bigint PRIMARY KEY, v int NOT NULL, note text)")
            conn.execute(f"INSERT INTO fresh.b{i} SELECT g, 0, md5(g::text) FROM generate_series(1, {SEED_ROWS}) g")
        for i in range(idle):
            conn.execute(f"CREATE TABLE fresh.q{i} (id bigint PRIMARY KEY, v int NOT NULL, note text)")
            conn.execute(f"INSERT INTO fresh.q{i} SELECT g, 0, md5(g::text) FROM generate_series(1, 5) g")


def steady_load(dsn: str, busy: int, rate: int, txn_changes: int, seconds: float) -> list[Commit]:
    """About ``rate`` changes/s for ``seconds``, one table per transaction, paced on a fixed schedule."""
    rng = random.Random(7)
    next_id = [SEED_ROWS + 1] * busy
    commits: list[Commit] = []
    interval = txn_changes / rate
    n_up, n_del = round(txn_changes * 0.6), round(txn_changes * 0.15)
    with psycopg.connect(dsn, autocommit=True) as conn:
        start = time.monotonic()
        k = 0
        while (due := start + k * interval) < start + seconds:
            time.sleep(max(0.0, due - time.monotonic()))
            i = rng.randrange(busy)
            ups = [rng.randint(1, next_id[i] - 1) for _ in range(n_up)]
            dels = [rng.randint(1, next_id[i] - 1) for _ in range(n_del)]
            ins = list(range(next_id[i], next_id[i] + txn_changes - n_up - n_del))
            next_id[i] += len(ins)
            with conn.transaction():
                changed = conn.execute(f"UPDATE fresh.b{i} SET v = v + 1, note = md5(random()::text)"
                                       " WHERE id = ANY(%s)", (ups,)).rowcount
                changed += conn.execute(f"INSERT INTO fresh.b{i} SELECT g, 0, 'new' FROM unnest(%s::bigint[]) g",
                                        (ins,)).rowcount
                changed += conn.execute(f"DELETE FROM fresh.b{i} WHERE id = ANY(%s)", (dels,)).rowcount
                before = insert_lsn(conn)
            commits.append(Commit(f"fresh.b{i}", before, time.time(), changed))
            k += 1
    return commits


def holding(commits: list[Commit], batches: list[BatchEvent]) -> list[BatchEvent | None]:
    """Per commit, the first batch of its table whose applied LSN reaches it (None: not applied)."""
    per_table: dict[str, list[BatchEvent]] = {}
    for b in batches:
        per_table.setdefault(b.table, []).append(b)
    keys = {t: [b.applied_lsn for b in bs] for t, bs in per_table.items()}
    out: list[BatchEvent | None] = []
    for c in commits:
        bs = per_table.get(c.table, [])
        i = bisect.bisect_left(keys.get(c.table, []), c.lsn_before)
        out.append(bs[i] if i < len(bs) else None)
    return out


def freshness(commits: list[Commit], batches: list[BatchEvent]) -> list[float | None]:
    """Per commit, seconds until the target committed the batch holding it (None: not applied)."""
    return [None if b is None else b.at - c.at for c, b in zip(commits, holding(commits, batches), strict=True)]


def stages(commits: list[Commit], flushes: list[tuple[float, int]], batches: list[BatchEvent],
           since: float) -> dict[str, float]:
    """Where each commit's freshness went (p50/p99 of each part, commits from ``since`` on): until
    capture registered the staged file holding it (``capture.flush``), then until the apply batch
    holding it started, then that batch's own seconds."""
    flushes = sorted(flushes, key=lambda f: f[1])
    lsns = [lsn for _, lsn in flushes]
    parts: dict[str, list[float]] = {"staged": [], "waited": [], "applied": []}
    for c, batch in zip(commits, holding(commits, batches), strict=True):
        i = bisect.bisect_right(lsns, c.lsn_before)
        if c.at < since or i >= len(flushes) or batch is None:
            continue
        staged_at = flushes[i][0]
        parts["staged"].append(staged_at - c.at)
        parts["waited"].append(batch.at - batch.seconds - staged_at)
        parts["applied"].append(batch.seconds)
    return {f"{name}_p{p}_s": round(pct(sorted(v), p), 3) for name, v in parts.items() for p in (50, 99) if v}


def run_one(server: ThrowawayPostgres, kind: str, idle: int, args: argparse.Namespace,
            store: ObjectStore | None = None) -> dict[str, Any]:
    """One pipeline (target ``kind``, ``idle`` quiet tables) under the steady load; with ``store``, its
    staging and table files in a bucket of its own there."""
    name = f"fresh_{kind}_{idle}" + ("_s3" if store else "")
    work = Path(tempfile.mkdtemp(prefix=f"headrace-{name}-"))
    create_tables(server.dsn, args.tables, idle)
    apply: dict[str, Any] = {} if args.driver_batch_rows is None else {"driver_batch_rows": args.driver_batch_rows}
    apply.update(json.loads(args.apply))
    if args.consistency is not None:
        apply["consistency"] = args.consistency
    root = store.new_root(name) if store else None
    target = target_config(kind, work, root)
    if kind == "ducklake" and args.ducklake_inline_rows is not None:
        target["ducklake"]["inline_rows"] = args.ducklake_inline_rows
    if kind == "iceberg" and args.iceberg_cow_below is not None:
        target["iceberg"]["copy_on_write_below_rows"] = args.iceberg_cow_below
    if kind == "iceberg" and args.iceberg_catalog == "jdbc":  # a catalog database of its own on the bench's server
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "lakecat_{name}"')
            conn.execute(f'CREATE DATABASE "lakecat_{name}"')
        target["iceberg"]["catalog"] = {"type": "jdbc", "uri": server.dsn_for(f"lakecat_{name}")}
    staging: dict[str, Any] = {} if args.flush_seconds is None else {"flush_seconds": args.flush_seconds}
    if root:
        staging["path"] = f"{root}/staging"
    config = write_config(work, name, server.dsn, {"schemas": ["fresh"]}, kind, staging=staging, apply=apply,
                          target=target, maintenance=json.loads(args.maintenance))
    if args.engine is not None or args.spark_conf:
        settings = yaml.safe_load(config.read_text())
        if args.engine is not None:
            settings["engine"] = args.engine
        spark = settings.setdefault("spark", {})
        spark["conf"] = {**spark.get("conf", {}), **dict(c.split("=", 1) for c in args.spark_conf)}
        config.write_text(yaml.safe_dump(settings))
    headrace = Headrace(config, work / "headrace.log")
    headrace.start()
    try:
        ready = headrace.wait_streaming(server.dsn, name, args.tables + idle)
        time.sleep(5)  # the copy's last Spark work settles
        sampler = Sampler(headrace.pid).start()
        load_started, cpu_before = time.time(), cpu_seconds(tree_pids(headrace.pid))
        store_before = (cpu_seconds([store.pid]), store.requests()) if store else None
        threads_before = thread_cpu(tree_pids(headrace.pid))
        commits = steady_load(server.dsn, args.tables, args.rate, args.txn_changes, args.seconds)
        with psycopg.connect(server.dsn) as conn:
            end = insert_lsn(conn)
        wait_for(lambda: caught_up(config, end), 600, "catch-up after the load", headrace.check_alive)
        cpu = cpu_used(cpu_before, cpu_seconds(tree_pids(headrace.pid)))
        by_thread = thread_cpu(tree_pids(headrace.pid))
        by_thread.subtract(threads_before)
        # The store (moto, one Python process) runs on the bench's cores too: what it took of them.
        store_used = None if store is None or store_before is None else (
            cpu_used(store_before[0], cpu_seconds([store.pid])), store.requests() - store_before[1])
        loaded_seconds = time.time() - load_started
        sampler.stop()
        batches = headrace.batches()
        delays = freshness(commits, batches)
        flushes = [(parse_ts(e["ts"]), parse_lsn(e["captured_lsn"])) for e in headrace.events("capture.flush")]
    finally:
        headrace.stop()
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                         " WHERE slot_name = %s", (f"headrace_{name}",))
    matches = compare_with_source(config, server.dsn, {f"fresh.b{i}": "count(*), sum(v), sum(id)"
                                                       for i in range(args.tables)})
    measured = [d for c, d in zip(commits, delays, strict=True) if c.at - load_started >= args.warmup]
    # (seconds since the load started, freshness): shows whether freshness holds or grows over the run
    series = [(round(c.at - load_started, 2), round(d, 3)) for c, d in zip(commits, delays, strict=True)
              if d is not None and c.at - load_started >= args.warmup]
    seen = sorted(d for _, d in series)
    # CPU of the whole process tree (capture, apply, Spark's JVM) from the load's start to catch-up,
    # per batch applied meanwhile: less sensitive to the machine's load than freshness
    loaded = [b for b in batches if b.at >= load_started]
    result: dict[str, Any] = {
        "target": kind, "storage": "s3" if store else "local", "busy_tables": args.tables, "idle_tables": idle, "flush_seconds": args.flush_seconds or "default",
        "consistency": args.consistency or "default", "engine": args.engine or "auto",
        "ready_s": round(ready, 1), "transactions": len(commits), "changes": sum(c.changes for c in commits),
        "rate_offered": round(sum(c.changes for c in commits) / args.seconds),
        "samples": len(seen), "not_applied": len(measured) - len(seen),
        **{f"p{p}_s": round(pct(seen, p), 2) for p in (50, 90, 99)},
        "max_s": round(seen[-1], 2) if seen else None, **sampler.summary(),
        **stages(commits, flushes, batches, load_started + args.warmup),
        "batches": len(loaded), "batch_s_median": round(pct([b.seconds for b in loaded], 50), 3),
        "cpu_s": round(cpu, 1), "cpu_s_per_batch": round(cpu / max(1, len(loaded)), 3),
        # where it went: process/thread kind -> CPU seconds (the JIT, Spark's tasks, py4j, capture's Python)
        "cpu_s_by_thread": {k: round(v, 1) for k, v in by_thread.most_common(12)},
        **({} if store_used is None else {
            "store_cpu_core_pct": round(100 * store_used[0] / loaded_seconds, 1),
            "store_requests_per_batch": round(store_used[1] / max(1, len(loaded)), 1)}),
        "load_avg": load_average(), "target_equals_source": all(m["equal"] for m in matches.values()),
        "freshness_s": seen, "over_time": series,
    }
    return result


def plot(results: list[dict[str, Any]], png: Path) -> None:
    """The freshness CDF (left) and freshness against time (right, does it hold or grow?), one line per
    target and idle-table count."""
    plt = pyplot()
    fig, (cdf, drift) = plt.subplots(1, 2, figsize=(11, 4.2))
    for r in results:
        xs = r["freshness_s"]
        line = cdf.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))],
                        label=f"{r['target']}, {r.get('storage', 'local')}, {r['idle_tables']} idle tables: p50 {r['p50_s']} s, p99 {r['p99_s']} s")
        drift.scatter([t for t, _ in r["over_time"]], [d for _, d in r["over_time"]], s=4,
                      color=line[0].get_color())
    cdf.set_xlabel("freshness, s (target commit - source commit)")
    cdf.set_ylabel("share of transactions")
    cdf.legend(fontsize=8, loc="lower right")
    drift.set_xlabel("source commit, s since the load started")
    drift.set_ylabel("freshness, s")
    for ax in (cdf, drift):
        ax.grid(alpha=.3)
    fig.suptitle(f"{results[0]['busy_tables']} busy tables, ~{results[0]['rate_offered']} changes/s,"
                 f" flush_seconds {results[0]['flush_seconds']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="small and short: 3 busy tables, 200 changes/s, 20 s; pgbench scale 1, 30 s at 200 tps")
    ap.add_argument("--targets", default="iceberg,ducklake")
    ap.add_argument("--tables", type=int, default=10, help="busy tables")
    ap.add_argument("--idle-tables", default="0", help="comma list, one run per value (e.g. 0,200)")
    ap.add_argument("--rate", type=int, default=1000, help="changes/s over all busy tables")
    ap.add_argument("--txn-changes", type=int, default=10, help="changes per transaction")
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--warmup", type=float, default=10, help="leave out transactions of the first seconds")
    ap.add_argument("--flush-seconds", type=float, default=None, help="staging.flush_seconds (unset: the default)")
    ap.add_argument("--engine", choices=["auto", "spark", "driver"], help="engine (unset: the default, auto)")
    ap.add_argument("--spark-conf", action="append", default=[], help="a spark.conf setting k=v (repeatable)")
    ap.add_argument("--consistency", choices=["table", "transaction"], help="apply.consistency (unset: the default)")
    ap.add_argument("--maintenance", default="{}", help="maintenance settings, JSON")
    ap.add_argument("--ducklake-inline-rows", type=int, help="target.ducklake.inline_rows (unset: the default)")
    ap.add_argument("--apply", default="{}", help="more apply settings, JSON (e.g. '{\"concurrency\": 8}')")
    ap.add_argument("--driver-batch-rows", type=int, help="apply.driver_batch_rows (0: every batch"
                    " through Spark); default: headrace's")
    ap.add_argument("--iceberg-cow-below", type=int, help="target.iceberg.copy_on_write_below_rows (0: every"
                    " table merge-on-read, as before it existed)")
    ap.add_argument("--iceberg-catalog", choices=("hadoop", "jdbc"), default="hadoop",
                    help="target.iceberg.catalog.type (jdbc: a database made on the bench's server); default: hadoop")
    ap.add_argument("--storage", default="local", help="comma list, one run per value: local (disk), s3 (staging"
                    " and table files on a throwaway moto_server on loopback; the same settings otherwise)")
    ap.add_argument("--pgbench-minutes", type=float, help="pgbench mode: run pgbench this long instead")
    ap.add_argument("--pgbench-scale", type=int, default=10)
    ap.add_argument("--pgbench-clients", type=int, default=4)
    ap.add_argument("--pgbench-rate", type=int, help="pgbench -R (transactions/s); default: full speed")
    ap.add_argument("--json", default=str(ROOT / "docs" / "freshness.json"))
    ap.add_argument("--png", default=str(ROOT / "docs" / "img" / "freshness.png"))
    args = ap.parse_args()
    if args.smoke:
        args.tables, args.rate, args.seconds, args.warmup = 3, 200, 20, 3
        args.pgbench_scale, args.pgbench_rate = 1, args.pgbench_rate or 200
        args.pgbench_minutes = args.pgbench_minutes and 0.5
    results = []
    with ThrowawayPostgres() as server:
        for kind in args.targets.split(","):
            if args.pgbench_minutes:
                result = run_pgbench(server, kind, args)
                print(json.dumps({k: v for k, v in result.items() if k != "samples"}), flush=True)
                results.append(result)
                continue
            for idle in (int(x) for x in args.idle_tables.split(",")):
                for storage in args.storage.split(","):
                    with contextlib.ExitStack() as stack:
                        store = stack.enter_context(ObjectStore(Path(tempfile.mkdtemp(prefix="fresh-s3-")))) \
                            if storage == "s3" else None
                        result = run_one(server, kind, idle, args, store)
                    print(json.dumps({k: v for k, v in result.items() if k not in ("freshness_s", "over_time")}),
                          flush=True)
                    results.append(result)
    Path(args.json).write_text(json.dumps(results, indent=1))
    if args.pgbench_minutes:
        plot_lag(results, Path(args.png).with_name("pgbench_lag.png"))
    else:
        plot(results, Path(args.png))
        print(f"\n{'target':9} {'store':5} {'idle':>4} {'changes/s':>9} {'p50 s':>6} {'p90 s':>6} {'p99 s':>6} {'max s':>6}"
              f" {'cpu %':>6} {'rss MiB':>7} {'load':>5} equal")
        for r in results:
            print(f"{r['target']:9} {r['storage']:5} {r['idle_tables']:>4} {r['rate_offered']:>9} {r['p50_s']:>6} {r['p90_s']:>6}"
                  f" {r['p99_s']:>6} {r['max_s']!s:>6} {r.get('cpu_core_pct_mean', '-')!s:>6}"
                  f" {r.get('rss_mib_peak', '-')!s:>7} {r['load_avg']:>5} {r['target_equals_source']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
