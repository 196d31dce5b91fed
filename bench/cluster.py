"""Local mode against a standalone cluster with the same cores, in one run: the copy and a backlog's drain.

A throwaway PostgreSQL and a Spark standalone master with one worker of ``--cores`` cores (pyspark's
own ``bin/spark-class``, ``headrace.engines.spark.standalone``) on this machine. For each Spark master
(``local[N]``, then the cluster) and each ``--engines`` value, a fresh pipeline into Iceberg:

1. copies ``--rows`` rows (``headrace run --until-caught-up``, timed from process start to exit);
2. is stopped while ``--changes`` mixed changes are written (statements of ``--txn-changes`` rows:
   60% updates, 25% inserts, 15% deletes);
3. drains them (``headrace run --until-caught-up``, timed), and the target is compared with the source.

The ratio cluster / local of each rate is the figure (issue 36's goal: at least 0.7x), with the lanes
each run's batches took (``apply.batch`` events) and the tasks the executors finished.

    .venv/bin/python bench/cluster.py --smoke
    .venv/bin/python bench/cluster.py --rows 5000000 --changes 1000000
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from backlog import drain, write_backlog
from harness import Headrace, compare_with_source, parse_ts, pyplot, save_figure, write_config

from headrace.engines.spark.standalone import ThrowawaySparkCluster
from headrace.source.postgres.throwaway import ThrowawayPostgres  # noqa: E402

TABLE = "backlog.t0"


def seed(dsn: str, rows: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS backlog CASCADE")
        conn.execute("CREATE SCHEMA backlog")
        conn.execute(f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, v int NOT NULL, note text,"
                     " at timestamptz NOT NULL DEFAULT now())")
        conn.execute(f"INSERT INTO {TABLE} (id, v, note) SELECT g, 0, md5(g::text) FROM generate_series(1, {rows}) g")
        conn.execute(f"VACUUM ANALYZE {TABLE}")


def lanes(headrace: Headrace, since: float) -> dict[str, int]:
    """Batches by (build lane, apply lane), from the run's ``apply.batch`` events after ``since``."""
    counts: collections.Counter[str] = collections.Counter()
    for e in headrace.events("apply.batch"):
        if e.get("build_lane") and parse_ts(e["ts"]) >= since:
            counts[f"{e['build_lane']}/{e['apply_lane']}"] += 1
    return dict(counts)


def measure(dsn: str, work: Path, master: str, engine: str, args: argparse.Namespace,
            cluster: ThrowawaySparkCluster) -> dict[str, Any]:
    name = f"c{int(time.time() * 1000) % 10_000_000}"
    run_dir = work / name
    run_dir.mkdir()
    seed(dsn, args.rows)
    conf = {"spark.cores.max": str(args.cores), "spark.executor.memory": "2g"} if master.startswith("spark:") else {}
    config = write_config(run_dir, name, dsn, {"tables": [TABLE]}, "iceberg",
                          spark={"master": master, "conf": conf})
    if engine != "auto":
        text = config.read_text()
        config.write_text(f"engine: {engine}\n{text}")
    headrace = Headrace(config, run_dir / "run.log")
    tasks_before = cluster.executor_tasks()
    copy_s, _, copy_cpu = drain(headrace)
    tasks_copy = cluster.executor_tasks() - tasks_before
    written = write_backlog(dsn, 1, args.rows, args.changes, args.txn_changes)
    wall = time.time()
    drain_s, _, drain_cpu = drain(headrace)
    tasks_drain = cluster.executor_tasks() - tasks_before - tasks_copy
    checks = compare_with_source(config, dsn, {TABLE: "count(*), sum(v), sum(id)"})
    result = {"master": master, "engine": engine, "rows": args.rows, "changes": written,
              "copy_s": round(copy_s, 2), "copy_rows_per_s": round(args.rows / copy_s),
              "copy_cpu_s": round(copy_cpu, 1), "drain_s": round(drain_s, 2),
              "drain_changes_per_s": round(written / drain_s), "drain_cpu_s": round(drain_cpu, 1),
              "executor_tasks_copy": tasks_copy, "executor_tasks_drain": tasks_drain,
              "lanes_drain": lanes(headrace, wall), "equal": all(c["equal"] for c in checks.values())}
    print(json.dumps(result), flush=True)
    return result


def plot(results: list[dict[str, Any]], png: Path) -> None:
    plt = pyplot()
    fig, (copy_ax, drain_ax) = plt.subplots(1, 2, figsize=(10, 4))
    labels = [f"{'cluster' if r['master'].startswith('spark:') else r['master']}\nengine: {r['engine']}"
              for r in results]
    copy_ax.bar(labels, [r["copy_rows_per_s"] / 1000 for r in results], color="#4c78a8")
    copy_ax.set_title(f"copy of {results[0]['rows']:,} rows")
    copy_ax.set_ylabel("thousand rows/s")
    drain_ax.bar(labels, [r["drain_changes_per_s"] / 1000 for r in results], color="#f58518")
    drain_ax.set_title(f"drain of {results[0]['changes']:,} changes")
    drain_ax.set_ylabel("thousand changes/s")
    save_figure(fig, png, copy_ax, drain_ax, legend=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--txn-changes", type=int, default=5_000)
    parser.add_argument("--cores", type=int, default=2, help="local[N] and the worker's cores")
    parser.add_argument("--engines", default="auto,spark", help="engine settings to run, comma-separated")
    parser.add_argument("--smoke", action="store_true", help="200,000 rows, 50,000 changes")
    parser.add_argument("--png", type=Path, default=Path(__file__).parent.parent / "docs" / "img" / "cluster.png")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--replot", type=Path, help="only redraw --png from a --json file")
    args = parser.parse_args()
    if args.replot:
        plot(json.loads(args.replot.read_text()), args.png)
        return 0
    if args.smoke:
        args.rows, args.changes = 200_000, 50_000
    work = Path(tempfile.mkdtemp(prefix="headrace-cluster-bench-"))
    work.chmod(0o755)
    pg = ThrowawayPostgres(base_dir=str(work)).start()
    cluster = ThrowawaySparkCluster(work / "spark").start()
    results = []
    try:
        for engine in args.engines.split(","):
            for master in (f"local[{args.cores}]", cluster.url):
                results.append(measure(pg.dsn, work, master, engine, args, cluster))
    finally:
        cluster.stop()
        pg.stop()
    for engine in args.engines.split(","):
        local, remote = [r for r in results if r["engine"] == engine]
        print(f"engine {engine}: cluster/local copy {remote['copy_rows_per_s'] / local['copy_rows_per_s']:.2f}x,"
              f" drain {remote['drain_changes_per_s'] / local['drain_changes_per_s']:.2f}x")
    (args.json or work / "cluster.json").write_text(json.dumps(results, indent=1))
    plot(results, args.png)
    return 0 if all(r["equal"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
