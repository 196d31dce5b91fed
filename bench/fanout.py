"""Fan-out benchmarks: Arrow splitting and preimage resolution, and a full cycle over real lakes.

    .venv/bin/python bench/fanout.py [--rows 1000000] [--destinations 1000] [--lakes 100]

1. Splitting: route 1M change rows to 1,000 destinations (``split_by_index`` after ``route_index``),
   against a reference measured in the same run: one ``filter`` per destination.
2. Preimage resolution: first/last change per key of 50K change rows (``resolve_first_last``), and
   the whole ``route`` (resolution + split) of the same rows.
3. Full cycle: a source lake and 100 real tenant lakes (DuckDB-file catalogs): the seeding cycle,
   then one cycle applying a batch of changes touching every tenant.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from timing import median_ms  # bench/timing.py, beside this script

from headrace.fanout.config import parse_fanout_config
from headrace.fanout.planner import resolve_first_last, route, route_index, split_by_index
from headrace.fanout.runner import FanoutRunner


def change_rows(n: int, tenants: int, seed: int = 7) -> pa.Table:
    """``n`` change rows like ``ducklake_table_changes`` returns: inserts, update pairs, deletes."""
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, max(1, n // 2), n)
    kinds = rng.choice(np.array(["insert", "update_preimage", "update_postimage", "delete"]), n, p=[.5, .2, .2, .1])
    return pa.table({
        "snapshot_id": pa.array(rng.integers(1, 1000, n)),
        "rowid": pa.array(keys),
        "change_type": pa.array(kinds),
        "event_id": pa.array(keys),
        "company": pa.array([f"tenant-{i}" for i in rng.integers(0, tenants, n)]),
        "payload": pa.array(rng.integers(0, 1 << 30, n)),
    })


def bench_split(rows: int, destinations: int) -> dict[str, float]:
    table = change_rows(rows, destinations)
    values = [f"tenant-{i}" for i in range(destinations)]

    def split() -> list[pa.Table]:
        return split_by_index(table, route_index(table["company"], values), destinations)

    def naive() -> list[pa.Table]:
        return [table.filter(pc.equal(table["company"], v)) for v in values]

    parts = split()
    assert sum(p.num_rows for p in parts) == rows
    return {"split_ms": median_ms(split), "naive_filter_ms": median_ms(naive, repeat=1)}


def bench_resolve(rows: int, destinations: int) -> dict[str, float]:
    table = change_rows(rows, destinations, seed=11)
    values = [f"tenant-{i}" for i in range(destinations)]
    return {
        "resolve_ms": median_ms(lambda: resolve_first_last(table, ["event_id"])),
        "route_ms": median_ms(lambda: route(table, "company", ["event_id"], values)),
    }


def bench_cycle(lakes: int, rows_per_lake: int, changes_per_lake: int) -> dict[str, float]:
    import duckdb

    from headrace.targets.ducklake import extension

    root = Path(tempfile.mkdtemp(prefix="headrace-fanout-bench-"))
    try:
        src_catalog, src_data = str(root / "src.ducklake"), str(root / "src")
        con = duckdb.connect()
        extension.load_extension(con, "ducklake", "bench")
        con.execute(f"ATTACH 'ducklake:{src_catalog}' AS s (DATA_PATH '{src_data}')")
        con.execute(
            "CREATE TABLE s.main.events AS SELECT i::BIGINT AS event_id, 'tenant-' || (i % ?) AS company, "
            "md5(i::VARCHAR) AS payload FROM range(?) t(i)",
            [lakes, lakes * rows_per_lake],
        )
        con.close()
        config = parse_fanout_config({
            "name": "bench",
            "source": {"ducklake": {"catalog": src_catalog, "data_path": src_data, "table": "events"}},
            "routing": {"field": "company", "key_columns": ["event_id"]},
            "defaults": {"ducklake": {"catalog": str(root / "{id}.ducklake"), "data_path": str(root / "{id}"),
                                      "table": "events"}},
            "destinations": [{"id": f"tenant-{i}", "routing_value": f"tenant-{i}"} for i in range(lakes)],
            "pool": {"max_open": lakes},
        })
        runner = FanoutRunner(config)
        try:
            started = time.perf_counter()
            runner.cycle()
            seed_s = time.perf_counter() - started
            n = lakes * changes_per_lake
            con = runner.pool.con
            # Updates (a tenth of them moving tenant), deletes and inserts, in one source snapshot.
            con.execute("BEGIN")
            con.execute(
                "UPDATE hr_src.main.events SET payload = 'changed', company = CASE WHEN event_id % 10 = 0 "
                f"THEN 'tenant-' || ((event_id + 1) % {lakes}) ELSE company END WHERE event_id < ?", [n // 2]
            )
            con.execute("DELETE FROM hr_src.main.events WHERE event_id BETWEEN ? AND ?", [n // 2, n * 3 // 4])
            con.execute(
                f"INSERT INTO hr_src.main.events SELECT i, 'tenant-' || (i % {lakes}), 'new' FROM range(?, ?) t(i)",
                [10**9, 10**9 + n // 4],
            )
            con.execute("COMMIT")
            started = time.perf_counter()
            runner.cycle()
            change_s = time.perf_counter() - started
            split_s = runner.metrics.split_seconds
            assert all(d.lag_snapshots == 0 for d in runner.metrics.destinations.values())
        finally:
            runner.close()
        return {"seed_cycle_s": seed_s, "change_cycle_s": change_s, "changes": float(n),
                "split_s_total": split_s, "source_rows": float(lakes * rows_per_lake)}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--destinations", type=int, default=1000)
    parser.add_argument("--resolve-rows", type=int, default=50_000)
    parser.add_argument("--lakes", type=int, default=100)
    parser.add_argument("--rows-per-lake", type=int, default=1000)
    parser.add_argument("--changes-per-lake", type=int, default=100)
    args = parser.parse_args()
    small = bench_split(100_000, args.destinations)
    print(f"split 100K rows over {args.destinations} destinations: {small['split_ms']:.0f} ms "
          f"(reference, one filter per destination: {small['naive_filter_ms']:.0f} ms; seed design ~160 ms)")
    big = bench_split(args.rows, args.destinations)
    print(f"split {args.rows:,} rows over {args.destinations} destinations: {big['split_ms']:.0f} ms "
          f"(one filter per destination: {big['naive_filter_ms']:.0f} ms, "
          f"x{big['naive_filter_ms'] / big['split_ms']:.1f})")
    resolved = bench_resolve(args.resolve_rows, args.destinations)
    print(f"resolve preimages of {args.resolve_rows:,} change rows: {resolved['resolve_ms']:.1f} ms; "
          f"whole route (resolve + split): {resolved['route_ms']:.1f} ms (seed design ~55 ms)")
    cycle = bench_cycle(args.lakes, args.rows_per_lake, args.changes_per_lake)
    print(f"full cycle, {args.lakes} real lakes: seed {cycle['source_rows']:,.0f} rows in {cycle['seed_cycle_s']:.1f} s; "
          f"{cycle['changes']:,.0f} changes in {cycle['change_cycle_s']:.1f} s "
          f"({cycle['change_cycle_s'] / args.lakes * 1000:.0f} ms per lake; Arrow split+resolve "
          f"{cycle['split_s_total'] * 1000:.0f} ms of both cycles)")


if __name__ == "__main__":
    main()
