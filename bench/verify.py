"""``headrace verify`` against the initial copy of the same rows: the issue's bound is verify ≤ 2× copy.

One table of ``--rows`` rows (bench/copy_methods.py's mixed types) on a throwaway server, copied by
``headrace run`` (streaming, left running) into ``--target``; the copy is timed from process start
until the table is STREAMING (Spark start, slot and snapshot included, as a user waits for it); then
``headrace verify --json`` is timed beside the running pipeline, once on the idle table and, with
``--under-load``, once while a writer updates random rows. Prints one markdown table and writes
``--json``. Needs free disk of about 3× the table for the lake and staging.

    PYTHONPATH=. .venv/bin/python bench/verify.py --rows 20000000 --target ducklake --json /tmp/verify.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from copy_methods import load_table, table_name  # noqa: E402
from harness import Headrace, write_config  # noqa: E402

from headrace.source.postgres.throwaway import ThrowawayPostgres  # noqa: E402


def _updates(dsn: str, rows: int, stop: threading.Event) -> None:
    """About 200 single-row updates a second, spread over the table."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            conn.execute(f"UPDATE {table_name(rows)} SET customer = customer + 1"
                         f" WHERE id = (random() * {rows})::bigint")
            time.sleep(0.005)


def _verify(config: Path) -> tuple[float, dict[str, Any]]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "headrace.cli", "verify", "-c", str(config), "--json",
                           "--wait", "1800"], capture_output=True, text=True, cwd=ROOT)
    seconds = time.monotonic() - started
    if done.returncode not in (0, 1):
        raise RuntimeError(f"verify exited with {done.returncode}: {done.stderr[-2000:]}")
    (result,) = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    return seconds, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--target", choices=["ducklake", "iceberg"], default="ducklake")
    parser.add_argument("--under-load", action="store_true")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-verify-") as tmp, ThrowawayPostgres() as server:
        work = Path(tmp)
        dsn = server.dsn
        _, load_s = load_table(dsn, args.rows)
        target = ({"ducklake": {"catalog": f"sqlite:{work / 'meta.sqlite'}", "data_path": str(work / "lake")}}
                  if args.target == "ducklake" else {"iceberg": {"warehouse": str(work / "warehouse")}})
        config = write_config(work, "bench_verify", dsn, {"tables": [f"public.{table_name(args.rows)}"]},
                              args.target, target=target)
        run = Headrace(config, work / "run.log")
        started = time.monotonic()
        run.start()
        try:
            run.wait_streaming(dsn, "bench_verify", 1)
            copy_s = time.monotonic() - started
            idle_s, idle = _verify(config)
            results: dict[str, Any] = {"rows": args.rows, "target": args.target, "load_s": load_s, "copy_s": copy_s,
                                       "verify_s": idle_s, "ratio": idle_s / copy_s, "status": idle["status"]}
            if args.under_load:
                stop = threading.Event()
                writer = threading.Thread(target=_updates, args=(dsn, args.rows, stop))
                writer.start()
                try:
                    load_verify_s, loaded = _verify(config)
                finally:
                    stop.set()
                    writer.join()
                results.update(verify_under_load_s=load_verify_s, under_load_status=loaded["status"],
                               under_load_ratio=load_verify_s / copy_s)
        finally:
            run.stop()
    print("| rows | target | copy s | verify s | verify / copy | status |")
    print("|---|---|---|---|---|---|")
    print(f"| {args.rows:,} | {args.target} | {copy_s:.1f} | {idle_s:.1f} | {idle_s / copy_s:.2f}× | {idle['status']} |")
    if args.under_load:
        print(f"| {args.rows:,} | {args.target} (under load) | {copy_s:.1f} | {results['verify_under_load_s']:.1f} |"
              f" {results['under_load_ratio']:.2f}× | {results['under_load_status']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
