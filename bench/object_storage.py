"""Local disk against the object store: the same copy and the same backlog drain with staging and the
target's files on a local folder, then on ``s3://`` (a ``moto_server`` on loopback, in memory: the
store the tests use; no network or disk in between, so the ratio shows the clients' costs, not a
real store's latency), at the default settings, one after another in the same run.

The source table of ``--rows`` rows is made once, as a template database every run is cloned from
(``CREATE DATABASE ... TEMPLATE``: seconds, not a fresh 20M-row insert per run). For each target and
each place: the table is copied by ``headrace run --until-caught-up`` (timed by the ``snapshot.done``
event, and as the whole process, Spark's start included); then, with the pipeline stopped,
``--changes`` mixed changes are written (60% updates, 25% inserts, 15% deletes, in transactions of
1,000) and drained by another ``--until-caught-up`` run (timed as the whole process). Each S3 run gets
a store of its own (the previous one's objects leave memory with it); each run's database, slot and
files are removed after it. Correctness on the object store is the tests' job
(tests/e2e/test_object_storage*.py); this only times.

    .venv/bin/python bench/object_storage.py --rows 200000 --changes 100000
    .venv/bin/python bench/object_storage.py --rows 20000000 --changes 5000000 --json docs/object_storage.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from harness import Headrace, ObjectStore, load_average, target_config, write_config

from headrace.source.postgres.throwaway import ThrowawayPostgres  # noqa: E402

TEMPLATE = "b_seed"


def seed(dsn: str, table: str, rows: int) -> None:
    """``rows`` rows in ``table``, inserted a million at a time."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, name text, qty int, price numeric(12,2),"
                     " placed timestamptz)")
        for start in range(1, rows + 1, 1_000_000):
            conn.execute(f"INSERT INTO {table} SELECT g, 'name ' || g, g %% 100, g * 0.01, now() - g * interval '1 s'"
                         " FROM generate_series(%s, %s) g", (start, min(rows, start + 999_999)))
        conn.execute(f"VACUUM ANALYZE {table}")


def backlog(dsn: str, table: str, rows: int, changes: int) -> None:
    """``changes`` mixed changes in transactions of 1,000, keys spread over the table."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        done, step, new = 0, 1000, rows + 1
        while done < changes:
            with conn.transaction():
                start = (done * 7919) % max(1, rows - step)
                conn.execute(f"UPDATE {table} SET qty = qty + 1 WHERE id > %s AND id <= %s", (start, start + 600))
                conn.execute(f"INSERT INTO {table} SELECT g, 'new', 1, 1, now() FROM generate_series(%s, %s) g",
                             (new, new + 249))
                conn.execute(f"DELETE FROM {table} WHERE id > %s AND id <= %s", (start + 600, start + 750))
            new += 250
            done += step


def count(dsn: str, table: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
        return int(row[0]) if row else 0


def run(work: Path, config: Path, timeout: float) -> tuple[float, Any]:
    child = Headrace(config, work / f"{config.stem}.log")
    started = time.monotonic()
    child.start("--until-caught-up")
    code = child.wait(timeout)
    if code != 0:
        raise RuntimeError(f"headrace exited with {code}: see {child.log}")
    return time.monotonic() - started, child


def one(pg: ThrowawayPostgres, kind: str, where: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Copy, then drain a backlog, for one target on one place; the run's database and files removed after."""
    name = f"b_{kind}_{where}"
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{TEMPLATE}"')
    dsn = pg.dsn_for(name)
    folder = work / name
    folder.mkdir()
    with contextlib.ExitStack() as stack:
        root = stack.enter_context(ObjectStore(folder)).new_root(name) if where == "s3" else None
        sections: dict[str, Any] = {"target": target_config(kind, folder, root)}
        if root:
            sections["staging"] = {"path": f"{root}/staging"}
        config = write_config(folder, name, dsn, {"tables": ["public.orders"]}, kind, **sections)
        load = load_average()
        copy_wall, child = run(folder, config, args.timeout)
        copy_s = float(child.events("snapshot.done")[-1]["seconds"])
        written = time.monotonic()
        backlog(dsn, "public.orders", args.rows, args.changes)
        backlog_s = time.monotonic() - written
        drain_wall, _ = run(folder, config, args.timeout)
    result = {"target": kind, "where": where, "rows": args.rows, "changes": args.changes, "copy_s": round(copy_s, 2),
              "copy_rows_s": round(args.rows / copy_s), "copy_wall_s": round(copy_wall, 1),
              "backlog_written_s": round(backlog_s, 1), "drain_wall_s": round(drain_wall, 1),
              "drain_changes_s": round(args.changes / drain_wall), "rows_after": count(dsn, "public.orders"),
              "load_before": load, "load_after": load_average()}
    _remove(pg, name, folder, args.keep)
    return result


def _remove(pg: ThrowawayPostgres, name: str, folder: Path, keep: bool) -> None:
    """The run's slot and database (and, unless ``keep``, its files): a 20M-row run leaves gigabytes."""
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = %s",
                     (name,))
        conn.execute(f'DROP DATABASE "{name}"')
    if not keep:
        for path in folder.iterdir():
            if path.suffix != ".log":
                shutil.rmtree(path) if path.is_dir() else path.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--changes", type=int, default=100_000)
    parser.add_argument("--targets", default="ducklake,iceberg")
    parser.add_argument("--places", default="local,s3", help="comma list: local disk, the object store")
    parser.add_argument("--timeout", type=float, default=4 * 3600, help="seconds one headrace run may take")
    parser.add_argument("--json", help="write the results here too")
    parser.add_argument("--keep", action="store_true", help="keep each run's local files (logs are always kept)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-s3-"))
    print(f"work folder {work} (the runs' logs)", flush=True)
    results = []
    with ThrowawayPostgres() as pg:
        seeded = time.monotonic()
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{TEMPLATE}"')
        seed(pg.dsn_for(TEMPLATE), "public.orders", args.rows)
        print(f"seeded {args.rows:,} rows in {time.monotonic() - seeded:.0f} s", flush=True)
        for kind in args.targets.split(","):
            for where in args.places.split(","):
                result = one(pg, kind, where, args, work)
                results.append(result)
                print(json.dumps(result), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    print(f"\nrows {args.rows:,}, changes {args.changes:,}, default settings, local[2], moto_server on loopback")
    for kind in args.targets.split(","):
        by = {r["where"]: r for r in results if r["target"] == kind}
        if "local" not in by or "s3" not in by:
            continue
        local, s3 = by["local"], by["s3"]
        print(f"{kind}: copy {local['copy_rows_s']:,} rows/s local, {s3['copy_rows_s']:,} on S3"
              f" ({s3['copy_rows_s'] / local['copy_rows_s']:.2f}x); drain (process, Spark start included)"
              f" {local['drain_changes_s']:,} changes/s local, {s3['drain_changes_s']:,} on S3"
              f" ({s3['drain_changes_s'] / local['drain_changes_s']:.2f}x); load {local['load_before']}/{s3['load_before']}")


if __name__ == "__main__":
    main()
