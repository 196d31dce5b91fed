"""The binary copy's per-column routes, read from a real table: what comes typed, split or as text."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from headrace.source.postgres.binary_copy import Route, SnapshotSession, column_routes, copy_chunk_binary
from headrace.source.postgres.catalog import read_table_schema
from headrace.source.postgres.copy import APPLICATION_NAME, OPEN_END, copy_chunk

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
            pid = conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s AND datname = %s",
                               (APPLICATION_NAME, dbname)).fetchone()[0]  # type: ignore[index]
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


MATRIX = """
CREATE TABLE bc_matrix ("Id" bigint PRIMARY KEY, "a flag" boolean, i int, s smallint, l bigint, r real,
                        d double precision, b bytea, t text, v varchar(300), day date, ts timestamp,
                        tz timestamptz, n numeric);
INSERT INTO bc_matrix VALUES
  (1, true, 2147483647, 32767, 9223372036854775807, 'Infinity', '-Infinity', '\\x00ff00', 'Zürich ☃ 𝄞', '',
   '0001-01-01', '0001-01-01 00:00:00', '9999-12-31 23:59:59.999999+00', 'NaN'),
  (2, false, -2147483648, -32768, -9223372036854775808, '-0', 1e308, '\\x', '', 'x',
   '9999-12-31', '9999-12-31 23:59:59.999999', '0001-01-01 00:00:00+00', -1.5),
  (3, NULL, NULL, NULL, NULL, 'NaN', 'NaN', NULL, NULL, NULL, NULL, NULL, NULL, NULL),
  (4, true, 0, 0, 0, 1.17549435e-38, 4.9e-324, decode(repeat('ab', 300000), 'hex'), repeat('é', 700000), 'v',
   '2000-01-01', '2000-01-01 00:00:00', '1970-01-01 00:00:00+00', 123456789012345678901234567890.123);
INSERT INTO bc_matrix SELECT g, g % 2 = 0, g, g % 1000, g::bigint * 1000003, g / 7.0, g / 3.0, int8send(g::bigint), 'row ' || g,
                             CASE WHEN g % 5 = 0 THEN NULL ELSE md5(g::text) END, date '2024-01-01' + g % 400,
                             timestamp '2024-01-01' + g * interval '1 second', timestamptz '2024-01-01' + g * interval '1 ms', g
                      FROM generate_series(5, 140000) g;
CREATE TABLE bc_empty (id int PRIMARY KEY, t text);
"""


def test_the_native_decoder_reads_what_the_adbc_driver_reads(source_dsn: str, monkeypatch: Any) -> None:
    """``headrace._copy_binary`` against the ADBC driver (a decoder that is not ours) on every kind's
    extremes, NULLs, Unicode, a 1.4 MB value, more rows than one batch, and an empty table."""
    from headrace.source.postgres import binary_copy

    assert binary_copy._decode is not None, "the C extension is not built (setup.py build_ext --inplace)"
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute(MATRIX)
        tables = [read_table_schema(conn, name) for name in ("public.bc_matrix", "public.bc_empty")]

    def read_all(table: Any) -> Any:
        session = SnapshotSession(source_dsn, None, table.qualified_name)
        try:
            return pa.Table.from_batches(session.read(table, 0, OPEN_END), binary_copy.arrow_schema(table))
        finally:
            session.close()

    native = [read_all(t) for t in tables]
    assert [len(b) for b in SnapshotSession(source_dsn, None, "x").read(tables[0], 0, OPEN_END)][:2] == [
        binary_copy.BATCH_ROWS, binary_copy.BATCH_ROWS]
    monkeypatch.setattr(binary_copy, "_decode", None)
    driver = [read_all(t) for t in tables]
    assert native[1].num_rows == 0 and driver[1].num_rows == 0
    assert native[0].num_rows == 140_000
    for name in native[0].column_names:  # NaN equal to NaN, -0.0 told from 0.0
        assert [_same(v) for v in native[0].column(name).to_pylist()] == \
            [_same(v) for v in driver[0].column(name).to_pylist()], name
    first = {r["c0"]: r for r in native[0].slice(0, 4).to_pylist()}
    assert first[1]["c8"] == "Zürich ☃ 𝄞" and first[4]["c8"] == "é" * 700_000 and first[4]["c7"] == b"\xab" * 300_000
    assert first[2]["c5"] == 0.0 and str(first[2]["c5"]) == "-0.0" and first[1]["c3"] == 32767


def _same(value: Any) -> Any:
    return repr(value) if isinstance(value, float) else value


def test_a_malformed_stream_is_an_error_not_a_crash() -> None:
    from headrace import _copy_binary

    header = b"PGCOPY\n\xff\r\n\x00" + b"\x00" * 8
    row = b"\x00\x02" + b"\x00\x00\x00\x04" + (7).to_bytes(4, "big") + b"\xff\xff\xff\xff"
    columns, rows, pos, done = _copy_binary.decode(header + row + b"\xff\xff", 0, b"is", 10)
    assert (rows, done, pos) == (1, True, len(header + row) + 2) and columns[1][3] == 1
    for broken in (b"PGCOPX", header + row[:-3], header + b"\x00\x03" + row[2:], header + row[:2] + b"\x00\x00\x00\x03abc"):
        with pytest.raises(ValueError):
            _copy_binary.decode(broken, 0, b"is", 10)
