"""Connecting to a MySQL/MariaDB source: ``mysql://`` and ``mariadb://`` DSNs, sessions in UTC.

Every session reads TIMESTAMP values in UTC (``time_zone='+00:00'``) and text as utf8mb4, so the copy
and the binlog (which stores TIMESTAMP as UTC seconds) give the same text for the same value.
"""

from __future__ import annotations

import functools
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import pymysql

from headrace.core.errors import ConfigError, SourceError, TransientError
from headrace.core.settings import redacted_dsn
from headrace.source.config import MYSQL_SCHEMES

DEFAULT_PORT = 3306
# Server and client error codes (mysqld_error.h, errmsg.h).
_ACCESS_DENIED, _UNKNOWN_DATABASE, _CANNOT_CONNECT, _LOST = 1045, 1049, 2003, 2013


@dataclass(frozen=True)
class MySqlDsn:
    """A parsed ``mysql://user:password@host:port/database`` (``database`` may be empty)."""

    host: str
    port: int
    user: str
    password: str
    database: str
    scheme: str = "mysql"

    def settings(self) -> dict[str, Any]:
        """Keyword arguments for ``pymysql.connect`` and mysql-replication's ``connection_settings``."""
        return {"host": self.host, "port": self.port, "user": self.user, "password": self.password}


@functools.cache
def _offered_tls() -> ssl.SSLContext:
    """The TLS context pymysql builds for a connection that offers TLS without requiring it (no CA
    given: no certificate checked), made once: pymysql builds one per connection, loading the
    system's CA certificates it then never checks (~50-80 ms a connection, measured; a run opens a dozen)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


class MySqlConnection(pymysql.connections.Connection):  # type: ignore[type-arg]
    """pymysql's connection, sharing one TLS context where it would build one of its own (``_offered_tls``)."""

    def _create_ssl_ctx(self, sslp: Any) -> ssl.SSLContext:
        if isinstance(sslp, dict) and not sslp:
            return _offered_tls()
        return super()._create_ssl_ctx(sslp)  # type: ignore[no-any-return]


def parse_dsn(dsn: str) -> MySqlDsn:
    """Parse ``mysql://`` or ``mariadb://`` DSNs; ConfigError naming the fix for anything else."""
    parts = urlsplit(dsn)
    if parts.scheme not in MYSQL_SCHEMES:
        raise ConfigError(f"source.dsn {redacted_dsn(dsn)}: scheme must be mysql:// or mariadb:// for a MySQL source")
    if not parts.hostname:
        raise ConfigError(f"source.dsn {redacted_dsn(dsn)} names no host: write mysql://user:password@host:3306/db")
    return MySqlDsn(parts.hostname, parts.port or DEFAULT_PORT, unquote(parts.username or "root"),
                    unquote(parts.password or ""), unquote(parts.path.lstrip("/")), parts.scheme)


def connect(dsn: str | MySqlDsn, **kw: Any) -> pymysql.connections.Connection[Any]:
    """A pymysql connection in UTC with utf8mb4 (autocommit unless ``kw`` says otherwise).

    Raises SourceError for a wrong user or password or an unknown database, TransientError for a
    server that cannot be reached (each naming the fix).
    """
    parsed = dsn if isinstance(dsn, MySqlDsn) else parse_dsn(dsn)
    where = f"{parsed.user}@{parsed.host}:{parsed.port}"
    options: dict[str, Any] = {"charset": "utf8mb4", "autocommit": True, "connect_timeout": 10,
                               "init_command": "SET time_zone = '+00:00'", **kw}
    try:
        return MySqlConnection(**parsed.settings(), database=parsed.database or None, **options)
    except pymysql.err.OperationalError as exc:
        code = exc.args[0] if exc.args else 0
        if code == _ACCESS_DENIED:
            raise SourceError(f"MySQL source {where}: access denied ({exc.args[1]}); check the user and"
                              " password in source.dsn (or the variable source.dsn_env names), or create the"
                              f" account: CREATE USER '{parsed.user}'@'%' IDENTIFIED BY '...'") from exc
        if code == _UNKNOWN_DATABASE:
            raise SourceError(f"MySQL source {where}: database {parsed.database!r} does not exist; fix the"
                              f" database in source.dsn or run CREATE DATABASE `{parsed.database}`") from exc
        if code in (_CANNOT_CONNECT, _LOST):
            raise TransientError(f"MySQL source {where} cannot be reached ({exc.args[1]}); check that the"
                                 " server runs and listens there (bind_address, port, firewall)") from exc
        raise
