"""The throwaway MariaDB has the binlog set up for replication and a ``repl`` account with its grants."""

from __future__ import annotations

import pymysql

from headrace.source.mysql.throwaway import ThrowawayMariaDB


def test_server_has_row_binlog_and_repl_account(mariadb_server: ThrowawayMariaDB,
                                                mysql_db: tuple[str, str]) -> None:
    conn = pymysql.connect(host="127.0.0.1", port=mariadb_server.port, user="repl", password="repl",
                           database=mysql_db[0])
    with conn.cursor() as cur:
        cur.execute("SELECT @@log_bin, @@binlog_format, @@binlog_row_image, @@binlog_row_metadata")
        assert cur.fetchone() == (1, "ROW", "FULL", "FULL")
        cur.execute("SHOW GRANTS")
        grants = cur.fetchone()[0]
        assert "REPLICATION SLAVE" in grants and "SELECT" in grants
    conn.close()
