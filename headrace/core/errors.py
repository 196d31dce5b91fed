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


# Operator requests (add, remove, pause, resume, resync a table) that cannot be carried out. The run
# raises these; the control plane answers each with its HTTP status (``control.api``).
class RequestError(HeadraceError):
    """The request itself is malformed: a table name that does not parse, a body of the wrong shape."""


class TableNotFound(RequestError):
    """The table named does not exist in the source, or is not replicated by this pipeline."""


class CommandConflict(RequestError):
    """The request conflicts with the table's state: tracked already, not paused, cannot resume."""


class TableRefused(RequestError):
    """The source table exists but cannot be replicated (the message lists every problem and fix)."""


class RunUnavailable(RequestError):
    """The pipeline is not running (not started yet, or stopped before the command ran)."""


class UnclassifiedError(HeadraceError):
    """A failure no rule recognises: retried a few times (``RETRY_BUDGET``), then left to the operator."""
