"""A PostgreSQL error, by its SQLSTATE, as the headrace error that says what to do: passes by itself
(transient), wants a GRANT, a schema that moved, a value no target column holds, or a source problem.

Shared by the error boundary (``materialize.error_boundary``) and the copy readers that see a SQLSTATE
directly (``source.postgres.binary_copy``: ADBC errors carry one).
"""

from __future__ import annotations

from headrace.core.errors import (
    HeadraceError,
    PrivilegeError,
    SchemaChangeError,
    SourceError,
    TransientError,
    UnclassifiedError,
    UnsupportedError,
    ValueNotStorableError,
)

# SQLSTATEs that pass by themselves (a dropped connection, a conflict between transactions, a server
# restarting or short of resources); classes by their first two characters.
_TRANSIENT_STATES = {"40001", "40P01", "40003", "55P03", "55006", "57014", "57P01", "57P02", "57P03", "57P05",
                     "25P03", "58000", "58030"}
_TRANSIENT_CLASSES = {"08", "53"}



def error_for_sqlstate(sqlstate: str | None, text: str, name: str) -> HeadraceError:
    """The headrace error for a PostgreSQL error ``name`` (its class name) saying ``text``."""
    message = f"PostgreSQL {name}: {text}"
    if sqlstate is None:  # no server answer: the connection is gone (psycopg's OperationalError)
        return TransientError(message) if "Operational" in name or "Interface" in name \
            else UnclassifiedError(message)
    if sqlstate in _TRANSIENT_STATES or sqlstate[:2] in _TRANSIENT_CLASSES:
        return TransientError(message)
    if sqlstate == "42501":
        return PrivilegeError(message)
    if sqlstate in ("42P01", "42703", "42704", "3F000"):
        return SchemaChangeError(message)  # the table or a column is gone or renamed: copy it again
    if sqlstate == "0A000":
        return UnsupportedError(message)
    if sqlstate[:2] in ("22", "2F"):
        return ValueNotStorableError(message)
    if sqlstate[:2] in ("28", "3D", "42", "55"):  # authentication, database gone, other statement errors
        return SourceError(message)
    return UnclassifiedError(message)
