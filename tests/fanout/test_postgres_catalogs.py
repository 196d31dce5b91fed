"""Fan-out with Postgres catalogs: the source's catalog (and cursors) and tenant catalogs on a real
server, mixed with a DuckDB-file tenant; one tenant's catalog database missing until it is created."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg

from headrace.fanout.runner import FanoutRunner
from headrace.source.postgres.throwaway import ThrowawayPostgres
from tests.fanout.helpers import Setup
from tests.fanout.test_pipeline import HISTORY, seed_rows


def pg_catalog(server: ThrowawayPostgres, db: str) -> str:
    return f"postgres:host=127.0.0.1 port={server.port} user=postgres dbname={db}"


def create_db(server: ThrowawayPostgres, db: str) -> None:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{db}"')


def test_postgres_catalogs_and_an_unreachable_tenant(tmp_path: Path, pg_server: ThrowawayPostgres) -> None:
    prefix = f"fan{os.getpid()}"
    for db in ("src", "acme"):
        create_db(pg_server, f"{prefix}_{db}")
    setup = Setup(tmp_path, source_catalog=pg_catalog(pg_server, f"{prefix}_src"))
    seed_rows(setup)
    late = f"{prefix}_gamma"  # created only after the first cycles
    tenants = {"acme-lake": "acme", "beta-lake": "beta", "gamma-lake": "gamma"}
    config = setup.config(
        tenants,
        **{
            "acme-lake": {"ducklake": {"catalog": pg_catalog(pg_server, f"{prefix}_acme")}},
            "gamma-lake": {"ducklake": {"catalog_env": "FANOUT_TEST_GAMMA"}},
        },
    )
    os.environ["FANOUT_TEST_GAMMA"] = pg_catalog(pg_server, late)
    runner = FanoutRunner(config)
    try:
        runner.cycle()
        for statement in HISTORY:  # a Postgres catalog takes writers from other connections
            with setup.source() as con:
                con.execute(statement)
        runner.cycle()
        gamma = runner.metrics.destinations["gamma-lake"]
        assert gamma.last_snapshot is None and gamma.errors >= 1
        assert late in (gamma.last_error or "") or "gamma-lake" in (gamma.last_error or "")
        assert runner.metrics.destinations["acme-lake"].lag_snapshots == 0
        create_db(pg_server, late)
        assert runner.run(until_caught_up=True) == 0
        stored = runner.cursors.load()
        assert {d: stored[d].last_error for d in tenants} == dict.fromkeys(tenants)
    finally:
        runner.close()
        os.environ.pop("FANOUT_TEST_GAMMA", None)
    catalogs = {"acme-lake": pg_catalog(pg_server, f"{prefix}_acme"), "gamma-lake": pg_catalog(pg_server, late)}
    for dest, value in tenants.items():
        assert setup.held(dest, catalogs.get(dest)) == setup.expected(value), dest
    with psycopg.connect(pg_server.dsn_for(f"{prefix}_src")) as conn:
        rows = conn.execute("SELECT destination_id, last_snapshot FROM headrace_fanout_cursor").fetchall()
    assert sorted(r[0] for r in rows) == sorted(tenants)
