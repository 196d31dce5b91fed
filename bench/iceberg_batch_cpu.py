"""Where a small Iceberg batch's CPU goes: JVM CPU per thread, jobs and stages per batch (issue 22).

``--batches`` driver-built batches of ``--size`` changes (60% updates, 25% inserts, 15% deletes,
random keys) are applied one after another (``apply_arrow_batch``) to a 2,000-row Iceberg table
(Hadoop catalog, ``local[2]``). Per batch: wall and CPU (driver + JVM), Spark jobs and stages
(``statusTracker``), and over the batches from ``--from`` on, the JVM's CPU by thread name
(``/proc/<jvm>/task/*``: JIT compilers, executor tasks, the py4j driver thread, Iceberg's pools) and
its child processes (Hadoop's ``chmod`` forks). ``--conf k=v`` and ``--prop k=v`` (repeatable) try a
Spark setting or an Iceberg table property. Copy-on-write batches are applied on the driver
(``driver_apply``); ``--spark-merge`` applies them with Spark's MERGE as before it.

    PYTHONPATH=. .venv/bin/python bench/iceberg_batch_cpu.py --batches 40 --from 20 [--prop write.delete.granularity=file]
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import driver_batch
from driver_batch import TABLE, stage
from harness import thread_cpu

from headrace.core.position import Position
from headrace.core.spark_types import ValueRules
from headrace.engines.driver.batch import read_driver_batch
from headrace.engines.spark.batch import read_change_batch
from headrace.engines.spark.session import build_session
from headrace.targets.iceberg import shapes as iceberg_target
from headrace.targets.iceberg.config import IcebergConfig
from headrace.targets.iceberg.session import iceberg_session_conf
from headrace.targets.iceberg.target import IcebergTarget

TICK = os.sysconf("SC_CLK_TCK")


def threads(pid: int) -> collections.Counter[str]:
    """CPU seconds so far of each thread of ``pid``, by name (digits folded: one line per kind)."""
    return collections.Counter({k.split("/", 1)[1]: v for k, v in thread_cpu([pid]).items()})


def process_cpu(pid: int) -> tuple[float, float]:
    """(own CPU seconds, waited-for children's CPU seconds) of ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK, (int(fields[13]) + int(fields[14])) / TICK


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--from", dest="start", type=int, default=20, help="per-thread CPU from this batch on")
    ap.add_argument("--size", type=int, default=100, help="changes per batch")
    ap.add_argument("--rows", type=int, default=2_000, help="rows in the table before the batches")
    ap.add_argument("--cow-below", type=int, default=100_000, help="target.iceberg.copy_on_write_below_rows"
                    " (0: merge-on-read at any size)")
    ap.add_argument("--conf", action="append", default=[], help="a Spark setting k=v")
    ap.add_argument("--prop", action="append", default=[], help="an Iceberg table property k=v")
    ap.add_argument("--spark-merge", action="store_true", help="copy-on-write batches through Spark's MERGE too")
    args = ap.parse_args()
    iceberg_target.TABLE_PROPERTIES.update(dict(p.split("=", 1) for p in args.prop))
    work = Path(tempfile.mkdtemp(prefix="headrace-iceberg-cpu-"))
    conf = dict(c.split("=", 1) for c in args.conf)
    spark = build_session("local[2]", conf=conf, target_conf=iceberg_session_conf({}, jdbc_driver=False))
    target = IcebergTarget(spark, IcebergConfig(warehouse=str(work / "wh"), catalog_name="bench",
                                                   copy_on_write_below_rows=args.cow_below), "bench")
    target.apply_on_driver = not args.spark_merge
    target.ensure_table(TABLE)
    rng = random.Random(1)
    driver_batch.ROWS = args.rows  # stage() draws updated and deleted keys from 1..ROWS
    seed, _ = stage(work / "seed.parquet", driver_batch.ROWS, 1, rng)
    target.apply_batch(TABLE, read_change_batch(spark, [seed], TABLE, None).changes, None, 1)
    rules = ValueRules("public.bench", "stop", keep_infinity=target.keeps_infinity)
    sc = spark.sparkContext
    tracker, jvm = sc.statusTracker(), sc._gateway.proc.pid  # type: ignore[union-attr]
    walls, cpus, jobs, stages = [], [], [], []
    before_threads, before_proc = threads(jvm), process_cpu(jvm)
    for i in range(args.batches):
        file, facts = stage(work / f"b{i}.parquet", args.size, 10 + i, rng)
        batch = read_driver_batch([file], TABLE, Position(0, 0), rules, [facts])
        if i == args.start:
            before_threads, before_proc = threads(jvm), process_cpu(jvm)
        sc.setJobGroup(f"b{i}", f"batch {i}")
        started, cpu = time.perf_counter(), process_cpu(jvm)[0] + time.process_time()
        target.apply_arrow_batch(TABLE, batch.changes, None, i)  # type: ignore[arg-type]
        walls.append(time.perf_counter() - started)
        cpus.append(process_cpu(jvm)[0] + time.process_time() - cpu)
        time.sleep(0.05)  # the listener bus registers the batch's jobs
        ids = tracker.getJobIdsForGroup(f"b{i}")
        jobs.append(len(ids))
        stages.append(sum(len(info.stageIds) for j in ids if (info := tracker.getJobInfo(j)) is not None))
    n = args.batches - args.start
    by_thread = threads(jvm)
    by_thread.subtract(before_threads)
    own, children = (b - a for a, b in zip(before_proc, process_cpu(jvm), strict=True))
    files = target.table_files(TABLE)
    print(f"conf {conf} props {args.prop}; batches by lane {dict(target.apply_lanes.counts)}")
    print(f"median wall {statistics.median(walls[args.start:]):.3f} s, CPU {statistics.median(cpus[args.start:]):.3f} s"
          f" (batches {args.start}-{args.batches - 1}); jobs {statistics.median(jobs)}, stages {statistics.median(stages)}")
    windows = [f"{w}-{min(w + 20, args.batches) - 1}: {statistics.median(cpus[w:w + 20]):.2f}"
               for w in range(0, args.batches, 20)]
    print(f"median CPU by 20 batches (driver + JVM, s): {', '.join(windows)}")
    print(f"JVM CPU per batch {own / n:.3f} s, child processes {children / n:.3f} s; by thread:")
    for name, seconds in by_thread.most_common(10):
        print(f"  {name:18} {seconds / n:.3f} s")
    print(f"after: {files}")
    spark.stop()


if __name__ == "__main__":
    main()
