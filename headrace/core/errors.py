"""Error vocabulary: every error a user can hit says what happened, to which object, and the fix.

Driver errors (psycopg, Spark, DuckDB) are translated into these at the boundary. Only
``TransientError`` is retried automatically; a ``TerminalError`` stops the affected table (or, at
start-up, the whole run) until an operator acts.
"""

from __future__ import annotations


class HeadraceError(Exception):
    """Base class of every error headrace raises on purpose."""


class TerminalError(HeadraceError):
    """Retrying will not help; an operator has to change something (config, grants, schema)."""


class TransientError(HeadraceError):
    """A passing failure (connection drop, commit conflict): retry with backoff."""


class ConfigError(TerminalError):
    """The configuration file or environment is wrong."""


class SourceError(TerminalError):
    """The source database is not set up the way replication needs."""


class UnsupportedError(TerminalError):
    """The source sent something this version of headrace cannot express in the target."""


class SchemaChangeError(TerminalError):
    """A source schema change the target cannot follow in place; the table needs a resync."""
