"""Iceberg's health under the commit rate freshness needs (issue 37): ``--minutes`` at ~``--rate``
changes/s over ``--tables`` busy tables, at the default settings (maintenance included).

Every ``--sample-seconds`` it records, per table: snapshots in the current metadata file, metadata
files (``*.metadata.json``) in the table's folder, the current metadata file's size, the metadata
folder's bytes (manifests and lists too), data and delete files, and a full scan of the table by
DuckDB (``iceberg_scan`` of the current metadata file, ``count(*), sum(v)``, median of 3); and the
freshness of the minute (bench/freshness.py's measure: source commit to the target's commit).
At the end, after catching up: each table's scan against a scan of the same rows freshly compacted
(written by DuckDB as one Parquet file), both read by DuckDB in the same run (median of 9 each, in turn), and the target
compared with the source. Plots the series over time.

    PYTHONPATH=. .venv/bin/python bench/iceberg_health.py --minutes 30 --png docs/img/iceberg_health.png
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from freshness import create_tables, freshness, steady_load
from harness import (
    Headrace,
    caught_up,
    compare_with_source,
    insert_lsn,
    load_average,
    pct,
    pyplot,
    wait_for,
    write_config,
)

from headrace.config import load_config
from headrace.readers import duckdb_with, iceberg_metadata_location
from headrace.source.postgres.throwaway import ThrowawayPostgres


def _scan_ms(con: Any, relation: str, runs: int = 3) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        con.execute(f"SELECT count(*), sum(v) FROM {relation}").fetchall()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def _files(folder: Path, suffix: str) -> list[Path]:
    return [p for p in folder.rglob(f"*{suffix}") if p.is_file()] if folder.exists() else []


def _bytes(paths: list[Path]) -> int:
    """Their sizes; a file a commit or maintenance removed meanwhile counts nothing."""
    total = 0
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            total += p.stat().st_size
    return total


def sample(config: Path, tables: list[str], con: Any) -> dict[str, Any]:
    """The health figures of every table, summed (files, bytes) or worst (scan) over the tables."""
    settings = load_config(config).target.settings
    out: dict[str, Any] = {"snapshots_max": 0, "metadata_files": 0, "metadata_json_kib_max": 0.0,
                           "metadata_dir_mib": 0.0, "data_files": 0, "scan_ms_max": 0.0}
    for table in tables:
        schema, name = table.split(".")
        location = Path(iceberg_metadata_location(settings, schema, name))  # type: ignore[arg-type]
        metadata = json.loads(location.read_text())
        out["snapshots_max"] = max(out["snapshots_max"], len(metadata.get("snapshots", [])))
        folder = location.parent
        out["metadata_files"] += len(_files(folder, ".metadata.json"))
        out["metadata_json_kib_max"] = max(out["metadata_json_kib_max"], location.stat().st_size / 1024)
        out["metadata_dir_mib"] += _bytes(_files(folder, "")) / 2**20
        out["data_files"] += len(_files(folder.parent / "data", ".parquet"))
        out["scan_ms_max"] = max(out["scan_ms_max"], _scan_ms(con, f"iceberg_scan('{location}')"))
    out["metadata_dir_mib"] = round(out["metadata_dir_mib"], 2)
    out["metadata_json_kib_max"] = round(out["metadata_json_kib_max"], 1)
    out["scan_ms_max"] = round(out["scan_ms_max"], 1)
    return out


def compacted_ratio(config: Path, tables: list[str], con: Any, work: Path) -> dict[str, float]:
    """Per table: its scan over a scan of the same rows freshly compacted: an Iceberg table of one
    snapshot and one data file (written by pyiceberg), both read by DuckDB in the same run."""
    from pyiceberg.catalog.sql import SqlCatalog

    settings = load_config(config).target.settings
    packed = SqlCatalog("packed", uri=f"sqlite:///{work}/packed.db", warehouse=f"file://{work}/packed")
    packed.create_namespace("fresh")
    out = {}
    for table in tables:
        schema, name = table.split(".")
        relation = f"iceberg_scan('{iceberg_metadata_location(settings, schema, name)}')"  # type: ignore[arg-type]
        rows = con.execute(f"SELECT * FROM {relation}").arrow()
        fresh = packed.create_table(("fresh", name), schema=rows.schema)
        fresh.append(rows)
        # Scans of a few milliseconds: the median of 9 each, the two in turn, so a hiccup of the machine
        # weighs on neither.
        compacted = f"iceberg_scan('{fresh.metadata_location}')"
        ours, theirs = zip(*((_scan_ms(con, relation, 1), _scan_ms(con, compacted, 1)) for _ in range(9)), strict=True)
        out[table] = round(statistics.median(ours) / statistics.median(theirs), 2)
    return out


def plot(series: list[dict[str, Any]], png: Path, title: str) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(11, 6.5))
    minutes = [s["minute"] for s in series]
    for ax, key, label in ((axes[0][0], "snapshots_max", "snapshots in a table's metadata (max)"),
                           (axes[0][1], "metadata_json_kib_max", "current metadata file, KiB (max)"),
                           (axes[1][0], "scan_ms_max", "DuckDB full scan, ms (slowest table)"),
                           (axes[1][1], "freshness_p99_s", "freshness p99 of the minute, s")):
        ax.plot(minutes, [s.get(key) for s in series], marker="o", markersize=3)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("minutes under load")
        ax.grid(alpha=.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--tables", type=int, default=10)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--txn-changes", type=int, default=10)
    parser.add_argument("--sample-seconds", type=float, default=60)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--png", type=Path, default=None)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="headrace-iceberg-health-"))
    tables = [f"fresh.b{i}" for i in range(args.tables)]
    with ThrowawayPostgres() as server:
        create_tables(server.dsn, args.tables, 0)
        config = write_config(work, "health", server.dsn, {"schemas": ["fresh"]}, "iceberg")
        headrace = Headrace(config, work / "headrace.log")
        headrace.start()
        con = duckdb_with("avro", "iceberg")
        series: list[dict[str, Any]] = []
        try:
            headrace.wait_streaming(server.dsn, "health", args.tables)
            commits: list[Any] = []
            started = time.time()
            load = threading.Thread(target=lambda: commits.extend(
                steady_load(server.dsn, args.tables, args.rate, args.txn_changes, args.minutes * 60)))
            load.start()
            while load.is_alive():
                load.join(args.sample_seconds)
                headrace.check_alive()
                figures = sample(config, tables, con)
                figures["minute"] = round((time.time() - started) / 60, 1)
                figures["load_avg"] = load_average()
                series.append(figures)
                print(json.dumps(figures), flush=True)
            with psycopg.connect(server.dsn) as conn:
                end = insert_lsn(conn)
            wait_for(lambda: caught_up(config, end), 600, "catch-up after the load", headrace.check_alive)
            delays = freshness(commits, headrace.batches())
            for s in series:  # freshness of the commits made in the minute before each sample
                upto = started + s["minute"] * 60
                window = [d for c, d in zip(commits, delays, strict=True)
                          if d is not None and upto - args.sample_seconds <= c.at < upto]
                s["freshness_p99_s"] = round(pct(sorted(window), 99), 2) if window else None
            ratios = compacted_ratio(config, tables, con, work)
        finally:
            con.close()
            headrace.stop()
        matches = compare_with_source(config, server.dsn, {t: "count(*), sum(v), sum(id)" for t in tables})
    result = {"minutes": args.minutes, "tables": args.tables, "rate": args.rate, "settings": "defaults",
              "series": series, "scan_over_compacted": ratios,
              "target_equals_source": all(m["equal"] for m in matches.values())}
    print(json.dumps({k: v for k, v in result.items() if k != "series"}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    if args.png:
        plot(series, args.png, f"Iceberg at the defaults: {args.tables} tables, ~{args.rate} changes/s,"
                               f" {args.minutes:g} minutes")
    return 0 if result["target_equals_source"] else 1


if __name__ == "__main__":
    sys.exit(main())
