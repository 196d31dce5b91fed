"""Idle cost: CPU of `headrace run` (the Python driver and Spark's JVM) when no source table changes.

For each target and each table count N, creates N tables of a few rows in a throwaway PostgreSQL,
starts `headrace run` as a child process, waits until every table is STREAMING (and a little
longer, for the copy's last Spark work to settle), then samples the CPU time of the whole process
tree (/proc: utime + stime of the driver and its descendants) over ``--seconds``. Then one row is
changed in one table and the time until the target holds it is measured (wake-up on work).
Prints a table and plots idle CPU against the number of tables (matplotlib PNG).

    .venv/bin/python bench/idle.py [--tables 3,200] [--targets iceberg,ducklake] [--seconds 60]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import cpu_seconds, cpu_used, tree_pids, tree_rss_mib  # noqa: E402

from headrace.source.postgres.throwaway import ThrowawayPostgres, free_port  # noqa: E402

ROWS = 5


def states(dsn: str, pipeline: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute("SELECT state FROM _headrace.tables WHERE pipeline = %s", (pipeline,))]


def applied(dsn: str, pipeline: str, lsn: int) -> bool:
    """Table t0 has a change at or after ``lsn`` applied (state's applied_lsn)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT applied_lsn FROM _headrace.tables WHERE pipeline = %s AND table_name = 't0'",
                           (pipeline,)).fetchone()
    return bool(row and row[0] is not None and int(row[0]) >= lsn)


def run_one(server: ThrowawayPostgres, kind: str, n: int, seconds: float, work: Path) -> dict[str, Any]:
    name = f"idle_{kind}_{n}"
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS bench CASCADE")
        conn.execute("CREATE SCHEMA bench")
        for i in range(n):
            conn.execute(f"CREATE TABLE bench.t{i} (id bigint PRIMARY KEY, v int NOT NULL, note text)")
            conn.execute(f"INSERT INTO bench.t{i} SELECT g, 0, md5(g::text) FROM generate_series(1, {ROWS}) g")
    target = ({"iceberg": {"warehouse": str(work / "warehouse")}} if kind == "iceberg"
              else {"ducklake": {"catalog": str(work / "lake.ducklake"), "data_path": str(work / "lake")}})
    raw = {"name": name, "source": {"dsn": server.dsn, "schemas": ["bench"]}, "target": target,
           "staging": {"path": str(work / "staging")}, "spark": {"master": "local[2]"},
           "api": {"listen": f"127.0.0.1:{free_port()}"}}
    config = work / f"{name}.yaml"
    config.write_text(yaml.safe_dump(raw))
    log = (work / f"{name}.log").open("ab")
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "headrace.cli", "run", "-c", str(config)], stdout=log,
                            stderr=log, start_new_session=True, cwd=Path(__file__).resolve().parents[1])
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"headrace exited with {proc.returncode}: see {work / name}.log")
            try:
                got = states(server.dsn, name)
            except psycopg.Error:
                got = []
            if len(got) == n and all(s == "STREAMING" for s in got):
                break
            time.sleep(1)
        ready = time.monotonic() - started
        time.sleep(10)  # the last copy's Spark work and the first catalog poll settle
        pids = tree_pids(proc.pid)
        before, t0 = cpu_seconds(pids), time.monotonic()
        time.sleep(seconds)
        used, wall = cpu_used(before, cpu_seconds(tree_pids(proc.pid))), time.monotonic() - t0
        rss = tree_rss_mib(proc.pid)  # the goal: within the documented memory bound at 200 tables
        # Wake-up: one row of one table changes; how long until it is applied.
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            lsn = 1 + int(conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()[0])  # type: ignore[index]
            conn.execute("UPDATE bench.t0 SET v = v + 1 WHERE id = 1")  # its LSN is past ``lsn``
        changed = time.monotonic()
        while not applied(server.dsn, name, lsn) and time.monotonic() - changed < 120:
            time.sleep(0.05)
        wake = time.monotonic() - changed
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                         " WHERE slot_name = %s", (f"headrace_{name}",))
    return {"target": kind, "tables": n, "ready_s": round(ready, 1), "idle_core_pct": round(100 * used / wall, 2),
            "rss_mib": round(rss),
            "one_row_applied_s": round(wake, 2)}


def plot(runs: list[tuple[str, list[dict[str, Any]]]], png: Path) -> None:
    """Idle CPU against tables, one line per target and run (``runs``: (label, results))."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for label, results in runs:
        for kind in sorted({r["target"] for r in results}):
            rs = sorted((r for r in results if r["target"] == kind), key=lambda r: r["tables"])
            ax.plot([r["tables"] for r in rs], [max(r["idle_core_pct"], 0.01) for r in rs], marker="o",
                    linestyle="--" if label == "before" else "-", label=f"{kind} {label}".strip())
            for r in rs:
                ax.annotate(f"{r['idle_core_pct']:g}%", (r["tables"], max(r["idle_core_pct"], 0.01)),
                            textcoords="offset points", xytext=(6, -3), fontsize=8)
    ax.set_xlabel("tables (idle)")
    ax.set_ylabel("CPU, % of one core (driver + JVM)")
    ax.set_yscale("log")
    ax.set_title("headrace run, no source changes")
    ax.grid(alpha=.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tables", default="3,200")
    ap.add_argument("--targets", default="iceberg,ducklake")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--png", default=str(Path(__file__).resolve().parents[1] / "docs" / "img" / "idle.png"))
    ap.add_argument("--label", default="")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--before", help="results of an earlier run (its --json) to plot beside, dashed")
    args = ap.parse_args()
    results = []
    with ThrowawayPostgres() as server:
        for kind in args.targets.split(","):
            for n in (int(x) for x in args.tables.split(",")):
                work = Path(tempfile.mkdtemp(prefix=f"headrace-idle-{kind}-{n}-"))
                result = run_one(server, kind, n, args.seconds, work)
                print(json.dumps(result), flush=True)
                results.append(result)
    print(f"\n{'target':10} {'tables':>6} {'ready s':>8} {'idle % core':>12} {'1-row apply s':>14}")
    for r in results:
        print(f"{r['target']:10} {r['tables']:>6} {r['ready_s']:>8} {r['idle_core_pct']:>12} {r['one_row_applied_s']:>14}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    runs = [("before", json.loads(Path(args.before).read_text()))] if args.before else []
    plot([*runs, (args.label, results)], Path(args.png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
