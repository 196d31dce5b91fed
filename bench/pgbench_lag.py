"""pgbench mode of bench/freshness.py: lag while pgbench (TPC-B) runs at full speed, and the catch-up.

pgbench's four tables are replicated (pgbench_history has no key: it is set to REPLICA IDENTITY FULL,
which headrace requires of a keyless table; pgbench only inserts into it). Every 2 s the sampler
records the slot's lag (WAL it holds back), headrace's staged backlog (registered, not yet applied)
and the pipeline's CPU and RSS. Lag is bounded when it does not grow over the run: the result gives
its peak in each half and its trend over the second half (MiB per minute, least squares).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from harness import (
    Headrace,
    Sampler,
    caught_up,
    compare_with_source,
    insert_lsn,
    load_average,
    pending_staged,
    pyplot,
    slot_lag_mib,
    wait_for,
    write_config,
)

from headrace.source.postgres.throwaway import ThrowawayPostgres, find_server_bin  # noqa: E402

TABLES = ["public.pgbench_accounts", "public.pgbench_branches", "public.pgbench_tellers", "public.pgbench_history"]
# per table, what the source and the target (read by DuckDB) must agree on after the catch-up
CHECKS = {"public.pgbench_accounts": "count(*), sum(abalance)", "public.pgbench_branches": "count(*), sum(bbalance)",
          "public.pgbench_tellers": "count(*), sum(tbalance)", "public.pgbench_history": "count(*), sum(delta)"}


def slope_per_minute(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) points, per minute; 0 with fewer than two points."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return 60 * sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0


def run_pgbench(server: ThrowawayPostgres, kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """Replicate pgbench's tables into ``kind`` while pgbench runs for ``args.pgbench_minutes``."""
    name = f"pgbench_{kind}"
    work = Path(tempfile.mkdtemp(prefix=f"headrace-{name}-"))
    pgbench = find_server_bin("pgbench")
    subprocess.run([pgbench, "-i", "-q", "-s", str(args.pgbench_scale), server.dsn], check=True,
                   capture_output=True)
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE pgbench_history REPLICA IDENTITY FULL")
    config = write_config(work, name, server.dsn, {"tables": TABLES}, kind,
                          staging=({} if args.flush_seconds is None else {"flush_seconds": args.flush_seconds}))
    headrace = Headrace(config, work / "headrace.log")
    headrace.start()
    slot = f"headrace_{name}"

    def source_side() -> dict[str, Any]:
        rows, size = pending_staged(server.dsn, name)
        return {"slot_lag_mib": slot_lag_mib(server.dsn, slot), "staged_rows": rows, "staged_mib": size / 2**20}

    try:
        ready = headrace.wait_streaming(server.dsn, name, len(TABLES))
        time.sleep(5)
        sampler = Sampler(headrace.pid, every=2.0, extra=source_side).start()
        seconds = round(args.pgbench_minutes * 60)
        rate = ["-R", str(args.pgbench_rate)] if args.pgbench_rate else []  # none: full speed
        out = subprocess.run([pgbench, "-n", "-c", str(args.pgbench_clients), "-j", "2", "-T", str(seconds), *rate,
                              server.dsn], check=True, capture_output=True, text=True)
        with psycopg.connect(server.dsn) as conn:
            end = insert_lsn(conn)
        catch_up = wait_for(lambda: caught_up(config, end), 1800, "catch-up after pgbench", headrace.check_alive)
        time.sleep(2)  # one more sample past the catch-up, for the plot
        samples = sampler.stop()
    finally:
        headrace.stop()
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                         " WHERE slot_name = %s", (slot,))
    matches = compare_with_source(config, server.dsn, CHECKS)
    tps = re.search(r"tps = ([\d.]+)", out.stdout)
    during = [s for s in samples if s["t"] <= seconds and s["slot_lag_mib"] is not None]
    half = seconds / 2
    first = [s["slot_lag_mib"] for s in during if s["t"] <= half]
    second = [s for s in during if s["t"] > half]
    return {
        "target": kind, "mode": "pgbench", "scale": args.pgbench_scale, "clients": args.pgbench_clients,
        "rate_limit_tps": args.pgbench_rate,
        "seconds": seconds, "flush_seconds": args.flush_seconds or "default", "ready_s": round(ready, 1),
        "tps": round(float(tps.group(1))) if tps else None,
        "lag_mib_peak_first_half": round(max(first, default=0.0), 1),
        "lag_mib_peak_second_half": round(max((s["slot_lag_mib"] for s in second), default=0.0), 1),
        "lag_mib_per_min_second_half": round(slope_per_minute([(s["t"], s["slot_lag_mib"]) for s in second]), 2),
        "staged_rows_peak": max((s["staged_rows"] for s in during), default=0),
        # captured but not applied: the slot lag alone misses a backlog that waits in staging
        "staged_rows_per_min_second_half": round(slope_per_minute([(s["t"], s["staged_rows"]) for s in second])),
        "caught_up_after_stop_s": round(catch_up, 1), **sampler.summary(),
        "load_avg": load_average(), "target_equals_source": all(m["equal"] for m in matches.values()),
        "compared": matches, "samples": samples,
    }


def plot_lag(results: list[dict[str, Any]], png: Path) -> None:
    """Slot lag and staged backlog over time, one line per target; the dotted line marks pgbench's end."""
    plt = pyplot()
    fig, (lag, staged) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
    for r in results:
        t = [s["t"] for s in r["samples"]]
        lag.plot(t, [s["slot_lag_mib"] if s["slot_lag_mib"] is not None else float("nan") for s in r["samples"]],
                 label=f"{r['target']} ({r['tps']} tps)")
        staged.plot(t, [s["staged_rows"] for s in r["samples"]], label=r["target"])
    for ax in (lag, staged):
        ax.axvline(results[0]["seconds"], ls=":", color="grey")
        ax.grid(alpha=.3)
    lag.set_ylabel("slot lag, MiB of WAL")
    staged.set_ylabel("staged, not applied (rows)")
    staged.set_xlabel("seconds since pgbench started (dotted: pgbench stops)")
    lag.set_title(f"pgbench -c {results[0]['clients']} scale {results[0]['scale']},"
                  f" flush_seconds {results[0]['flush_seconds']}", fontsize=10)
    lag.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
