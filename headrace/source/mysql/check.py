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
# MariaDB types whose binlog form (fixed binary) cannot be told from BINARY(n) in a TABLE_MAP.
UNSUPPORTED_TYPES = {"uuid": "CHAR(36)", "inet6": "VARCHAR(39)", "inet4": "VARCHAR(15)"}
_NO_SELECT = (1142, 1143)  # ER_TABLEACCESS_DENIED_ERROR, ER_COLUMNACCESS_DENIED_ERROR


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
        cur.execute("SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = %s"
                    " AND table_name = %s ORDER BY ordinal_position", (table.schema, table.name))
        for name, data_type in cur.fetchall():
            replacement = UNSUPPORTED_TYPES.get(str(data_type).lower())
            if replacement:
                problems.append(
                    f"column {name} of {table} has type {data_type}, which the binlog does not describe (it reads as"
                    f" BINARY): run ALTER TABLE {quoted} MODIFY `{name}` {replacement} or leave the table out")
    return problems


def check_server(conn: Conn, tables: Sequence[TableName]) -> list[str]:
    """Everything that stops replication of ``tables`` from this server, as sentences with their fix;
    an empty list means the source is ready."""
    problems = server_problems(conn)
    for table in tables:
        problems.extend(table_problems(conn, table))
    return problems
