"""``bench/mysql.py --pg``: the same table and the same changes through the PostgreSQL source, into
the same target (DuckLake) on the same machine in the same run, for the MySQL catch-up's reference
(issue 42: a backlog drained at >= 0.8x the PostgreSQL source's rate).

The table is ``bench/mysql.py``'s in PostgreSQL types (bigint key, integer, numeric(12,2),
varchar(16), timestamp(6), text, varchar(32)); the changes are the same shape (transactions of 25
inserts, 50 updates by key and 25 deletes, the same random keys), written while the pipeline is
stopped after its copy, then drained by ``Pipeline.run(until_caught_up=True)``.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import psycopg

from headrace.config import parse_config
from headrace.pipeline import Pipeline

TABLE = "items"
TXN = 100
CREATE = f"""CREATE TABLE {TABLE} (id bigint PRIMARY KEY, customer integer NOT NULL, amount numeric(12,2),
  status varchar(16) NOT NULL, created timestamp(6) NOT NULL, note text, coupon varchar(32))"""
ROWS = """SELECT g, g % 100000, (g % 10000) / 100.0, (ARRAY['new','paid','shipped','cancelled'])[1 + g % 4],
  timestamp '2024-01-01' + g * interval '1 second' + (g % 1000000) * interval '1 microsecond',
  md5(g::text) || md5((g + 1)::text) || '-' || (g % 997) || repeat('x', 30),
  CASE WHEN g % 10 = 0 THEN 'C' || g END FROM generate_series({lo}, {hi}) g"""


def _config(dsn: str, work: Path) -> Any:
    folder = work / "pg"
    return parse_config({
        "name": "pgleg", "source": {"dsn": dsn, "tables": [f"public.{TABLE}"]},
        "target": {"ducklake": {"catalog": str(folder / "meta.ducklake"), "data_path": str(folder / "data")}},
        "staging": {"path": str(folder / "staging")}, "apply": {"idle_sleep_seconds": 0.1},
        "spark": {"master": "local[2]"}, "api": {"listen": "127.0.0.1:0"},
    })


def _changes(dsn: str, rows: int, changes: int) -> int:
    rng = random.Random(7)  # bench/mysql.py's keys
    transactions = max(1, changes // TXN)
    next_id, next_delete = rows + 1, 1
    with psycopg.connect(dsn) as conn:
        for _ in range(transactions):
            conn.execute(f"INSERT INTO {TABLE} " + ROWS.format(lo=next_id, hi=next_id + TXN // 4 - 1))
            next_id += TXN // 4
            ids = ", ".join(str(i) for i in rng.sample(range(rows // 2 + 1, rows + 1), TXN // 2))
            conn.execute(f"UPDATE {TABLE} SET amount = amount + 1, status = 'paid', created = now() WHERE id IN ({ids})")
            conn.execute(f"DELETE FROM {TABLE} WHERE id BETWEEN {next_delete} AND {next_delete + TXN // 4 - 1}")
            next_delete += TXN // 4
            conn.commit()
    return transactions * TXN


def postgres_catch_up(pg: Any, work: Path, rows: int, changes: int, spark: Any) -> tuple[int, float]:
    """(changes, seconds) for the PostgreSQL source to drain ``changes`` made while stopped."""
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute("CREATE DATABASE pgleg")
    dsn = pg.dsn_for("pgleg")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(CREATE)
        conn.execute(f"INSERT INTO {TABLE} " + ROWS.format(lo=1, hi=rows))
        conn.execute(f"ANALYZE {TABLE}")
    config = _config(dsn, work)
    if Pipeline(config, spark=spark).run(until_caught_up=True) != 0:  # the copy
        raise RuntimeError("the PostgreSQL pipeline's copy failed")
    written = _changes(dsn, rows, changes)
    t0 = time.monotonic()
    if Pipeline(config, spark=spark).run(until_caught_up=True) != 0:
        raise RuntimeError("the PostgreSQL pipeline's catch-up failed")
    return written, time.monotonic() - t0
