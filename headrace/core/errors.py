"""Error vocabulary: every error a user can hit says what happened, to which object, and the fix.

Driver errors (psycopg, Spark, DuckDB) are translated into these at the boundary. Only
``TransientError`` is retried automatically; a ``TerminalError`` stops the affected table (or, at
start-up, the whole run) until an operator acts.
"""

from __future__ import annotations


def exception_chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling, outermost first."""
    chain: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and link not in chain:
        chain.append(link)
        link = link.__cause__ or link.__context__
    return chain


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


class PrivilegeError(SourceError):
    """The source role lacks a privilege it needs (SELECT on a table): the fix is a GRANT."""


class UnsupportedError(TerminalError):
    """The source sent something this version of headrace cannot express in the target."""


class SchemaChangeError(TerminalError):
    """A source schema change the target cannot follow in place; the table needs a resync."""


class ValueNotStorableError(TerminalError):
    """A source value the target type cannot hold, under a policy that stops the table."""


# Errors raised inside Spark tasks reach the driver as text wrapped in JVM and py4j layers. A value
# check that fails inside a task (a Spark ``raise_error`` expression or a Python UDF) prefixes its
# message with this marker; the Spark boundary finds it in the root cause and raises
# ``ValueNotStorableError`` with the rest of the message, so the table stops instead of retrying.
TERMINAL_MARKER = "[headrace:terminal] "
