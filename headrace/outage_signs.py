"""What an outage looks like from the inside: errors that mean a server went away or a directory filled
up, and the check that a server which answers again is still the source the pipeline was set up on.

Capture, the initial copy and the run loop all ask these; how a run waits an outage out is
``headrace.run.outage``.
"""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING

import duckdb
import psycopg
import psycopg2

from headrace.config import redacted_dsn
from headrace.core.errors import SourceError, TransientError, exception_chain

if TYPE_CHECKING:
    from typing import Any

    from headrace.config import PipelineConfig
    from headrace.state.store import StateStore

# Errors meaning "the connection or the server is gone", whichever driver raised them.
_CONNECTION_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError, psycopg2.OperationalError,
                      psycopg2.InterfaceError, ConnectionError)
# DuckDB's postgres extension (a DuckLake catalog in PostgreSQL) raises an IOException whose text alone
# says the catalog server went away (libpq's words): a read during a restart failed with it, and the
# server answered again by the time the run probed, so the run took it for the table's error and ended.
_DUCKDB_CONNECTION_TEXT = ("Unable to connect to Postgres", "Connection refused", "server closed the connection",
                           "terminating connection due to administrator command", "the database system is")
# A staging (or warehouse) directory that cannot take more files: full, over quota, read-only, denied.
_STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO}


def lost_connection(exc: BaseException) -> bool:
    """``exc`` (or what it was raised from) says a database connection broke or could not be made."""
    return any(isinstance(e, _CONNECTION_ERRORS) or (isinstance(e, TransientError) and "connect" in str(e))
               or (isinstance(e, duckdb.IOException) and any(text in str(e) for text in _DUCKDB_CONNECTION_TEXT))
               for e in exception_chain(exc))


# pyarrow's S3 client: the store did not answer, or answered "not now" (its errors carry no errno).
_OBJECT_STORE_TEXT = ("NETWORK_CONNECTION", "curlCode", "Timeout", "timed out", "SLOW_DOWN", "SERVICE_UNAVAILABLE",
                      "INTERNAL_FAILURE", "REQUEST_TIMEOUT", "Connection reset", "Couldn't connect")


def storage_unavailable(exc: BaseException) -> bool:
    """``exc`` says a directory cannot take a file now: no space, over quota, read-only or denied; or
    an object store (``s3://``) does not answer."""
    return any(isinstance(e, OSError) and (e.errno in _STORAGE_ERRNOS or object_store_unreachable(e))
               for e in exception_chain(exc))


def object_store_unreachable(exc: BaseException) -> bool:
    """``exc`` is pyarrow's S3 client saying the store did not answer (or asked to come back later)."""
    text = str(exc)
    return isinstance(exc, OSError) and "AWS Error" in text and any(t in text for t in _OBJECT_STORE_TEXT)


def check_same_source(conn: psycopg.Connection[Any], state: StateStore, slot: str) -> None:
    """After a reconnection: the server is still the cluster the pipeline was set up on, and its slot
    is where the pipeline left it; ``SourceError`` (the start-up check's, with its remedy) if not.

    A failover to a promoted physical standby keeps the system identifier but, before PostgreSQL 17
    failover slots, not the slot; a DSN now pointing at another cluster changes the identifier.
    Streaming on regardless would silently skip the changes the lost slot held.
    """
    from headrace.state.invariants import check_slot

    meta = state.meta()
    if meta is None:
        return
    row = conn.execute("SELECT system_identifier::text FROM pg_control_system()").fetchone()
    sysid = str(row[0]) if row else ""
    if sysid != meta["system_identifier"]:
        raise SourceError(
            f"the source is now another PostgreSQL cluster (system identifier {sysid}, pipeline"
            f" {state.pipeline} was set up on {meta['system_identifier']}): its positions mean nothing"
            " there. Point source.dsn back at the original cluster, or start over with a new pipeline name"
        )
    check_slot(conn, state, slot)


def recorded_source_problems(config: PipelineConfig, conn: psycopg.Connection[Any]) -> list[str]:
    """``check_same_source`` for ``headrace check``: the problem as a sentence, none before the first run."""
    from headrace.state.store import StateStore

    dsn = config.source.resolved_dsn()
    try:
        state = StateStore(config.source.state_dsn or dsn, config.name)
    except psycopg.OperationalError as exc:
        return [f"cannot connect to the state database {redacted_dsn(config.source.state_dsn or dsn)}:"
                f" {str(exc).strip()}"]
    try:
        if state.installed():
            check_same_source(conn, state, config.slot_name)
    except SourceError as exc:
        return [str(exc)]
    finally:
        state.close()
    return []
