"""Local disk against the object store: the same copy and the same backlog drain with staging and the
target's files on a local folder, then on ``s3://`` (a ``moto_server`` on loopback, in memory: the
store the tests use; no network or disk in between, so the ratio shows the clients' costs, not a
real store's latency), at the default settings, one after another in the same run.

For each target: a table of ``--rows`` rows is copied by ``headrace run --until-caught-up`` (timed by
the ``snapshot.done`` event, and as the whole process, Spark's start included); then, with the
pipeline stopped, ``--changes`` mixed changes are written (60% updates, 25% inserts, 15% deletes, in
transactions of 1,000) and drained by another ``--until-caught-up`` run (timed as the whole process).
Correctness on the object store is the tests' job (tests/e2e/test_object_storage*.py); this only times.

    .venv/bin/python bench/object_storage.py --rows 200000 --changes 100000
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from harness import ROOT, Headrace, load_average, write_config

from headrace.source.postgres.throwaway import ThrowawayPostgres  # noqa: E402

os.environ.setdefault("PYTHONPATH", str(ROOT))
from tests.objectstore import MotoServer, s3_environment  # noqa: E402


def seed(dsn: str, table: str, rows: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, name text, qty int, price numeric(12,2),"
                     " placed timestamptz)")
        conn.execute(f"INSERT INTO {table} SELECT g, 'name ' || g, g % 100, g * 0.01, now() - g * interval '1 s'"
                     f" FROM generate_series(1, {rows}) g")


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


def run(work: Path, config: Path) -> tuple[float, Headrace]:
    child = Headrace(config, work / f"{config.stem}.log")
    started = time.monotonic()
    child.start("--until-caught-up")
    code = child.wait(3600)
    if code != 0:
        raise RuntimeError(f"headrace exited with {code}: see {child.log}")
    return time.monotonic() - started, child


def one(pg: ThrowawayPostgres, server: MotoServer, kind: str, where: str, rows: int, changes: int,
        work: Path) -> dict[str, Any]:
    name = f"b_{kind}_{where}"
    _create_db(pg, name)
    dsn = pg.dsn_for(name)
    seed(dsn, "public.orders", rows)
    sections: dict[str, Any] = {}
    if where == "s3":
        bucket = server.new_bucket(name.replace("_", "-"))
        target = ({"iceberg": {"warehouse": f"s3://{bucket}/warehouse"}} if kind == "iceberg" else
                  {"ducklake": {"catalog": str(work / f"{name}.ducklake"), "data_path": f"s3://{bucket}/lake"}})
        sections = {"staging": {"path": f"s3://{bucket}/staging"}}
    (work / name).mkdir()
    config = write_config(work / name, name, dsn, {"tables": ["public.orders"]}, kind, **sections)
    if where == "s3":
        import yaml

        raw = yaml.safe_load(config.read_text())
        raw["target"] = target
        config.write_text(yaml.safe_dump(raw))
    copy_wall, child = run(work, config)
    copy_s = float(child.events("snapshot.done")[-1]["seconds"])
    backlog(dsn, "public.orders", rows, changes)
    drain_wall, _ = run(work, config)
    return {"target": kind, "where": where, "copy_s": copy_s, "copy_rows_s": rows / copy_s,
            "copy_wall_s": copy_wall, "drain_wall_s": drain_wall, "drain_changes_s": changes / drain_wall,
            "rows": count(dsn, "public.orders")}


def _create_db(pg: ThrowawayPostgres, name: str) -> None:
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--changes", type=int, default=100_000)
    parser.add_argument("--targets", default="ducklake,iceberg")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-s3-"))
    server = MotoServer(work)
    os.environ.update(s3_environment(server.endpoint))
    results = []
    try:
        with ThrowawayPostgres() as pg:
            for kind in args.targets.split(","):
                for where in ("local", "s3"):
                    load = load_average()
                    result = one(pg, server, kind, where, args.rows, args.changes, work)
                    result["load"] = load
                    results.append(result)
                    print(result, flush=True)
    finally:
        server.stop()
    print(f"\nrows {args.rows:,}, changes {args.changes:,}, default settings, local[2], moto_server on loopback")
    for kind in args.targets.split(","):
        local = next(r for r in results if r["target"] == kind and r["where"] == "local")
        s3 = next(r for r in results if r["target"] == kind and r["where"] == "s3")
        print(f"{kind}: copy {local['copy_rows_s']:,.0f} rows/s local, {s3['copy_rows_s']:,.0f} on S3"
              f" ({s3['copy_rows_s'] / local['copy_rows_s']:.2f}x); drain (process, Spark start included)"
              f" {local['drain_changes_s']:,.0f} changes/s local, {s3['drain_changes_s']:,.0f} on S3"
              f" ({s3['drain_changes_s'] / local['drain_changes_s']:.2f}x); load {local['load']:.1f}/{s3['load']:.1f}")


if __name__ == "__main__":
    main()
