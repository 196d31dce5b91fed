"""Initial copy throughput: headrace into Iceberg and DuckLake vs raw COPY and dlt, at several sizes.

For each of ``--rows`` (e.g. ``5000000,20000000,50000000``) a table of that many rows (mixed types,
about 114 bytes a row) is loaded on one throwaway server and copied, in the same run, by:
  1. raw ``COPY ... TO STDOUT (FORMAT binary)`` read by psql into /dev/null: the physical limit
     (before and after the others; the faster is the reference);
  2. the chunk read alone, the whole table as one chunk in this process, CSV and binary (smallest
     size only: a per-row cost, and the binary read holds the whole table in memory);
  3. ``headrace run --until-caught-up`` into Iceberg and into DuckLake at each ``--spark-masters``
     (process start, Spark start, slot and snapshot included: what a user waits for), with the binary
     read and, with ``--csv``, the CSV read too; rows read back by DuckDB;
  4. dlt's ``sql_database`` into DuckDB with its pyarrow and its connectorx backends (its own
     virtualenv, bench/.venv-dlt; settings in bench/dlt_copy.py); rows read back.
A markdown table per size (seconds, rows/s, MB/s, ratio to raw COPY) is printed, the results go to
``--json``, and a plot (rows/s per method per size, and headrace by Spark cores) to ``--png``. Each
size's table and outputs are removed once measured; the disk is checked before anything is loaded.

With ``--small-tables N`` it also (after the sizes, on the same server; alone when ``--rows`` is not
given) times a schema of N tables of ``--small-rows`` rows each: from process start until every table
is STREAMING (``run --until-caught-up``), per target, at the last of ``--spark-masters``, with a
breakdown from the run's JSON log events (bench/copy_small_tables.py).

    PYTHONPATH=. .venv/bin/python bench/initial_copy.py --rows 5M,20M,50M --small-tables 200 \
        --spark-masters 'local[1],local[2]' --json /tmp/initial_copy.json --png docs/img/initial_copy.png
    PYTHONPATH=. .venv/bin/python bench/initial_copy.py --small-tables 200 [--targets ducklake]
    PYTHONPATH=. .venv/bin/python bench/initial_copy.py --replot /tmp/initial_copy.json --png docs/img/initial_copy.png
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from copy_methods import (  # noqa: E402
    MethodFailed,
    check_disk,
    chunk_reads,
    dlt_copy,
    dlt_python,
    drop_table,
    headrace_copy,
    load_table,
    raw_copy,
)
from copy_report import ASSUMED, SizeResult, estimate_s, from_json, learn_rates, markdown, plot  # noqa: E402
from copy_small_tables import load_small_tables, small_markdown, small_tables  # noqa: E402

from headrace.source.postgres.throwaway import ThrowawayPostgres  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", help="table sizes, comma-separated: 5000000,20000000,50000000 or "
                        "5M,20M,50M (default 5M, none with --small-tables alone)")
    parser.add_argument("--spark-masters", default="local[*]",
                        help="headrace's spark.master for each copy, comma-separated: local[1],local[2]; "
                        "the small tables run at the last")
    parser.add_argument("--targets", default="iceberg,ducklake")
    parser.add_argument("--skip-dlt", action="store_true")
    parser.add_argument("--dlt-backends", default="pyarrow,connectorx",
                        help="dlt backends to run, comma-separated (pyarrow alone takes ~3x connectorx's time)")
    parser.add_argument("--skip-reads", action="store_true", help="leave out the in-process chunk reads")
    parser.add_argument("--csv", action="store_true", help="also copy with the CSV read (the path before)")
    parser.add_argument("--reads-only", action="store_true", help="raw COPY and the chunk reads, no copies")
    parser.add_argument("--small-tables", type=int, default=0, help="also: N small tables to STREAMING")
    parser.add_argument("--small-rows", type=int, default=1000)
    parser.add_argument("--snapshot", default="{}", help="snapshot settings as JSON, for before/after runs")
    parser.add_argument("--json", type=Path, help="write the results here (default: the work folder)")
    parser.add_argument("--png", type=Path, help="write the plot here (default: the work folder)")
    parser.add_argument("--replot", type=Path,
                        help="only redraw --png (and reprint the tables) from a --json file")
    parser.add_argument("--work-dir", type=Path, help="where the server and the copies live (default: temp); "
                        "as root, the postgres user must be able to enter it")
    args = parser.parse_args()
    if args.replot:
        return replot(args.replot, args.png or args.replot.with_suffix(".png"))
    sizes = parse_rows(args.rows) if args.rows else ([] if args.small_tables else [5_000_000])
    if args.work_dir:
        args.work_dir.mkdir(parents=True, exist_ok=True)
    if sizes:  # refuse before the first load, not after an hour
        check_disk(args.work_dir or Path(tempfile.gettempdir()), max(sizes))
    work = Path(tempfile.mkdtemp(prefix="headrace-copy-bench-", dir=args.work_dir))
    masters = args.spark_masters.split(",")
    targets = [] if args.reads_only else args.targets.split(",")
    dlt = not (args.skip_dlt or args.reads_only) and bool(sizes)
    python = dlt_python() if dlt else None
    json_path, png = args.json or work / "initial_copy.json", args.png or work / "initial_copy.png"
    rates = dict(ASSUMED)

    def left(after: int) -> float:
        return sum(estimate_s(rows, masters, targets, dlt, not args.skip_reads and i == 0, args.csv, rates)
                   for i, rows in enumerate(sizes) if i >= after)

    if sizes:
        print(f"{len(sizes)} sizes × (raw COPY, {len(targets)} targets × {len(masters)} Spark masters"
              f"{', dlt ' + args.dlt_backends if dlt else ''}); work folder {work}; estimated wall time "
              f"{left(0) / 60:.0f} min (assumed rates, 2 cores; small tables not included)", flush=True)
    results: list[SizeResult] = []
    small: dict[str, Any] = {}
    started = time.monotonic()
    # The server under --work-dir too (its data is most of the disk); as root it runs as the postgres
    # user, which cannot enter the private mkdtemp folder, so it goes beside it.
    with ThrowawayPostgres(base_dir=str(args.work_dir) if args.work_dir else None) as pg:
        for i, rows in enumerate(sizes):
            reads = i == 0 and not args.skip_reads
            size = measure_size(args, pg.dsn, work, rows, reads, masters, targets, python, rates)
            drop_table(pg.dsn, rows)
            results.append(size)
            print("\n" + markdown(size) + "\n", flush=True)
            learn_rates(size, rates)
            # Rewritten after each size: a crash later keeps these.
            write_json(json_path, masters, args.snapshot, started, results, small)
            if i + 1 < len(sizes):
                print(f"{(time.monotonic() - started) / 60:.1f} min so far; about {left(i + 1) / 60:.0f} min "
                      f"left (rates measured on {rows:,} rows)", flush=True)
        if args.small_tables:
            small = measure_small(args, pg.dsn, work, masters[-1], targets)
            print("\n" + small_markdown(small) + "\n", flush=True)
    write_json(json_path, masters, args.snapshot, started, results, small)
    if results and (targets or dlt):
        plot(results, masters, png)
    print(f"results: {json_path}" + (f"; plot: {png}" if results and (targets or dlt) else ""))
    with contextlib.suppress(OSError):
        work.rmdir()  # when nothing was left in it (every output removed, --json and --png elsewhere)
    failed = [f"{s.rows:,} rows: {f['what']}" for s in results for f in s.failures]
    if failed:
        print("FAILED: " + "; ".join(failed), file=sys.stderr)
    return 1 if failed else 0


def parse_rows(text: str) -> list[int]:
    """``5000000,20_000_000,50M`` → sizes in rows."""
    sizes = []
    for item in text.split(","):
        item = item.strip().replace("_", "").upper()
        sizes.append(int(float(item[:-1]) * 1_000_000) if item.endswith("M") else int(item))
    return sizes


def replot(results: Path, png: Path) -> int:
    """The tables and the plot again from a results file (e.g. the lead's quiet-machine run)."""
    saved = json.loads(results.read_text())
    sizes = [from_json(record) for record in saved["sizes"]]
    for size in sizes:
        print(markdown(size) + "\n")
    plot(sizes, saved["machine"]["spark_masters"], png)
    print(f"plot: {png}")
    return 0


def write_json(path: Path, masters: list[str], snapshot: str, started: float, results: list[SizeResult],
               small: dict[str, Any]) -> None:
    """The results so far, as ``--json`` (rewritten after each size)."""
    out = {"machine": {"cores": os.cpu_count(), "spark_masters": masters, "snapshot": json.loads(snapshot)},
           "wall_s": round(time.monotonic() - started), "sizes": [s.to_json() for s in results],
           "small_tables": small or None}
    path.write_text(json.dumps(out, indent=2) + "\n")


def measure_size(args: argparse.Namespace, dsn: str, work: Path, rows: int, reads: bool, masters: list[str],
                 targets: list[str], python: Path | None, rates: dict[str, float]) -> SizeResult:
    """Load one size's table and copy it by every method, raw COPY first and last."""
    check_disk(work, rows)
    print(f"loading {rows:,} rows (about {rows / rates['load']:.0f} s)...", flush=True)
    table_bytes, load_s = load_table(dsn, rows)
    size = SizeResult(rows, table_bytes, load_s)
    print(f"  loaded in {load_s:.1f} s ({table_bytes / 2**20:,.0f} MB)", flush=True)

    def measure(what: str, run: Any, *a: Any) -> None:
        size.load_avg.append([round(x, 1) for x in os.getloadavg()])
        print(f"  {what}...", end=" ", flush=True)
        try:
            got = run(*a)
        except (MethodFailed, subprocess.CalledProcessError) as exc:  # a result too; an hour's run goes on
            if run is raw_copy:
                raise  # the reference every ratio needs
            size.failures.append({"what": what, "error": str(exc)})
            print(f"FAILED: {exc}", flush=True)
            return
        got = got if isinstance(got, list) else [got]
        size.measurements.extend(got)
        print(", ".join(f"{m.seconds:.1f} s" for m in got), flush=True)

    measure("raw COPY", raw_copy, dsn, rows)
    if reads:
        measure("chunk reads (CSV, binary)", chunk_reads, dsn, rows)
    for master in masters:
        for target in targets:
            for binary in (True, False) if args.csv else (True,):
                measure(f"headrace → {target} ({master}{'' if binary else ', CSV'})", headrace_copy,
                        dsn, work, rows, target, master, binary, json.loads(args.snapshot))
    if python is not None:
        for backend in args.dlt_backends.split(","):
            measure(f"dlt {backend}", dlt_copy, python, dsn, work, rows, backend)
    measure("raw COPY again", raw_copy, dsn, rows)
    return size


def measure_small(args: argparse.Namespace, dsn: str, work: Path, master: str, targets: list[str]
                  ) -> dict[str, Any]:
    """The many-small-tables case on the same server: every table STREAMING, per target."""
    print(f"loading {args.small_tables} tables of {args.small_rows:,} rows...", end=" ", flush=True)
    loaded = load_small_tables(dsn, args.small_tables, args.small_rows)
    print(f"{loaded:.1f} s", flush=True)
    result: dict[str, Any] = {"tables": args.small_tables, "rows_per_table": args.small_rows,
                              "spark_master": master}
    extra = {"snapshot": json.loads(args.snapshot)} if args.snapshot != "{}" else {}
    for target in targets:
        print(f"  {args.small_tables} small tables → {target}...", end=" ", flush=True)
        result[target] = small_tables(dsn, work, target, master, args.small_tables, extra)
        print(f"{result[target]['total_s']} s ({result[target]['streaming']} STREAMING)", flush=True)
    return result


if __name__ == "__main__":
    sys.exit(main())
