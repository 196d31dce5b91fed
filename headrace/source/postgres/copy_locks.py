"""The copy's locks on the source: who waits for them, and how a copy gives them up.

A chunk read holds an ACCESS SHARE lock on its table while its transaction lasts. That lock lets the
application read and write, but a DDL statement (``ALTER TABLE``, most often) waits for it, and every
statement on that table queued after the DDL waits behind it: a read that lasts blocks the
application. The copy's sessions are the ones named ``copy.APPLICATION_NAME`` (or what the DSN names).
"""

from __future__ import annotations

from typing import Any

import psycopg.conninfo

from headrace.source.base import LockWaiter
from headrace.source.postgres.copy import copy_conninfo

# Waiters on a relation lock that one of the named sessions holds; pg_blocking_pids only for them
# (it is not free: the lock manager's partitions are locked while it runs).
_WAITERS = """
SELECT w.pid, l.relation::bigint, n.nspname, c.relname,
       left(regexp_replace(coalesce(w.query, ''), '\\s+', ' ', 'g'), 300),
       extract(epoch FROM clock_timestamp() - coalesce(l.waitstart, w.query_start))::float8,
       ARRAY(SELECT b FROM unnest(pg_blocking_pids(w.pid)) AS b
             WHERE b IN (SELECT pid FROM pg_stat_activity WHERE application_name = %(app)s))
FROM pg_locks l
JOIN pg_stat_activity w ON w.pid = l.pid
JOIN pg_class c ON c.oid = l.relation
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE NOT l.granted AND l.locktype = 'relation'
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""

# A read in progress is cancelled (its transaction ends, the read fails); a session idle in its
# transaction (no read of ours leaves one so, but an older or a stuck one may) is ended.
_END = """
SELECT count(CASE WHEN state = 'active' THEN pg_cancel_backend(pid) ELSE pg_terminate_backend(pid) END)
FROM pg_stat_activity
WHERE application_name = %(app)s AND pid <> pg_backend_pid() AND state <> 'idle'
  AND (pid = ANY(%(pids)s) OR pid IN (SELECT pid FROM pg_locks WHERE granted AND relation = %(oid)s::oid))
"""


def application_name(dsn: str) -> str:
    """The name the copy's sessions show in ``pg_stat_activity``."""
    return str(psycopg.conninfo.conninfo_to_dict(copy_conninfo(dsn)).get("application_name", ""))


def lock_waiters(conn: Any, dsn: str) -> list[LockWaiter]:
    """The sessions waiting now for a lock a copy session holds, longest waiting first."""
    found = []
    for pid, oid, schema, table, statement, waited, blockers in conn.execute(
            _WAITERS, {"app": application_name(dsn)}).fetchall():
        if blockers:
            found.append(LockWaiter(pid=int(pid), table=f"{schema}.{table}", oid=int(oid), statement=statement,
                                    waiting_seconds=float(waited or 0.0), blockers=tuple(int(b) for b in blockers)))
    return sorted(found, key=lambda w: -w.waiting_seconds)


def end_copy_reads(conn: Any, dsn: str, blockers: tuple[int, ...], table_oid: int | None) -> int:
    """End the copy reads of sessions ``blockers`` and of every copy session holding a lock on
    ``table_oid``; how many were signalled."""
    row = conn.execute(_END, {"app": application_name(dsn), "pids": list(blockers),
                              "oid": table_oid if table_oid is not None else 0}).fetchone()
    return int(row[0]) if row else 0
