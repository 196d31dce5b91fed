"""The error boundary: any exception a copy or an apply raises, as a headrace error with its kind and fix.

Driver errors reach the run loop in their drivers' shapes: psycopg and psycopg2 errors with a
SQLSTATE, DuckDB exceptions by class, and Spark's — a ``Py4JJavaError`` whose text starts with the
py4j boilerplate ("An error occurred while calling o435.parquet."), or a ``pyspark.errors``
exception (``AnalysisException``, ``PythonException`` from a UDF or an Arrow task). ``classify``
unwraps each to its root cause (the Java ``Caused by`` chain, the Python exception at the end of a
task's traceback), maps it to ``TransientError`` / ``TerminalError`` (and subclasses), and says the
fix. Errors nobody has classified are ``unknown``: retried a bounded number of times, then they wait
for the operator (``Pipeline._fail``).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any, Literal

from headrace.core import errors as core_errors
from headrace.core.errors import (
    TERMINAL_MARKER,
    HeadraceError,
    PrivilegeError,
    SchemaChangeError,
    TerminalError,
    TransientError,
    UnclassifiedError,
    ValueNotStorableError,
    exception_chain,
)
from headrace.core.sqlstate import error_for_sqlstate

Kind = Literal["transient", "terminal", "unknown"]
MESSAGE_LIMIT = 1000  # characters of root cause kept in state, status and logs


@dataclass(frozen=True)
class Failure:
    """What went wrong with a table, for state, status, readiness and logs."""

    kind: Kind
    error: HeadraceError  # the translated error, its message the root cause
    fix: str | None  # what the operator runs or changes; None while retrying by itself helps

    @property
    def message(self) -> str:
        """``ErrorClass: root cause`` (the class says the kind at a glance)."""
        return f"{type(self.error).__name__}: {self.error}"


def classify(exc: BaseException, table: str, user: str | None = None) -> Failure:
    """``exc`` (raised copying or applying ``table``) as a ``Failure``; ``user`` is the source role."""
    error = translate(exc, table)
    if isinstance(error, TransientError):
        return Failure("transient", error, None)
    if isinstance(error, TerminalError):
        return Failure("terminal", error, _fix(error, table, user))
    return Failure("unknown", error, f"look at the log (event table.errored) for the cause, fix it, then run "
                                     f"`headrace resume {shlex.quote(table)}`")


def translate(exc: BaseException, table: str) -> HeadraceError:
    """The headrace error ``exc`` stands for, its message the root cause rather than a wrapper's."""
    link: BaseException | None = exc
    while link is not None:  # a headrace error raised from a driver error already says what it is
        if isinstance(link, HeadraceError):
            return link
        link = link.__cause__  # explicit causes only: an implicit context may be another failure
    root = _spark_root(exc)
    if root is not None:
        return root
    for link in exception_chain(exc):
        sqlstate = getattr(link, "sqlstate", None) or getattr(link, "pgcode", None)
        if sqlstate or _is_postgres_error(link):
            return error_for_sqlstate(sqlstate, _first_lines(str(link)), type(link).__name__)
        if type(link).__module__.startswith(("duckdb", "_duckdb")):
            return _from_duckdb(link, table)
    return UnclassifiedError(f"{type(exc).__name__}: {_first_lines(str(exc))}")



def _first_lines(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """The message without Spark's plan, SQL context or stack trace, at most ``limit`` characters."""
    kept = []
    for line in text.strip().splitlines():
        if not line.strip() or line.startswith(("== ", "JVM stacktrace:", "\tat ", "Driver stacktrace:")) \
                or line.lstrip().startswith(("at org.", "at java.", "at scala.")):
            break
        kept.append(line.rstrip())
    sentence = " ".join(kept).strip() or text.strip()
    return sentence if len(sentence) <= limit else sentence[: limit - 1] + "…"


# -- PostgreSQL ------------------------------------------------------------------------------------
def _is_postgres_error(exc: BaseException) -> bool:
    return type(exc).__module__.split(".")[0] in ("psycopg", "psycopg2")


def _postgres_name_state(name: str) -> str | None:
    """SQLSTATE of a psycopg2/psycopg error class name seen in a task's traceback (same names in both)."""
    import psycopg.errors

    cls = getattr(psycopg.errors, name, None)
    state = getattr(cls, "sqlstate", None)
    return state if isinstance(state, str) else None


# -- DuckDB ----------------------------------------------------------------------------------------
_DUCKDB_TRANSIENT = {"TransactionException", "IOException", "HTTPException", "ConnectionException",
                     "InterruptException"}
_DUCKDB_VALUE = {"ConversionException", "OutOfRangeException"}
_DUCKDB_SCHEMA = {"CatalogException", "BinderException", "DependencyException"}
_DUCKDB_TERMINAL = {"PermissionException", "ConstraintException", "NotImplementedException",
                    "InvalidInputException", "ParserException", "SyntaxException"}


# A catalog database busy with another writer (DuckLake on SQLite: "database is locked"), and the
# aborted transaction such a failure leaves behind, whatever class DuckDB raises them as: the
# transaction is rolled back and the batch retried.
_DUCKDB_TRANSIENT_TEXT = ("database is locked", "database table is locked", "current transaction is aborted")


def _from_duckdb(exc: BaseException, table: str) -> HeadraceError:
    names = {cls.__name__ for cls in type(exc).__mro__}
    # A refused commit names its cause (the conflict) on the second line.
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    message = f"DuckDB {type(exc).__name__} writing {table}: {' '.join(lines[:2])[:MESSAGE_LIMIT]}"
    if names & _DUCKDB_TRANSIENT or any(text in str(exc).lower() for text in _DUCKDB_TRANSIENT_TEXT):
        return TransientError(message)
    if names & _DUCKDB_VALUE:
        return ValueNotStorableError(message)
    if names & _DUCKDB_SCHEMA:
        return SchemaChangeError(message)
    if names & _DUCKDB_TERMINAL:
        return TerminalError(message)
    return UnclassifiedError(message)


# -- Spark -----------------------------------------------------------------------------------------
# Root causes in the JVM, by class name (the exception itself or any superclass name ending so).
# An Iceberg REST catalog's 5xx (ServiceFailureException, ServiceUnavailableException) is the server's
# trouble of the moment: a commit it failed (CommitStateUnknownException, caused by one) is applied again.
_JAVA_TRANSIENT = ("java.net.", "org.apache.iceberg.exceptions.CommitFailedException",
                   "org.apache.iceberg.exceptions.CommitStateUnknownException",
                   "org.apache.iceberg.exceptions.ServiceFailureException",
                   "org.apache.iceberg.exceptions.ServiceUnavailableException", "java.sql.SQLTransient",
                   "java.sql.SQLRecoverableException", "java.util.concurrent.TimeoutException",
                   "org.apache.spark.shuffle.FetchFailedException")
_JAVA_VALUE = ("org.apache.spark.SparkUpgradeException", "org.apache.spark.SparkArithmeticException",
               "org.apache.spark.SparkDateTimeException", "org.apache.spark.SparkNumberFormatException",
               "java.lang.ArithmeticException", "java.time.DateTimeException", "java.lang.NumberFormatException")
_JAVA_SCHEMA = ("org.apache.spark.sql.AnalysisException", "org.apache.iceberg.exceptions.NoSuchTableException",
                "java.io.FileNotFoundException", "org.apache.spark.SparkFileNotFoundException")
_TRACEBACK_FRAME = re.compile(r"^\s+File \".*\", line \d+")
_LOST_TASK = re.compile(r"^.*?most recent failure: Lost task .*? executor [^)]*\): ")


def _spark_root(exc: BaseException) -> HeadraceError | None:
    """The root cause of a Spark error, or None when ``exc`` is not one."""
    module = type(exc).__module__
    java = getattr(exc, "java_exception", None)  # py4j.protocol.Py4JJavaError
    if java is None and module.startswith("pyspark"):
        java = getattr(exc, "_origin", None)  # pyspark.errors CapturedException from a Java exception
    if java is not None:
        try:
            return _from_java(java)
        except Exception:  # the JVM is gone: all that is left is the text
            return _from_text(str(getattr(exc, "errmsg", exc)))
    if module.startswith("pyspark"):  # e.g. PythonException: its text holds the worker's traceback
        text = str(getattr(exc, "desc", None) or exc)
        if type(exc).__name__ == "AnalysisException" and TERMINAL_MARKER not in text:
            return SchemaChangeError(_first_lines(text))
        return _from_text(text)
    return None


def _from_java(java: Any) -> HeadraceError:
    """Walk ``getCause()`` to the root; classify it by class name and message."""
    chain = [java]
    while chain[-1].getCause() is not None and len(chain) < 20:
        chain.append(chain[-1].getCause())
    root = chain[-1]
    message = str(root.getMessage() or root.toString())
    if "Traceback (most recent call last)" in message or TERMINAL_MARKER in message:
        return _from_text(message)
    classes = _java_classes(root)
    # A task failure whose exception could not travel as a cause: its text follows the task's name.
    sentence = _LOST_TASK.sub("", _first_lines(message), count=1)
    if any(c.startswith("org.postgresql.util.PSQLException") for c in classes):
        return error_for_sqlstate(str(root.getSQLState() or "") or None, sentence, "PSQLException")
    if any(c.startswith(_JAVA_TRANSIENT) for c in classes):
        return TransientError(f"{classes[0]}: {sentence}")
    if "org.apache.iceberg.exceptions.ValidationException" in classes and any(
            m in message.lower() for m in ("conflict", "missing data files", "missing required files")):
        # A concurrent commit touched the same files, or removed the files a batch read (a compaction
        # by another engine): read again and retry.
        return TransientError(f"{classes[0]}: {sentence}")
    if any(c.startswith(_JAVA_VALUE) for c in classes):
        return ValueNotStorableError(sentence)
    if any(c.startswith(_JAVA_SCHEMA) for c in classes):
        return SchemaChangeError(sentence)
    return UnclassifiedError(f"{classes[0]}: {sentence}")


def _java_classes(obj: Any) -> list[str]:
    """The Java class of ``obj`` and its superclasses, most specific first."""
    out: list[str] = []
    cls = obj.getClass()
    while cls is not None and len(out) < 12:
        out.append(str(cls.getName()))
        cls = cls.getSuperclass()
    return out


def _from_text(text: str) -> HeadraceError:
    """A root cause known only as text: a Python traceback from a worker, or a marked message."""
    if TERMINAL_MARKER in text:
        rest = text.split(TERMINAL_MARKER, 1)[1]
        return ValueNotStorableError(_first_lines(rest))
    if "Traceback (most recent call last)" not in text:
        return UnclassifiedError(_first_lines(text))
    name, message = _python_exception(text)
    short = name.rsplit(".", 1)[-1]
    headrace_class = getattr(core_errors, short, None)
    if name.startswith("headrace.") and isinstance(headrace_class, type) \
            and issubclass(headrace_class, HeadraceError):
        error: HeadraceError = headrace_class(message)
        return error
    if name.startswith(("psycopg2.", "psycopg.")):
        return error_for_sqlstate(_postgres_name_state(short), message, short)
    return UnclassifiedError(f"{name}: {message}")


def _python_exception(text: str) -> tuple[str, str]:
    """(exception class, message) of the last exception in a Python traceback."""
    lines = text.strip().splitlines()
    last_frame = max((i for i, line in enumerate(lines) if _TRACEBACK_FRAME.match(line)), default=0)
    rest = lines[last_frame + 1:]
    while rest and (rest[0].startswith("    ") or not rest[0].strip()):  # the frame's source line, ^^^ marks
        rest = rest[1:]
    head = rest[0] if rest else lines[-1]
    name, _, first = head.partition(": ")
    body = "\n".join([first, *rest[1:]]) if rest else first
    return name.strip(), _first_lines(body)


# -- fixes -----------------------------------------------------------------------------------------
def _fix(error: TerminalError, table: str, user: str | None) -> str:
    name = shlex.quote(table)
    match error:
        case PrivilegeError():
            return (f"GRANT SELECT ON {table} TO {user or '<headrace role>'}; then `headrace resume {name}`")
        case SchemaChangeError():
            return f"`headrace resync {name}` (copies the table again in its current shape)"
        case ValueNotStorableError():
            return (f"the change the error names: keep the column as text (source.columns_as_text) or change the"
                    f" value policy (values.infinity) in the config and restart, or fix the value in the source;"
                    f" then `headrace resync {name}`")
        case _:
            return f"fix what the error says, then `headrace resume {name}`"
