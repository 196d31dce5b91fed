"""The server a MySQL/MariaDB pipeline reads, and where on it the stream starts.

``server_identity`` names a server; ``stream_start`` decides, from what state recorded with the
captured position (``gtid.Resume``), whether the stream continues by file and offset (the same
server) or from its GTID state on another server of the replication topology (a failover or a
switchover: the replica's binlog holds the same transactions under the same GTIDs, at its own
offsets), and refuses a server whose binlog does not hold that state, naming the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pymysql

from headrace.core.errors import SourceError
from headrace.core.settings import redacted_dsn
from headrace.source.mysql.gtid import MariaDbGtidPosition, MySqlGtidSet, Resume
from headrace.source.mysql.position import epoch_of


def server_identity(conn: Any) -> str:
    """A stable name for the server: MySQL's ``server_uuid``. MariaDB has none: its ``server_uid`` (a hash
    of the host's hardware address, the data directory and the port: the same across restarts, another
    for every other server, measured in tests/source/mysql/test_identity.py) with ``server_id`` and
    ``gtid_domain_id``, as ``mariadb:server_uid=...,server_id=N,gtid_domain_id=N``."""
    with conn.cursor() as cur:
        try:
            cur.execute("SELECT @@server_uuid")
            return str(cur.fetchone()[0])
        except pymysql.err.OperationalError:
            pass
        cur.execute("SELECT @@server_id, @@gtid_domain_id")
        server_id, domain = cur.fetchone()
        cur.execute("SHOW GLOBAL VARIABLES LIKE 'server_uid'")  # MariaDB 10.3+
        row = cur.fetchone()
        uid = f"server_uid={row[1]}," if row else ""
        return f"mariadb:{uid}server_id={server_id},gtid_domain_id={domain}"


def identity_fields(identity: str) -> dict[str, str]:
    """``server_identity``'s fields (``{"server_uuid": ...}`` for MySQL's plain UUID)."""
    if not identity.startswith("mariadb:"):
        return {"server_uuid": identity}
    return dict(part.split("=", 1) for part in identity.removeprefix("mariadb:").split(",") if "=" in part)


def same_server(recorded: str, now: str) -> bool:
    """Whether identity ``now`` is the server ``recorded`` names: the fields both have agree (a state
    recorded before ``server_uid`` was part of the identity compares on the rest)."""
    a, b = identity_fields(recorded), identity_fields(now)
    return bool(a.keys() & b.keys()) and all(a[k] == b[k] for k in a.keys() & b.keys())


def gtid_at(cur: Any, mariadb: bool, file: str, offset: int) -> str | None:
    """The GTID state at ``file``:``offset`` of the server (MariaDB's ``BINLOG_GTID_POS``; None where it
    cannot tell: MySQL, or an offset that is no event boundary)."""
    if not mariadb:
        return None
    cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (file, offset))
    row = cur.fetchone()
    return None if row is None or row[0] is None else str(row[0])



@dataclass(frozen=True)
class StreamStart:
    """Where the stream starts: ``position`` (state's captured one) and this server's ``epoch`` in the
    positions; ``gtid`` set: from that GTID state, ``position`` being on another server."""

    position: int
    epoch: int
    gtid: str | None = None


def stream_start(conn: Any, dsn: str, pipeline: str, recorded: str, captured: int, token: str | None) -> StreamStart:
    """Where pipeline ``pipeline`` (set up on server ``recorded``, captured up to ``captured`` with
    resume ``token``) continues on the server of ``conn``; SourceError naming the fix when it cannot."""
    now = server_identity(conn)
    resume = Resume.from_token(token)
    if resume is None:
        if same_server(recorded, now):
            return StreamStart(captured, epoch_of(captured))
        raise SourceError(_another_server(dsn, pipeline, now, recorded, "no GTID position was recorded yet"))
    if same_server(resume.server, now):
        return StreamStart(captured, resume.epoch)
    problem = failover_problem(conn, resume, now)
    if problem is not None:
        raise SourceError(_another_server(dsn, pipeline, now, resume.server, problem))
    return StreamStart(captured, resume.epoch + 1, resume.gtid)


def failover_problem(conn: Any, resume: Resume, now: str) -> str | None:
    """Why server ``now`` (of ``conn``) cannot continue from ``resume``'s GTID state, or None when its
    binlog holds that state: a replica of the server read before (with ``log_slave_updates``), or a
    primary promoted from one. MariaDB's GTIDs carry no server UUID: a replica is told from an unrelated
    server with the same ids by its own ``server_id``, which must differ from the one read before."""
    flavor = "mariadb" if now.startswith("mariadb:") else "mysql"
    if flavor != resume.flavor:
        return f"its GTIDs are {flavor}'s, the recorded position {resume.gtid!r} is {resume.flavor}'s"
    with conn.cursor() as cur:
        if flavor == "mysql":
            cur.execute("SELECT @@gtid_executed")
            executed = str(cur.fetchone()[0] or "")
            if not MySqlGtidSet(executed).contains(MySqlGtidSet(resume.gtid)):
                return f"its gtid_executed ({executed}) does not hold the recorded GTID set {resume.gtid}"
            return None
        read_before = identity_fields(resume.server).get("server_id")
        if read_before is not None and identity_fields(now).get("server_id") == read_before:
            return (f"it has the server_id ({read_before}) of the server read before, so it is not a replica of it"
                    " (a replica has a server_id of its own)")
        cur.execute("SELECT @@gtid_binlog_state")
        state = str(cur.fetchone()[0] or "")
    missing = MariaDbGtidPosition(resume.gtid).behind(state)
    if missing:
        return (f"its binlog (gtid_binlog_state {state or 'empty'}) does not hold GTID {', '.join(missing)} of the"
                " recorded position: it is behind the server read before (wait for it to catch up), or does"
                " not log what it replicates (set log_slave_updates = ON)")
    return None


def _another_server(dsn: str, pipeline: str, now: str, recorded: str, why: str) -> str:
    return (f"the source {redacted_dsn(dsn)} is another MariaDB/MySQL server than the one pipeline {pipeline} read"
            f" (now {now}; recorded {recorded}), and it cannot continue there: {why}. Point source.dsn back at the"
            " server read before, or at a replica of it whose binlog holds the recorded GTID position, or copy"
            " every table again from this one: `headrace reset -c <pipeline file> --yes`, then run (MariaDB's"
            " server_uid changes with the host, the data directory or the port)")

