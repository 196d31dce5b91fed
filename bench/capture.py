"""Capture alone: a fixed WAL backlog streamed through headrace's capture into staged files (no Spark,
no apply), beside `pg_recvlogical` draining the same WAL in the same run.

1. ``--tables`` tables are seeded (``backlog.seed``), the pipeline is set up (publication, slot, state;
   no copy: capture stages changes whatever the table's state) and `pg_recvlogical`'s slot is made at
   the same point.
2. ``--changes`` mixed changes are written (``backlog.write_backlog``: 60% update, 25% insert, 15%
   delete, transactions of ``--txn-changes``).
3. ``Capture.run`` drains the slot in a thread of this process until its registered position passes
   the backlog's end: wall seconds, this process's CPU seconds (capture is the only thing it runs then),
   changes/s and CPU microseconds per change. ``--profile`` runs it under cProfile and prints the top
   functions. ``--repeat`` drains the same WAL again (the slot is rewound by a fresh pipeline name).
4. `pg_recvlogical` reads the same WAL to /dev/null.

    PYTHONPATH=. .venv/bin/python bench/capture.py --changes 1000000
    PYTHONPATH=. .venv/bin/python bench/capture.py --changes 200000 --profile
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import resource
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from backlog import recvlogical, seed, write_backlog
from harness import ROOT, insert_lsn, load_average

from headrace.capture.loop import Capture  # noqa: E402
from headrace.config import PipelineConfig, parse_config  # noqa: E402
from headrace.pipeline import Pipeline  # noqa: E402
from headrace.source.postgres.throwaway import ThrowawayPostgres  # noqa: E402

REF_SLOT = "bench_recvlogical"  # backlog.recvlogical reads this slot
PUBLICATION = "bench_capture"


def _config(dsn: str, work: Path, name: str) -> PipelineConfig:
    """A DuckLake pipeline (never opened: capture alone needs no target) over schema ``backlog``."""
    return parse_config({
        "name": name, "source": {"dsn": dsn, "schemas": ["backlog"], "publication": PUBLICATION},
        "target": {"ducklake": {"catalog": str(work / "lake.ducklake"), "data_path": str(work / "lake")}},
        "staging": {"path": str(work / "staging")},
    })


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def drain(config: PipelineConfig, dsn: str, end_lsn: int, profile: bool) -> dict[str, Any]:
    """Capture the slot of ``config`` until its registered position reaches ``end_lsn``."""
    state = Pipeline(config).setup()
    schemas = {r.oid: r.schema for r in state.tables()}
    state.close()
    capture = Capture(config, dsn, dsn, schemas)
    stop = threading.Event()
    profiler = cProfile.Profile() if profile else None

    def run() -> None:
        if profiler is not None:
            profiler.enable()
        try:
            capture.run(stop)
        finally:
            if profiler is not None:
                profiler.disable()

    thread = threading.Thread(target=run, name="capture")
    cpu0, t0 = _cpu(), time.monotonic()
    thread.start()
    received = -1
    while capture.captured_lsn < end_lsn:
        if not thread.is_alive():
            raise RuntimeError(f"capture stopped: {capture.last_error}")
        if capture.received_lsn == received:
            # Nothing more read since the last look: the backlog is drained, and the position passes
            # end_lsn once a heartbeat written after it comes back. Not asked sooner: each one is a
            # commit on the source that would be counted as capture's time.
            capture.request_heartbeat()
        received = capture.received_lsn
        time.sleep(0.05)
    seconds, cpu = time.monotonic() - t0, _cpu() - cpu0
    stop.set()
    thread.join(60)
    rows = sum(capture.changes_captured.values())
    out: dict[str, Any] = {"seconds": round(seconds, 2), "cpu_s": round(cpu, 2), "changes": rows,
                           "changes_per_s": round(rows / seconds), "cpu_us_per_change": round(1e6 * cpu / rows, 2)}
    if profiler is not None:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
        out["profile"] = text.getvalue()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--changes", type=int, default=1_000_000)
    ap.add_argument("--tables", type=int, default=4)
    ap.add_argument("--seed-rows", type=int, default=100_000, help="rows per table before the backlog")
    ap.add_argument("--txn-changes", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=1, help="drains of the same WAL (a fresh slot each)")
    ap.add_argument("--profile", action="store_true", help="cProfile the drain (slower; read its shares)")
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="headrace-capture-"))
    results: dict[str, Any] = {"tables": args.tables, "txn_changes": args.txn_changes, "load_avg": load_average()}
    try:
        with ThrowawayPostgres() as server:
            seed(server.dsn, args.tables, args.seed_rows)
            configs = [_config(server.dsn, work / f"c{i}", f"capture_{i}") for i in range(args.repeat)]
            for config in configs:  # every slot before the backlog: each drain reads all of it
                Pipeline(config).setup().close()
            with psycopg.connect(server.dsn, autocommit=True) as conn:
                conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (REF_SLOT,))
            changes = write_backlog(server.dsn, args.tables, args.seed_rows, args.changes, args.txn_changes)
            with psycopg.connect(server.dsn) as conn:
                end_lsn = insert_lsn(conn)
                wal = conn.execute("SELECT pg_current_wal_insert_lsn() - confirmed_flush_lsn FROM pg_replication_slots"
                                   " WHERE slot_name = %s", (REF_SLOT,)).fetchone()
            results.update(changes=changes, wal_mib=round(float(wal[0]) / 2**20, 1) if wal else None)
            print(f"backlog: {changes} changes, {results['wal_mib']} MiB of WAL", flush=True)
            runs = []
            for config in configs:
                run = drain(config, server.dsn, end_lsn, args.profile)
                profile = run.pop("profile", None)
                print(json.dumps(run), flush=True)
                if profile:
                    print(profile, flush=True)
                runs.append(run)
            reference = recvlogical(server.dsn, PUBLICATION, end_lsn)
            results.update(capture=runs, pg_recvlogical_s=round(reference, 2),
                           pg_recvlogical_changes_per_s=round(changes / reference))
            for run in runs:
                run["ratio_vs_pg_recvlogical"] = round(reference / run["seconds"], 3)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(results, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
