"""Sources: the DSN's scheme picks one (``open_source``); each sits behind ``source.base.Source``.

``postgresql://``, ``postgres://`` or a libpq ``key=value`` string: PostgreSQL. ``mysql://`` or
``mariadb://``: MySQL/MariaDB (imported only when used).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from headrace.source.config import MYSQL_SCHEMES, source_kind

if TYPE_CHECKING:
    from headrace.config import PipelineConfig
    from headrace.source.base import Source

__all__ = ["MYSQL_SCHEMES", "open_source", "source_kind"]


def open_source(config: PipelineConfig, dsn: str | None = None) -> Source:
    """The source of ``config`` (at ``dsn``, default the config's resolved DSN)."""
    dsn = dsn if dsn is not None else config.source.resolved_dsn()
    if source_kind(dsn) == "mysql":
        from headrace.source.mysql.source import MySqlSource

        return MySqlSource(config, dsn)
    from headrace.source.postgres.source import PostgresSource

    return PostgresSource(config, dsn)
