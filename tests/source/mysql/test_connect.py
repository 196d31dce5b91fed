"""Connecting: sessions in UTC; a wrong password or database is a SourceError naming the fix."""

from __future__ import annotations

import contextlib
import ssl

import pytest

from headrace.core.errors import SourceError
from headrace.source.mysql.connect import connect
from headrace.source.mysql.throwaway import ThrowawayMariaDB


def test_session_is_utc_and_errors_name_the_fix(mariadb_server: ThrowawayMariaDB) -> None:
    with contextlib.closing(connect(mariadb_server.dsn)) as conn, conn.cursor() as cur:
        cur.execute("SELECT @@session.time_zone, @@character_set_client")
        assert cur.fetchone() == ("+00:00", "utf8mb4")
    with pytest.raises(SourceError, match="access denied.*check the user and password"):
        connect(mariadb_server.dsn.replace("repl:repl@", "repl:wrong@"))
    with pytest.raises(SourceError, match="CREATE DATABASE `nope`"):
        connect(mariadb_server.dsn_for("nope"))


def test_connections_share_one_tls_context_that_checks_no_certificate(mariadb_server: ThrowawayMariaDB) -> None:
    """pymysql offers TLS on every connection (its PREFERRED mode); the context, built once, is pymysql's
    own for that mode: no certificate or host name checked."""
    with contextlib.closing(connect(mariadb_server.dsn)) as one, contextlib.closing(connect(mariadb_server.dsn)) as two:
        assert one.ctx is two.ctx
        assert one.ctx.verify_mode is ssl.CERT_NONE and not one.ctx.check_hostname
