"""Which server is this? MariaDB has no server UUID: its identity is ``server_uid`` (measured here: the
same after a restart, another on every other server) with ``server_id`` and ``gtid_domain_id``; a
pipeline pointed at another server is refused naming both and the fix. And the binlog client's own
``server_id`` must not be the server's or another replica's."""

from __future__ import annotations

import contextlib
import os
from typing import Any

import psycopg
import pytest

from headrace.core.errors import SourceError
from headrace.source import open_source
from headrace.source.mysql.binlog import BinlogStream
from headrace.source.mysql.check import replica_id_problems
from headrace.source.mysql.connect import connect
from headrace.source.mysql.server import identity_fields, same_server, server_identity
from headrace.source.mysql.throwaway import ThrowawayMariaDB
from headrace.state.store import StateStore
from tests.e2e.helpers import make_config


def _identity(dsn: str) -> str:
    with contextlib.closing(connect(dsn)) as conn:
        return server_identity(conn)


def test_identity_is_stable_across_a_restart_and_differs_between_servers(
        mariadb_server: ThrowawayMariaDB, tmp_path: Any) -> None:
    shared = _identity(mariadb_server.dsn)
    with ThrowawayMariaDB(str(tmp_path)) as other:
        before = _identity(other.dsn)
        other.stop_server()
        other.start_server()
        assert _identity(other.dsn) == before
    fields = identity_fields(before)
    assert fields["server_uid"] and fields["server_id"] == "1" and fields["gtid_domain_id"] == "0"
    # Configured alike (server_id 1, domain 0), the two servers still differ.
    assert identity_fields(shared)["server_id"] == fields["server_id"] and not same_server(shared, before)
    # A state recorded before server_uid was part of the identity compares on what it has.
    assert same_server("mariadb:server_id=1,gtid_domain_id=0", before)
    assert not same_server("mariadb:server_id=2,gtid_domain_id=0", before)
    assert not same_server("3e11fa47-71ca-11e1-9e33-c80aa9429562", before)


def test_another_server_is_refused_with_both_names_and_the_fix(
        mariadb_server: ThrowawayMariaDB, pg_server: Any, tmp_path: Any) -> None:
    name = f"ident{os.getpid()}"
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        config = make_config(mariadb_server.dsn_for("mysql"), tmp_path, ["mysql.db"], "ducklake",
                             source={"state_dsn": pg_server.dsn_for(name)})
        source = open_source(config)
        state = StateStore(pg_server.dsn_for(name), config.name)
        try:
            state.install()
            recorded = "mariadb:server_uid=AAAAAAAAAAAAAAAAAAAAAAAAAAA=,server_id=1,gtid_domain_id=0"
            state.ensure_meta(recorded, config.slot_name, config.publication_name, 4)
            with source.connect() as conn:
                with pytest.raises(SourceError) as refused:
                    source.check_same_source(conn, state)
                now = source.identity(conn)
        finally:
            state.close()
        message = str(refused.value)
        assert recorded in message and now in message and "headrace reset -c <pipeline file> --yes" in message
    finally:
        with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_replica_server_id_must_be_unused(mariadb_server: ThrowawayMariaDB) -> None:
    with contextlib.closing(connect(mariadb_server.root_dsn)) as root:
        (own,) = replica_id_problems(root, 1, "headrace:p", derived=True)
        assert "is the source server's own server_id" in own and "derived from the pipeline name" in own
        assert "server_id: <a number" in own
        other = BinlogStream(mariadb_server.dsn, 4242, _now(root), set(), tag="headrace:other")
        try:
            other.read(10, 0.5)  # registered (SHOW SLAVE HOSTS) once it streams
            (clash,) = replica_id_problems(root, 4242, "headrace:p", derived=False)
            assert "already used by replica 'headrace:other'" in clash and "(source.server_id)" in clash
            assert replica_id_problems(root, 4242, "headrace:other", derived=False) == []  # its own, left over
            assert replica_id_problems(root, 4343, "headrace:p", derived=True) == []
            with contextlib.closing(connect(mariadb_server.dsn)) as repl:
                # SHOW SLAVE HOSTS needs REPLICATION MASTER ADMIN: without it only the server's own id is checked.
                assert replica_id_problems(repl, 4242, "headrace:p", derived=False) == []
        finally:
            other.close()


def _now(conn: Any) -> int:
    from headrace.source.mysql.position import to_int

    with conn.cursor() as cur:
        cur.execute("SHOW MASTER STATUS")
        return to_int(*cur.fetchone()[:2])
