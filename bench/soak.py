"""Soak: `headrace run` for N minutes under a steady change rate while the source restarts and
crashes and headrace itself is killed with SIGKILL, at random moments. Not a test (not in CI).

Every `--sample` seconds it records the memory of the headrace process tree (the Python driver and
Spark's JVM), the slot's lag (WAL the slot holds back: current WAL minus confirmed_flush_lsn), and
the staged backlog (bytes of staged files not yet collected). At the end it stops the load, waits
until headrace has caught up, stops it, and compares every row of the target with the source,
read from the DuckLake with plain DuckDB (a reader that is not ours). It plots the three series with
the chaos events marked (matplotlib PNG) and prints the figures for docs/benchmarks.md.

    .venv/bin/python bench/soak.py [--minutes 30] [--rate 1000] [--chaos-every 60] [--png docs/img/soak.png]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import Headrace, slot_lag_mib, staged_mib, tree_rss_mib  # noqa: E402

from headrace.source.postgres.throwaway import ThrowawayPostgres, free_port  # noqa: E402

SEED_ROWS = 20_000
TXN_CHANGES = 20


def load(dsn: str, rate: int, stop: threading.Event, counter: list[int]) -> None:
    """About ``rate`` changes/s in transactions of ``TXN_CHANGES`` (60% update, 25% insert, 15% delete),
    reconnecting whenever the server is gone."""
    rng = random.Random(1)
    next_id = SEED_ROWS + 1_000_000
    while not stop.is_set():
        try:
            with psycopg.connect(dsn, autocommit=True, connect_timeout=3) as conn:
                while not stop.is_set():
                    tick = time.monotonic()
                    ups = [rng.randint(1, SEED_ROWS) for _ in range(int(TXN_CHANGES * 0.6))]
                    dels = [rng.randint(1, SEED_ROWS) for _ in range(int(TXN_CHANGES * 0.15))]
                    ins = list(range(next_id, next_id + TXN_CHANGES - len(ups) - len(dels)))
                    next_id += len(ins)
                    with conn.transaction():
                        conn.execute("UPDATE soak SET v = v + 1, note = md5(random()::text) WHERE id = ANY(%s)", (ups,))
                        conn.execute("INSERT INTO soak SELECT g, 0, 'new' FROM unnest(%s::bigint[]) g", (ins,))
                        conn.execute("DELETE FROM soak WHERE id = ANY(%s)", (dels,))
                    counter[0] += TXN_CHANGES
                    time.sleep(max(0.0, TXN_CHANGES / rate - (time.monotonic() - tick)))
        except psycopg.OperationalError:
            stop.wait(0.2)


def target_rows(lake: Path) -> list[tuple[Any, ...]]:
    """The target table read with DuckDB's own ducklake extension."""
    import duckdb

    from headrace.targets.ducklake.extension import load_extension

    con = duckdb.connect()
    load_extension(con, "ducklake", "reading the soak lake")
    con.execute(f"ATTACH 'ducklake:{lake / 'meta.ducklake'}' AS lake (READ_ONLY)")
    return sorted(con.execute("SELECT id, v, note FROM lake.public.soak").fetchall())


def plot(samples: list[dict[str, Any]], events: list[tuple[float, str]], png: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t"] / 60 for s in samples]
    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    series = [("rss_mib", "headrace memory (MiB, driver + JVM)"), ("slot_lag_mib", "slot lag (MiB of WAL)"),
              ("staged_mib", "staged backlog (MiB)")]
    colors = {"restart": "tab:blue", "crash": "tab:red", "kill9": "tab:purple"}
    for ax, (key, label) in zip(axes, series, strict=True):
        ax.plot(t, [s[key] if s[key] is not None else float("nan") for s in samples], lw=1)
        if key == "rss_mib":
            ax.plot(t, [s["driver_rss_mib"] for s in samples], lw=1, ls="--", label="Python driver alone")
            ax.legend(fontsize=7, loc="lower right")
        ax.set_ylabel(label, fontsize=8)
        for when, kind in events:
            ax.axvline(when / 60, color=colors[kind], lw=0.8, alpha=0.6)
    axes[-1].set_xlabel("minutes (lines: blue source restart, red source crash, purple kill -9 of headrace)")
    axes[0].set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=90)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--rate", type=int, default=1000, help="source changes per second")
    ap.add_argument("--chaos-every", type=float, default=60, help="mean seconds between chaos events")
    ap.add_argument("--sample", type=float, default=2.0)
    ap.add_argument("--png", default=str(Path(__file__).resolve().parents[1] / "docs" / "img" / "soak.png"))
    ap.add_argument("--seed", type=int, default=13)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="headrace-soak-"))
    with ThrowawayPostgres(settings={"fsync": "on", "synchronous_commit": "on"}) as server:
        dsn = server.dsn
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE soak (id bigint PRIMARY KEY, v int NOT NULL, note text)")
            conn.execute("INSERT INTO soak SELECT g, 0, md5(g::text) FROM generate_series(1, %s) g", (SEED_ROWS,))
        raw = {"name": "soak", "source": {"dsn": dsn, "tables": ["public.soak"]},
               "target": {"ducklake": {"catalog": str(work / "lake" / "meta.ducklake"),
                                       "data_path": str(work / "lake" / "data")}},
               "staging": {"path": str(work / "staging"), "gc_seconds": 10},
               "spark": {"master": "local[1]"}, "api": {"listen": f"127.0.0.1:{free_port()}"},
               "reconnect": {"max_seconds": 5}}
        config = work / "soak.yaml"
        config.write_text(yaml.safe_dump(raw))
        headrace = Headrace(config, work / "headrace.log")
        headrace.start()
        stop, counter = threading.Event(), [0]
        writer = threading.Thread(target=load, args=(dsn, args.rate, stop, counter), daemon=True)
        writer.start()
        samples: list[dict[str, Any]] = []
        events: list[tuple[float, str]] = []
        start = time.monotonic()
        end = start + args.minutes * 60
        next_chaos = start + rng.expovariate(1 / args.chaos_every)
        next_sample = start
        while time.monotonic() < end:
            now = time.monotonic()
            if now >= next_sample:
                assert headrace.proc is not None
                samples.append({"t": now - start, "rss_mib": tree_rss_mib(headrace.proc.pid),
                                "driver_rss_mib": tree_rss_mib(headrace.proc.pid, children=False),
                                "slot_lag_mib": slot_lag_mib(dsn, "headrace_soak"),
                                "staged_mib": staged_mib(work / "staging"), "changes": counter[0]})
                next_sample += args.sample
            if now >= next_chaos:
                kind = rng.choice(["restart", "crash", "kill9"])
                events.append((now - start, kind))
                print(f"{(now - start) / 60:5.1f} min: {kind}", flush=True)
                if kind == "restart":
                    server.restart("fast")
                elif kind == "crash":
                    server.stop_server("immediate")
                    time.sleep(rng.uniform(0.5, 8))  # down for a while, sometimes past the 5 s cap
                    server.start_server()
                else:
                    headrace.kill9()
                    time.sleep(1)
                    headrace.start()
                next_chaos = time.monotonic() + rng.expovariate(1 / args.chaos_every)
            time.sleep(0.2)
        stop.set()
        writer.join(30)
        # Caught up: the slot confirmed past the last change and nothing staged waits (GC ran).
        with psycopg.connect(dsn, autocommit=True) as conn:
            last = conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()[0]  # type: ignore[index]
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            with psycopg.connect(dsn) as conn:
                pos = conn.execute("SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots"
                                   " WHERE slot_name = 'headrace_soak'").fetchone()
            if pos and pos[0] >= last and staged_mib(work / "staging") == 0:
                break
            time.sleep(1)
        time.sleep(3)  # the last batch's commit
        code = headrace.stop()
        with psycopg.connect(dsn) as conn:
            source = sorted(conn.execute("SELECT id, v, note FROM soak").fetchall())
        target = target_rows(work / "lake")
    steady = [s for s in samples if s["t"] > 120] or samples

    def peak(key: str) -> float:
        return round(max((s[key] for s in steady if s[key] is not None), default=0.0), 1)

    result = {
        "minutes": args.minutes, "rate_target": args.rate,
        "changes": counter[0], "changes_per_s": round(counter[0] / (args.minutes * 60)),
        "events": {k: sum(1 for _, e in events if e == k) for k in ("restart", "crash", "kill9")},
        "rss_mib_peak_after_2min": peak("rss_mib"), "driver_rss_mib_peak_after_2min": peak("driver_rss_mib"), "slot_lag_mib_peak": peak("slot_lag_mib"),
        "staged_mib_peak": peak("staged_mib"), "exit_code_after_sigterm": code,
        "source_rows": len(source), "target_equals_source": source == target,
    }
    if source != target:
        result["missing_in_target"] = len(set(source) - set(target))
        result["unexpected_in_target"] = len(set(target) - set(source))
    plot(samples, events, Path(args.png), f"soak: {args.minutes:g} min at {result['changes_per_s']} changes/s,"
         f" {len(events)} chaos events; target equals source: {result['target_equals_source']}")
    print(json.dumps(result, indent=2))
    return 0 if result["target_equals_source"] else 1


if __name__ == "__main__":
    sys.exit(main())
