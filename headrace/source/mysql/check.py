"""Is a MySQL/MariaDB server ready for headrace? Every problem as a sentence naming the object and the fix.

The same result type as the PostgreSQL check (``source.postgres.catalog.check_source``): a list of
human sentences, empty when the source is ready. Tables without a primary key are no problem: the
binlog carries whole row images (``binlog_row_image=FULL``), so they replicate as multisets, as
PostgreSQL tables with REPLICA IDENTITY FULL do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pymysql

from headrace.core.names import TableName

Conn = Any  # a pymysql connection
# Shorter retention than this means a day's outage of headrace loses the binlog it needs.
MIN_RETENTION_S = 24 * 3600
_NO_SELECT = (1142, 1143)  # ER_TABLEACCESS_DENIED_ERROR, ER_COLUMNACCESS_DENIED_ERROR
_SPECIFIC_ACCESS_DENIED = 1227  # ER_SPECIFIC_ACCESS_DENIED_ERROR (SHOW SLAVE HOSTS without the privilege)


def _variables(conn: Conn, names: Sequence[str]) -> dict[str, str]:
    with conn.cursor() as cur:
        marks = ", ".join(["%s"] * len(names))
        cur.execute(f"SHOW GLOBAL VARIABLES WHERE Variable_name IN ({marks})", tuple(names))
        return {str(name).lower(): str(value) for name, value in cur.fetchall()}


def _setting_problem(name: str, value: str | None, wanted: str) -> str | None:
    if value is None:
        return (f"the server has no variable {name}: headrace needs MariaDB 10.5+ or MySQL 8.0.14+"
                f" (for {name} = {wanted})")
    if value.upper() != wanted:
        return (f"{name} is {value}: run SET GLOBAL {name} = '{wanted}' and add `{name} = {wanted}` under"
                " [mysqld] in my.cnf")
    return None


def server_problems(conn: Conn) -> list[str]:
    """What the server's configuration and the connected account lack for binlog replication."""
    settings = _variables(conn, ["log_bin", "binlog_format", "binlog_row_image", "binlog_row_metadata",
                                 "server_id", "binlog_expire_logs_seconds", "expire_logs_days"])
    problems = []
    if settings.get("log_bin", "OFF").upper() not in ("ON", "1"):
        problems.append("the binary log is off (log_bin): add `log_bin = binlog` and `server_id = 1` under [mysqld]"
                        " in my.cnf and restart the server")
    for name, wanted in (("binlog_format", "ROW"), ("binlog_row_image", "FULL"), ("binlog_row_metadata", "FULL")):
        problem = _setting_problem(name, settings.get(name), wanted)
        if problem:
            problems.append(problem)
    if settings.get("server_id", "0") == "0":
        problems.append("server_id is 0 (a server with the binlog needs one): add `server_id = 1` (unique among"
                        " the server and its replicas) under [mysqld] in my.cnf and restart")
    seconds = int(float(settings.get("binlog_expire_logs_seconds") or 0))
    if not seconds:
        seconds = int(float(settings.get("expire_logs_days") or 0) * 86400)
    if 0 < seconds < MIN_RETENTION_S:
        problems.append(f"binary logs are kept {seconds} s only: an outage of headrace longer than that needs a"
                        f" full resync; run SET GLOBAL binlog_expire_logs_seconds = 604800 and add it to my.cnf")
    problems.extend(_privilege_problems(conn))
    return problems


def _privilege_problems(conn: Conn) -> list[str]:
    with conn.cursor() as cur:
        cur.execute("SELECT CURRENT_USER()")
        user, _, host = str(cur.fetchone()[0]).rpartition("@")
        cur.execute("SELECT privilege_type FROM information_schema.user_privileges WHERE grantee = %s",
                    (f"'{user}'@'{host}'",))
        granted = {str(r[0]).upper() for r in cur.fetchall()}
    account = f"'{user}'@'{host}'"
    problems = []
    if "REPLICATION SLAVE" not in granted and "SUPER" not in granted:
        problems.append(f"account {account} lacks REPLICATION SLAVE (to read the binlog): run GRANT REPLICATION"
                        f" SLAVE ON *.* TO {account}")
    # MariaDB 10.5 renamed REPLICATION CLIENT to BINLOG MONITOR.
    if not granted & {"REPLICATION CLIENT", "BINLOG MONITOR", "SUPER"}:
        problems.append(f"account {account} lacks REPLICATION CLIENT (to read binlog positions): run GRANT"
                        f" REPLICATION CLIENT ON *.* TO {account}")
    return problems


def table_problems(conn: Conn, table: TableName) -> list[str]:
    """Why ``table`` (``database.table``) cannot be replicated (empty when it can)."""
    quoted = f"`{table.schema.replace('`', '``')}`.`{table.name.replace('`', '``')}`"
    with conn.cursor() as cur:
        cur.execute("SELECT table_type FROM information_schema.tables WHERE table_schema = %s AND table_name = %s",
                    (table.schema, table.name))
        row = cur.fetchone()
        if row is None:
            # information_schema hides tables the account has no privilege on.
            return [f"table {table} does not exist or the account may not see it: create it, remove it from the"
                    f" table list, or run GRANT SELECT ON {quoted} TO <headrace account>"]
        if row[0] != "BASE TABLE":
            return [f"{table} is not a table ({row[0]}): only tables can be replicated"]
        problems = []
        try:
            cur.execute(f"SELECT 1 FROM {quoted} LIMIT 0")
            cur.fetchall()
        except pymysql.err.OperationalError as exc:
            if not exc.args or exc.args[0] not in _NO_SELECT:
                raise
            problems.append(f"no SELECT privilege on {table}: run GRANT SELECT ON {quoted} TO <headrace account>")
    return problems


def replica_id_problems(conn: Conn, server_id: int, tag: str, derived: bool) -> list[str]:
    """Why the binlog client's ``server_id`` would clash: it is the server's own, or another replica
    registered under it (``SHOW SLAVE HOSTS``; a registration reported as ``tag`` is this pipeline's
    own, e.g. a connection left by a killed run). MariaDB drops the older of two dump connections with one
    id, so two clients with the same id would take turns failing. ``derived``: the id comes from the
    pipeline name (no ``source.server_id``). Without the privilege SHOW SLAVE HOSTS needs (REPLICATION
    MASTER ADMIN on MariaDB 10.5+, REPLICATION SLAVE on MySQL) only the server's own id is checked."""
    origin = "derived from the pipeline name" if derived else "source.server_id"
    fix = ("set `server_id: <a number no server or replica of this source uses>` under source: in the pipeline"
           " file")
    with conn.cursor() as cur:
        cur.execute("SELECT @@server_id")
        if int(cur.fetchone()[0]) == server_id:
            return [f"the binlog client's server_id {server_id} ({origin}) is the source server's own server_id: {fix}"]
        try:
            cur.execute("SHOW SLAVE HOSTS")
            hosts = cur.fetchall()
        except pymysql.err.OperationalError as exc:
            if exc.args and exc.args[0] == _SPECIFIC_ACCESS_DENIED:
                return []
            raise
    others = [str(row[1]) for row in hosts if int(row[0]) == server_id and str(row[1]) != tag]
    if others:
        return [f"the binlog client's server_id {server_id} ({origin}) is already used by replica {others[0]!r}"
                f" (SHOW SLAVE HOSTS): the two connections would drop each other; {fix}"]
    return []


def check_server(conn: Conn, tables: Sequence[TableName]) -> list[str]:
    """Everything that stops replication of ``tables`` from this server, as sentences with their fix;
    an empty list means the source is ready."""
    problems = server_problems(conn)
    for table in tables:
        problems.extend(table_problems(conn, table))
    return problems
