"""The copy's metadata locks on a MySQL/MariaDB source: who waits for them, and how a copy gives way.

A chunk's transaction holds a shared metadata lock on its table until it ends. A DDL statement
waits for it ("Waiting for table metadata lock"), and every statement on that table queued after the
DDL waits behind it. MariaDB tells who waits but not for whom without a plugin
(``metadata_lock_info``) or the performance schema (off by default), so the copy's reads carry a
comment naming their table's id (``marked``), and a waiter is matched to the reads of the table its
statement names. ``KILL QUERY`` ends a read; its chunk then fails, the connection closes and the
transaction with it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from headrace.source.base import LockWaiter

_MARK = re.compile(r"/\* headrace copy (\d+) \*/")
_FROM = re.compile(r"FROM `((?:[^`]|``)+)`\.`((?:[^`]|``)+)`")


def marked(oid: int) -> str:
    """The comment a copy's statement on table ``oid`` starts with (``SELECT <this> ...``)."""
    return f"/* headrace copy {oid} */"


@dataclass(frozen=True)
class _Read:
    id: int
    oid: int
    database: str
    table: str


def _copy_reads(rows: list[tuple[Any, ...]]) -> list[_Read]:
    reads = []
    for id_, _db, _state, info, _ms in rows:
        mark, where = _MARK.search(info or ""), _FROM.search(info or "")
        if mark and where:
            reads.append(_Read(int(id_), int(mark.group(1)), where.group(1).replace("``", "`"),
                               where.group(2).replace("``", "`")))
    return reads


def _names(statement: str, database: str | None, read: _Read) -> bool:
    """Whether ``statement`` (run in ``database``) names ``read``'s table."""
    table = re.escape(read.table.lower())
    text = statement.lower()
    if not re.search(rf"(?<![\w$]){table}(?![\w$])", text):
        return False
    return database == read.database or read.database.lower() in text


def _processlist(conn: Any) -> list[tuple[Any, ...]]:
    with conn.cursor() as cur:
        cur.execute("SELECT ID, DB, STATE, INFO, TIME_MS FROM information_schema.PROCESSLIST"
                    " WHERE ID <> CONNECTION_ID()")
        return list(cur.fetchall())


def lock_waiters(conn: Any) -> list[LockWaiter]:
    """Sessions waiting for a metadata lock on a table a copy is reading, longest waiting first."""
    rows = _processlist(conn)
    reads = _copy_reads(rows)
    found = []
    for id_, db, state, info, ms in rows:
        if state != "Waiting for table metadata lock" or not info:
            continue
        blockers = [r for r in reads if _names(info, db, r)]
        if blockers:
            first = blockers[0]
            found.append(LockWaiter(pid=int(id_), table=f"{first.database}.{first.table}", oid=first.oid,
                                    statement=" ".join(str(info).split())[:300],
                                    waiting_seconds=float(ms or 0) / 1000, blockers=tuple(r.id for r in blockers)))
    return sorted(found, key=lambda w: -w.waiting_seconds)


def end_copy_reads(conn: Any, blockers: tuple[int, ...], table_oid: int | None) -> int:
    """``KILL QUERY`` the copy reads ``blockers`` and every copy read of table ``table_oid``."""
    ids = {r.id for r in _copy_reads(_processlist(conn)) if r.id in blockers or r.oid == table_oid}
    with conn.cursor() as cur:
        for id_ in ids:
            cur.execute(f"KILL QUERY {int(id_)}")
    return len(ids)
