"""``check_server``: a ready server gives no problems; each missing setting or grant is named with its fix."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from headrace.control.assess import assess_config, format_assessment
from headrace.core.names import TableName
from headrace.source.mysql.catalog import list_tables
from headrace.source.mysql.check import check_server
from headrace.source.mysql.connect import connect
from headrace.source.mysql.throwaway import ThrowawayMariaDB
from tests.e2e.helpers import make_config


def test_ready_server_and_table_problems(mariadb_server: ThrowawayMariaDB, mysql_db: tuple[str, str]) -> None:
    database, dsn = mysql_db
    with contextlib.closing(connect(mariadb_server.root_dsn + database)) as root, root.cursor() as cur:
        cur.execute("CREATE TABLE keyed (id INT PRIMARY KEY)")
        cur.execute("CREATE TABLE keyless (v TEXT)")
        cur.execute("CREATE TABLE odd (id INT PRIMARY KEY, u UUID, i INET6)")  # MariaDB's own types: fine
        cur.execute("CREATE VIEW v AS SELECT * FROM keyed")
    with contextlib.closing(connect(dsn)) as conn:
        assert list_tables(conn, [database]) == [TableName(database, n) for n in ("keyed", "keyless", "odd")]
        ready = [TableName(database, n) for n in ("keyed", "keyless", "odd")]
        assert check_server(conn, ready) == []
        problems = check_server(conn, [TableName(database, n) for n in ("v", "gone")])
    assert len(problems) == 2
    assert "is not a table (VIEW)" in problems[0] and f"{database}.gone does not exist" in problems[1]


def test_misconfigured_server_and_account(tmp_path: Any, source_dsn: str) -> None:
    settings = {"binlog_format": "STATEMENT", "binlog_row_metadata": "NO_LOG", "expire_logs_days": "0",
                "binlog_expire_logs_seconds": "3600"}
    with ThrowawayMariaDB(str(tmp_path), settings) as server:
        with contextlib.closing(connect(server.root_dsn)) as root, root.cursor() as cur:
            cur.execute("CREATE DATABASE shop")
            cur.execute("CREATE TABLE shop.orders (id INT PRIMARY KEY)")
            cur.execute("CREATE USER 'weak'@'%' IDENTIFIED BY 'weak'")
            cur.execute("CREATE TABLE shop.items (id INT PRIMARY KEY)")
            cur.execute("GRANT INSERT ON shop.items TO 'weak'@'%'")  # visible, but not readable
        weak = server.dsn.replace("repl:repl", "weak:weak")
        with contextlib.closing(connect(weak)) as conn:
            problems = check_server(conn, [TableName("shop", "orders"), TableName("shop", "items")])
        # `headrace check` (the source's own check, then its assessment): each problem on one line, once.
        config = make_config(weak + "shop", Path(tmp_path), ["shop.orders", "shop.items"], "ducklake",
                             source={"state_dsn": source_dsn})
        assessment = assess_config(config)
    text = format_assessment(config.name, assessment)
    lines = [line for line in text.splitlines() if line.startswith("  - ")]
    assert len(lines) == len(set(lines)) == len(assessment["problems"]) == 7, text
    assert sum("binlog_row_metadata is NO_LOG" in line for line in lines) == 1
    assert text.startswith(f"7 problem(s) with pipeline {config.name}:")
    assert any(p.startswith("binlog_format is STATEMENT: run SET GLOBAL binlog_format = 'ROW'") for p in problems)
    assert any(p.startswith("binlog_row_metadata is NO_LOG") for p in problems)
    assert any("kept 3600 s only" in p for p in problems)
    assert any("lacks REPLICATION SLAVE" in p and "GRANT REPLICATION SLAVE ON *.* TO 'weak'@'%'" in p
               for p in problems)
    assert any("lacks REPLICATION CLIENT" in p for p in problems)
    assert any(p.startswith("table shop.orders does not exist or the account may not see it")
               and "GRANT SELECT ON `shop`.`orders`" in p for p in problems)
    assert any(p.startswith("no SELECT privilege on shop.items: run GRANT SELECT ON `shop`.`items`") for p in problems)
    assert len(problems) == 7
