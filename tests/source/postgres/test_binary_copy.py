"""The binary copy's per-column routes, read from a real table: what comes typed, split or as text."""

from __future__ import annotations

import datetime as dt
import time

import psycopg

from headrace.source.postgres.binary_copy import Route, SnapshotSession, column_routes, copy_chunk_binary
from headrace.source.postgres.catalog import read_table_schema
from headrace.source.postgres.copy import OPEN_END, copy_chunk

DDL = """
CREATE DOMAIN bc_small AS smallint;
CREATE TYPE bc_pair AS (a int, b text);
CREATE TABLE bc_routes (id bigint PRIMARY KEY, small bc_small, flag boolean, ratio real, body text,
                        name varchar(20), code char(4), amount numeric(12,2), pair bc_pair, addr inet,
                        day date, at timestamptz);
INSERT INTO bc_routes VALUES
  (1, 7, true, 1.5, '', 'x', 'ab', 12.5, '(,)', '10.0.0.1', '2024-02-29', '2024-01-01 10:00:00+02'),
  (2, NULL, NULL, 'NaN', NULL, NULL, NULL, NULL, NULL, NULL, 'infinity', '0044-03-15 10:00:00+00 BC');
"""


def test_routes_and_values_match_the_text_path(source_dsn: str) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute(DDL)
        table = read_table_schema(conn, "public.bc_routes")
    B, S, T = Route.BINARY, Route.SPLIT, Route.TEXT
    assert column_routes(table) == [B, B, B, B, B, B, T, T, T, T, S, S]

    got = {r["c0"]: r for b in copy_chunk_binary(source_dsn, None, table, 0, OPEN_END) for r in b.to_pylist()}
    text = {int(r["c0"]): r for b in copy_chunk(source_dsn, None, table, 0, OPEN_END) for r in b.to_pylist()}
    assert got[1]["c1"] == 7 and got[1]["c2"] is True and got[1]["c4"] == "" and got[2]["c4"] is None
    for i in (6, 7, 8, 9):  # text route: exactly the CSV path's text, a composite of NULLs included
        assert [got[k][f"c{i}"] for k in (1, 2)] == [text[k][f"c{i}"] for k in (1, 2)], i
    assert got[1]["c8"] == "(,)" and got[1]["c9"] == "10.0.0.1" and got[1]["c6"] == "ab  "
    # split: in-range values typed, the rest as text for the range rules
    assert (got[1]["c10"], got[1]["t10"]) == (dt.date(2024, 2, 29), None)
    assert (got[2]["c10"], got[2]["t10"]) == (None, "infinity")
    assert got[1]["c11"] == dt.datetime(2024, 1, 1, 8, tzinfo=dt.timezone.utc) and got[1]["t11"] is None
    assert (got[2]["c11"], got[2]["t11"]) == (None, "0044-03-15 10:00:00+00 BC")


def test_a_parked_session_outlives_the_servers_idle_in_transaction_timeout(source_dsn: str) -> None:
    """A session parked between small tables' reads is in no transaction: a database's
    ``idle_in_transaction_session_timeout`` cannot end it, and a backend still exiting after its close
    shows idle after ROLLBACK (released), not as a read."""
    dbname = psycopg.conninfo.conninfo_to_dict(source_dsn)["dbname"]
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{dbname}" SET idle_in_transaction_session_timeout = 100')
        conn.execute("CREATE TABLE parked (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO parked SELECT g, g::text FROM generate_series(1, 50) g")
        schema = read_table_schema(conn, "public.parked")
        session = SnapshotSession(source_dsn, None, "public.parked")
        try:
            assert sum(b.num_rows for b in session.read(schema, 0, OPEN_END)) == 50
            time.sleep(0.5)  # five times the timeout, parked
            assert sum(b.num_rows for b in session.read(schema, 0, OPEN_END)) == 50
            session._cur.execute("SELECT pg_backend_pid()")
            pid = session._cur.fetchone()[0]
        finally:
            session.close()
        # the backend exits a moment after the close: its last row is read once it is gone or after 5 s
        for _ in range(50):
            state = conn.execute("SELECT state, query FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
            if state is None:
                break
            time.sleep(0.1)
        assert state is None or state == ("idle", "ROLLBACK"), state


def test_a_parked_session_holds_no_lock_on_the_tables_it_read(source_dsn: str) -> None:
    """Issue 35: a parked session that had read a table held its ACCESS SHARE lock until the round
    ended; an ALTER TABLE queued behind it, and the application's writes behind the ALTER."""
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE customers (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO customers SELECT g, g::text FROM generate_series(1, 50) g")
        schema = read_table_schema(conn, "public.customers")
        session = SnapshotSession(source_dsn, None, "public.customers")
        try:
            assert sum(b.num_rows for b in session.read(schema, 0, OPEN_END)) == 50
            conn.execute("SET lock_timeout = '2s'")  # fails the ALTER instead of hanging the test
            conn.execute("ALTER TABLE customers ADD COLUMN extra int NOT NULL DEFAULT 2")
            conn.execute("INSERT INTO customers VALUES (51, 'after', 3)")
            assert sum(b.num_rows for b in session.read(schema, 0, OPEN_END)) == 51  # and reads on
        finally:
            session.close()
