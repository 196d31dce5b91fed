"""What a Spark-built batch costs (``engine: spark``): Spark jobs, stages and tasks, wall and CPU (issue 36).

``--batches`` batches of ``--files`` staged files of ``--size`` changes each (60% updates, 25%
inserts, 15% deletes, random keys; ``bench/driver_batch.py``'s table) are built by
``read_change_batch`` and collected to Arrow, as ``materialize.apply.collected`` does for a small
batch, alternately as one partition (``ONE_TASK_ROWS`` above the batch: the default for a batch of
up to 50,000 staged rows) and shuffled by key (``ONE_TASK_ROWS`` 0: bigger batches), in one
``local[2]`` session. Per batch: Spark jobs, stages and tasks (``statusTracker``), wall, the lazy
build's wall (the DataFrame steps, each an analysis on the driver), and CPU (driver + JVM); medians
from ``--from`` on (the JVM's JIT warms over the first batches).

    PYTHONPATH=. .venv/bin/python bench/spark_batch_cpu.py --batches 80 --from 40 --size 500 --files 3
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import driver_batch
from driver_batch import TABLE, stage
from iceberg_batch_cpu import process_cpu

from headrace.core.position import Position
from headrace.core.spark_types import ValueRules
from headrace.engines.spark import batch as spark_batch
from headrace.engines.spark.arrow import to_arrow
from headrace.engines.spark.session import build_session

PLANS = {"one partition": 10**12, "shuffled": 0}  # ONE_TASK_ROWS for each


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=80)
    ap.add_argument("--from", dest="start", type=int, default=40, help="medians from this batch on")
    ap.add_argument("--size", type=int, default=500, help="changes per staged file")
    ap.add_argument("--files", type=int, default=3, help="staged files per batch")
    args = ap.parse_args()
    spark = build_session("local[2]")
    work = Path(tempfile.mkdtemp(prefix="headrace-spark-batch-"))
    rng = random.Random(1)
    driver_batch.ROWS = 100_000  # stage() draws updated and deleted keys from 1..ROWS
    rules = ValueRules("public.bench", "stop", keep_infinity=True)
    sc = spark.sparkContext
    tracker, jvm = sc.statusTracker(), sc._gateway.proc.pid  # type: ignore[union-attr]
    seen: dict[str, dict[str, list[float]]] = {plan: {} for plan in PLANS}
    for i in range(args.batches):
        plan = list(PLANS)[i % len(PLANS)]
        spark_batch.ONE_TASK_ROWS = PLANS[plan]
        staged = [stage(work / f"b{i}-{f}.parquet", args.size, 10 + i * args.files + f, rng) for f in range(args.files)]
        sc.setJobGroup(f"b{i}", plan)
        started, cpu = time.perf_counter(), process_cpu(jvm)[0] + time.process_time()
        batch = spark_batch.read_change_batch(spark, [p for p, _ in staged], TABLE, Position(0, 0), rules,
                                              facts=[f for _, f in staged])
        lazy = time.perf_counter() - started
        rows = to_arrow(batch.changes).num_rows
        figures = {"wall_s": time.perf_counter() - started, "lazy_build_s": lazy,
                   "cpu_s": process_cpu(jvm)[0] + time.process_time() - cpu, "rows_out": rows}
        time.sleep(0.05)  # the listener bus registers the batch's jobs
        jobs = [info for j in tracker.getJobIdsForGroup(f"b{i}") if (info := tracker.getJobInfo(j)) is not None]
        stages = [info for j in jobs for s in j.stageIds if (info := tracker.getStageInfo(s)) is not None]
        figures.update(jobs=len(jobs), stages=len(stages), tasks=sum(s.numTasks for s in stages))
        if i >= args.start:
            for name, value in figures.items():
                seen[plan].setdefault(name, []).append(value)
    print(f"{args.files} files x {args.size} changes a batch, batches {args.start}-{args.batches - 1} (median):")
    for plan, figures in seen.items():
        print(f"  {plan:14}", "  ".join(f"{n} {statistics.median(v):.3f}" for n, v in figures.items()))
    spark.stop()


if __name__ == "__main__":
    main()
