"""Backlog drain: `headrace run --until-caught-up` over a backlog of mixed changes, end to end, beside
`pg_recvlogical` draining the same WAL (and dlt's pg_replication source, when given).

1. ``--tables`` tables are seeded; for each ``--batch-files`` value a pipeline is started until every
   table is STREAMING and stopped (its slot now waits); `pg_recvlogical`'s slot (pgoutput, the same
   publication) is created at the same point, and dlt's when ``--dlt-sources`` is given.
2. The backlog is written while nothing runs: ``--changes`` mixed changes (60% update, 25% insert,
   15% delete; transactions of ``--txn-changes``, round robin over the tables).
3. Each pipeline drains it with `headrace run --until-caught-up`, timed from process start to exit
   (Spark's start-up included), one after another; then `pg_recvlogical` reads the same WAL to
   /dev/null up to the backlog's end; then dlt (``--dlt-python``, a Python with dlt[duckdb,parquet],
   sqlalchemy and psycopg2-binary; ``--dlt-sources``, a checkout of github.com/dlt-hub/verified-sources: its
   ``sources`` folder goes on dlt's PYTHONPATH, nothing of it is copied here) loads the same slot
   range into DuckDB as shipped and tuned (the whole backlog in one batch, Parquet load files).

``--batch-files`` sets ``apply.max_batch_files`` (staged files per table per apply batch): the plot
shows changes/s against the mean rows per apply batch, read from the ``apply.batch`` events.

    .venv/bin/python bench/backlog.py --smoke
    .venv/bin/python bench/backlog.py --changes 5000000 --targets iceberg,ducklake --batch-files 2,8,200
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from dlt_peer import dlt_drain, dlt_prepare
from harness import (
    ROOT,
    Headrace,
    compare_with_source,
    cpu_seconds,
    insert_lsn,
    load_average,
    parse_ts,
    pyplot,
    save_figure,
    tree_pids,
    write_config,
)

from headrace.core.position import format_lsn  # noqa: E402
from headrace.source.postgres.throwaway import ThrowawayPostgres, find_server_bin  # noqa: E402

REF_SLOT = "bench_recvlogical"
REF_SLOT_FIRST = "bench_recvlogical_first"  # drained before headrace's drains


class CodeAt(Headrace):
    """``headrace run`` from another checkout (``--compare-root``): the same backlog drained by the
    code before a change, in the same run, for a paired before/after on a shared machine."""

    def __init__(self, config: Path, log: Path, root: Path) -> None:
        super().__init__(config, log)
        self.root = root

    def start(self, *args: str) -> None:
        env = {**os.environ, "HEADRACE_LOG_FORMAT": "json", "PYTHONPATH": str(self.root)}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "headrace.cli", "run", "-c", str(self.config), *args],
                                         stdout=out, stderr=out, start_new_session=True, cwd=self.root, env=env)


def seed(dsn: str, tables: int, rows: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS backlog CASCADE")
        conn.execute("CREATE SCHEMA backlog")
        for i in range(tables):
            conn.execute(f"CREATE TABLE backlog.t{i} (id bigint PRIMARY KEY, v int NOT NULL, note text,"
                         " at timestamptz NOT NULL DEFAULT now())")
            conn.execute(f"INSERT INTO backlog.t{i} (id, v, note) SELECT g, 0, md5(g::text)"
                         f" FROM generate_series(1, {rows}) g")


def write_backlog(dsn: str, tables: int, seeded: int, changes: int, txn_changes: int) -> int:
    """``changes`` mixed changes in set-based transactions; returns the exact count (row counts)."""
    n_up, n_del = round(txn_changes * 0.6), round(txn_changes * 0.15)
    n_ins = txn_changes - n_up - n_del
    low, high = [1] * tables, [seeded + 1] * tables  # each table's live ids: [low, high)
    cursor = [1] * tables  # where the next block of updates starts
    done = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        k = 0
        while done < changes:
            i = k % tables
            k += 1
            if cursor[i] + n_up > high[i]:
                cursor[i] = low[i]
            with conn.transaction():
                done += conn.execute(f"UPDATE backlog.t{i} SET v = v + 1, note = md5(random()::text)"
                                     " WHERE id >= %s AND id < %s", (cursor[i], cursor[i] + n_up)).rowcount
                done += conn.execute(f"INSERT INTO backlog.t{i} (id, v, note) SELECT g, 1, 'new'"
                                     " FROM generate_series(%s::bigint, %s) g", (high[i], high[i] + n_ins - 1)).rowcount
                done += conn.execute(f"DELETE FROM backlog.t{i} WHERE id >= %s AND id < %s",
                                     (low[i], low[i] + n_del)).rowcount
            cursor[i] += n_up
            high[i] += n_ins
            low[i] += n_del
    return done


STATEMENT_KINDS = "iiuiuiiuid"  # 60% inserts, 30% updates, 10% deletes, as issue 37 measured them


def write_statements(dsn: str, tables: int, seeded: int, changes: int, rows: int) -> int:
    """``changes`` changes as transactions of one set-based statement of ``rows`` rows each (the batch
    jobs' shape: 60% inserts, 30% updates, 10% deletes by statement), round robin over the tables;
    returns the exact count."""
    low, high = [1] * tables, [seeded + 1] * tables
    cursor = [1] * tables
    done = k = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        while done < changes:
            i, kind = k % tables, STATEMENT_KINDS[(k // tables) % len(STATEMENT_KINDS)]
            k += 1
            if kind == "i":
                done += conn.execute(f"INSERT INTO backlog.t{i} (id, v, note) SELECT g, 1, md5(g::text)"
                                     " FROM generate_series(%s::bigint, %s) g", (high[i], high[i] + rows - 1)).rowcount
                high[i] += rows
            elif kind == "u":
                if cursor[i] + rows > high[i]:
                    cursor[i] = low[i]
                done += conn.execute(f"UPDATE backlog.t{i} SET v = v + 1, note = md5(random()::text)"
                                     " WHERE id >= %s AND id < %s", (cursor[i], cursor[i] + rows)).rowcount
                cursor[i] += rows
            else:
                done += conn.execute(f"DELETE FROM backlog.t{i} WHERE id >= %s AND id < %s",
                                     (low[i], low[i] + rows)).rowcount
                low[i] += rows
                cursor[i] = max(cursor[i], low[i])
    return done


def drain(headrace: Headrace) -> tuple[float, float, float]:
    """`headrace run --until-caught-up`: seconds from process start to its exit; of those, the
    start-up until its ``run.start`` event (imports, state checks; Spark's JVM starts after it, so the
    first apply batch's time is reported too); and the CPU seconds the process and its JVM used,
    sampled every 0.2 s (on a shared machine the figure other runs' load changes least)."""
    started, wall = time.monotonic(), time.time()
    headrace.start("--until-caught-up")
    used: dict[int, float] = {}
    assert headrace.proc is not None
    while headrace.proc.poll() is None and time.monotonic() - started < 7200:
        for pid, seconds in cpu_seconds(tree_pids(headrace.pid)).items():
            used[pid] = max(used.get(pid, 0.0), seconds)
        time.sleep(0.2)
    code = headrace.wait(60)
    if code != 0:
        raise RuntimeError(f"headrace run --until-caught-up exited with {code}: see {headrace.log}")
    run_start = [parse_ts(e["ts"]) for e in headrace.events("run.start") if parse_ts(e["ts"]) >= wall]
    return time.monotonic() - started, (run_start[0] - wall) if run_start else float("nan"), sum(used.values())


def recvlogical(dsn: str, publication: str, end_lsn: int, slot: str = REF_SLOT) -> float:
    """pg_recvlogical draining the reference ``slot`` up to ``end_lsn`` to /dev/null; seconds."""
    started = time.monotonic()
    subprocess.run([find_server_bin("pg_recvlogical"), "-d", dsn, "--slot", slot, "--start",
                    "-o", "proto_version=1", "-o", f"publication_names={publication}",
                    "-E", format_lsn(end_lsn), "-f", "/dev/null", "--no-loop"],
                   check=True, capture_output=True, timeout=7200)
    return time.monotonic() - started


def plot(runs: list[dict[str, Any]], reference: float, dlt: dict[str, Any], png: Path) -> None:
    """changes/s against mean rows per apply batch, one line per target; pg_recvlogical and dlt's
    variants as horizontal lines."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for kind, code in sorted({(r["target"], r["code"]) for r in runs}):
        rs = sorted((r for r in runs if (r["target"], r["code"]) == (kind, code)), key=lambda r: r["rows_per_batch"])
        label = kind if code == "new" else f"{kind}, {code}"
        ax.plot([r["rows_per_batch"] for r in rs], [r["changes_per_s"] for r in rs], marker="o", label=label)
        for r in rs:
            ax.annotate(f"{r['max_batch_files']} files", (r["rows_per_batch"], r["changes_per_s"]),
                        textcoords="offset points", xytext=(5, -10), fontsize=7)
    ax.axhline(reference, ls="--", color="grey", label="pg_recvlogical, same WAL")
    for (variant, r), style in zip(dlt.items(), (":", "-."), strict=False):
        if "changes_per_s" in r:
            ax.axhline(r["changes_per_s"], ls=style, color="tab:red", label=f"dlt pg_replication, {variant}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("mean changes per apply batch (apply.max_batch_files as the knob)")
    ax.set_ylabel("changes/s, end to end")
    ax.set_title(f"draining a backlog of {runs[0]['changes']:,} changes", fontsize=10)
    save_figure(fig, png, ax)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="50K changes into 2 tables, DuckLake only")
    ap.add_argument("--changes", type=int, default=5_000_000)
    ap.add_argument("--tables", type=int, default=4)
    ap.add_argument("--seed-rows", type=int, default=100_000, help="rows per table before the backlog")
    ap.add_argument("--txn-changes", type=int, default=1000)
    ap.add_argument("--statement-rows", type=int, default=0,
                    help="the batch-job shape instead: transactions of one statement of this many rows"
                         " (60%% inserts, 30%% updates, 10%% deletes); 5000 is issue 37's")
    ap.add_argument("--targets", default="iceberg,ducklake")
    ap.add_argument("--batch-files", default="200", help="apply.max_batch_files values, comma list")
    ap.add_argument("--dlt-python", help="a Python with dlt[duckdb,parquet], sqlalchemy and psycopg2-binary")
    ap.add_argument("--dlt-sources", help="the sources/ folder of a dlt-hub/verified-sources checkout")
    ap.add_argument("--dlt-variants", default="shipped,tuned",
                    help="dlt variants to run, comma list (shipped takes ~25 min at 5M changes: tuned alone then)")
    ap.add_argument("--compare-root", help="another checkout of headrace (the code before a change): each"
                    " target is drained by it too, same backlog, right after this checkout's drain")
    ap.add_argument("--apply", default="{}", help="extra apply settings for every pipeline, JSON")
    ap.add_argument("--spark-conf", default="{}", help="spark.conf entries for every pipeline, JSON")
    ap.add_argument("--json", default=str(ROOT / "docs" / "backlog.json"))
    ap.add_argument("--png", default=str(ROOT / "docs" / "img" / "backlog.png"))
    args = ap.parse_args()
    if args.smoke:
        args.changes, args.tables, args.seed_rows = 50_000, 2, 10_000
    work = Path(tempfile.mkdtemp(prefix="headrace-backlog-"))
    codes: list[tuple[str, Path | None]] = [("new", None)]
    if args.compare_root:
        codes.append(("before", Path(args.compare_root).resolve()))
    pipelines = [(kind, int(files), code, root) for kind in args.targets.split(",")
                 for files in args.batch_files.split(",") for code, root in codes]
    results: dict[str, Any] = {"tables": args.tables, "txn_changes": args.txn_changes,
                               "statement_rows": args.statement_rows}
    with ThrowawayPostgres() as server:
        seed(server.dsn, args.tables, args.seed_rows)
        runners = []
        for kind, files, code, root in pipelines:
            name = f"backlog_{kind}_{files}" + ("" if root is None else f"_{code}")
            folder = work / name
            folder.mkdir()
            config = write_config(folder, name, server.dsn, {"schemas": ["backlog"], "publication": "bench_backlog"},
                                  kind, apply={"max_batch_files": files, **json.loads(args.apply)},
                                  spark={"conf": json.loads(args.spark_conf)})
            log = folder / "headrace.log"
            headrace = Headrace(config, log) if root is None else CodeAt(config, log, root)
            headrace.start()
            headrace.wait_streaming(server.dsn, name, args.tables)
            headrace.stop()
            runners.append((kind, files, code, headrace))
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            for slot in (REF_SLOT, REF_SLOT_FIRST):
                conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        variants = args.dlt_variants.split(",")
        dlt = (dlt_prepare(args.dlt_python, args.dlt_sources, server.dsn, work, args.tables, variants)
               if args.dlt_python else None)
        started = time.monotonic()
        changes = (write_statements(server.dsn, args.tables, args.seed_rows, args.changes, args.statement_rows)
                   if args.statement_rows else
                   write_backlog(server.dsn, args.tables, args.seed_rows, args.changes, args.txn_changes))
        with psycopg.connect(server.dsn) as conn:
            end_lsn = insert_lsn(conn)
        results.update(changes=changes, write_s=round(time.monotonic() - started, 1))
        print(f"backlog: {changes} changes written in {results['write_s']} s", flush=True)
        # The reference drains the WAL twice: right after it was written (its pages most likely still
        # in memory) and after every headrace drain (as before). The faster one counts: a VM reclaiming
        # cold page cache (DAMON here) made the late drain 2.3x slower than the early one can be.
        first = recvlogical(server.dsn, "bench_backlog", end_lsn, REF_SLOT_FIRST)
        runs = []
        for kind, files, code, headrace in runners:
            load = load_average()
            since = time.time()
            seconds, startup, cpu_s = drain(headrace)
            batches = [b for b in headrace.batches() if b.at >= since and b.table.startswith("backlog.")]
            rows = sum(b.rows for b in batches)
            matches = compare_with_source(headrace.config, server.dsn, {f"backlog.t{i}": "count(*), sum(v), sum(id)"
                                                                        for i in range(args.tables)})
            flushes = [parse_ts(e["ts"]) for e in headrace.events("capture.flush") if parse_ts(e["ts"]) >= since]
            run = {"target": kind, "code": code, "max_batch_files": files, "changes": changes,
                   "seconds": round(seconds, 1), "cpu_s": round(cpu_s, 1),
                   "startup_s": round(startup, 1),  # until run.start (Spark starts after it)
                   "first_batch_s": round(batches[0].at - since, 1) if batches else None,
                   # capture's last flush: the backlog all staged (apply overlaps it when batches land before)
                   "staged_all_s": round(max(flushes) - since, 1) if flushes else None,
                   "changes_per_s": round(changes / seconds), "apply_batches": len(batches),
                   "rows_per_batch": round(rows / max(1, len(batches))), "load_avg_before": load,
                   "target_equals_source": all(m["equal"] for m in matches.values())}
            print(json.dumps(run), flush=True)
            runs.append(run)
        last = recvlogical(server.dsn, "bench_backlog", end_lsn)
        reference = min(first, last)
        results["pg_recvlogical_first_s"], results["pg_recvlogical_last_s"] = round(first, 2), round(last, 2)
        results["pg_recvlogical_s"] = round(reference, 2)
        results["pg_recvlogical_changes_per_s"] = round(changes / reference)
        for run in runs:
            run["ratio_vs_pg_recvlogical"] = round(reference / run["seconds"], 3)
        results["headrace"] = runs
        if dlt is not None:
            results["dlt"] = dlt_drain(dlt, changes, variants)
    Path(args.json).write_text(json.dumps(results, indent=1))
    plot(runs, results["pg_recvlogical_changes_per_s"], results.get("dlt", {}), Path(args.png))
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
