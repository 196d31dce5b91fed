"""Sources: the DSN's scheme picks one (``open_source``); each sits behind ``source.base.Source``.

``postgresql://``, ``postgres://`` or a libpq ``key=value`` string: PostgreSQL. ``mysql://`` or
``mariadb://``: MySQL/MariaDB (imported only when used).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from headrace.core.errors import ConfigError

if TYPE_CHECKING:
    from headrace.config import PipelineConfig
    from headrace.source.base import Source

MYSQL_SCHEMES = ("mysql", "mariadb")


def source_kind(dsn: str) -> str:
    """``postgresql`` or ``mysql`` for a DSN (by its scheme); ``ConfigError`` for another scheme."""
    text = dsn.strip()
    if "://" not in text:
        return "postgresql"  # libpq key=value (or empty: libpq's defaults)
    scheme = text.split("://", 1)[0].lower()
    if scheme in ("postgresql", "postgres"):
        return "postgresql"
    if scheme in MYSQL_SCHEMES:
        return "mysql"
    raise ConfigError(f"source.dsn has scheme {scheme}://, which headrace cannot read: use postgresql://"
                      " (or a libpq key=value string) for PostgreSQL, mysql:// or mariadb:// for MySQL/MariaDB")


def open_source(config: PipelineConfig, dsn: str | None = None) -> Source:
    """The source of ``config`` (at ``dsn``, default the config's resolved DSN)."""
    dsn = dsn if dsn is not None else config.source.resolved_dsn()
    if source_kind(dsn) == "mysql":
        from headrace.source.mysql.source import MySqlSource

        return MySqlSource(config, dsn)
    from headrace.source.postgres.source import PostgresSource

    return PostgresSource(config, dsn)
