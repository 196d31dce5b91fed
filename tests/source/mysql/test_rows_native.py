"""Row events decoded in C (``rows_native``, ``headrace/_binlog_rows.c``) against mysql-replication's
Python decoder: the same changes, value for value, for every type the C decoder takes; a table with
a type it does not take (the type matrix of test_types) stays on the Python decoder. Whole row
events read in C and handed to capture as bytes (``staged``) stage the same rows as the Python
decoder's events, on both tables."""

from __future__ import annotations

import contextlib
import struct
from typing import Any

import pytest

from headrace.capture.buffer import TableBuffer, stage
from headrace.core.changes import Begin, Delete, Insert, Update
from headrace.source.mysql import rows_native, staged
from headrace.source.mysql.binlog import BinlogStream
from headrace.source.mysql.catalog import table_id
from headrace.source.mysql.connect import connect
from headrace.source.mysql.position import to_int

pytestmark = pytest.mark.skipif(not rows_native.available(), reason="headrace._binlog_rows not built")

COLUMNS = """id INT PRIMARY KEY, ti TINYINT, tiu TINYINT UNSIGNED, si SMALLINT, siu SMALLINT UNSIGNED,
mi MEDIUMINT, miu MEDIUMINT UNSIGNED, i INT, iu INT UNSIGNED, bi BIGINT, biu BIGINT UNSIGNED,
fl FLOAT, db DOUBLE, d DECIMAL(10,2), dw DECIMAL(65,30), d20 DECIMAL(30,20), d0 DECIMAL(5,0), d9 DECIMAL(9,9),
c CHAR(5), vc VARCHAR(300), tx TEXT, ltx LONGTEXT, vb VARBINARY(8), bl BLOB, js JSON,
dt DATE, dtm DATETIME, dtm3 DATETIME(3), dtm6 DATETIME(6), ts TIMESTAMP NULL, ts3 TIMESTAMP(3) NULL,
ts6 TIMESTAMP(6) NULL, y YEAR"""
ROWS = [
    "(1, -128, 255, -32768, 65535, -8388608, 16777215, -2147483648, 4294967295, -9223372036854775808,"
    " 18446744073709551615, 1.1, 0.1, -12345678.90,"
    " '-12345678901234567890123456789012345.123456789012345678901234567890',"
    " '1234567890.00000000000000000001', 99999, -0.123456789, 'ab', REPEAT('é😀', 150), 'long 😀',"
    " REPEAT('z', 70000), x'00ff', x'deadbeef00', '{\"k\": [1, 2.5]}', '0999-02-28', '2024-02-29 23:59:59',"
    " '2024-01-01 00:00:00.5', '1999-12-31 23:59:59.000001', '2038-01-19 03:14:07', '1970-01-01 00:00:01.500',"
    " '2001-09-09 01:46:40.000001', 2155)",
    "(2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -3.4028235e38, 2.2250738585072014e-308, 0, 0, 0, 0, 0, '', '', '', '',"
    " '', '', 'null', '0000-00-00', '0000-00-00 00:00:00', '2024-00-10 00:00:00', '2024-01-01 00:00:00',"
    " '0000-00-00 00:00:00', '2000-02-29 12:00:00', '2000-01-01 00:00:00', 0)",
    "(3, 127, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1e-7, 1e22, -0.01, NULL, NULL, NULL, NULL,"
    " NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1901)",
    "(4, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, -0.0, 100, NULL, NULL, NULL, NULL, NULL,"
    " NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
]


def _changes(dsn: str, database: str, table: str, start: int, count: int, native: bool,
             as_staged: bool = False) -> tuple[list[Any], Any]:
    stream = BinlogStream(dsn, 903 + native + 2 * as_staged, start, {(database, table)}, native=native,
                          staged=as_staged)
    changes: list[Any] = []
    try:
        while len(changes) < count:
            changes += [e for _pos, e in stream.read(100, 1.0) if isinstance(e, Insert | Update | Delete | bytes)]
    finally:
        stream.close()
    return changes, stream


def _staged(changes: list[Any], stream: Any, oid: int) -> tuple[list[Any], ...]:
    """The rows capture stages from ``changes`` (events or staged bytes), as the staging columns."""
    relations = {oid: stream.schema(oid)}
    buffers = {oid: TableBuffer(relations[oid])}
    for seq, change in enumerate(changes):
        stage(change, Begin(7, 1, 2), seq, relations, buffers, staged.CODEC)
    return buffers[oid].buffer.columns


def _write_rows(cur: Any) -> int:
    """The test's rows, two updates (one moving a key) and two deletes; the position before them."""
    cur.execute("SET sql_mode = ''")  # zero dates
    cur.execute("SHOW MASTER STATUS")
    start = to_int(*cur.fetchone()[:2])
    for row in ROWS:
        cur.execute(f"INSERT INTO nat VALUES {row}")
    cur.execute("UPDATE nat SET vc = 'changed', fl = 2.5, dtm6 = '2020-02-02 02:02:02.020202' WHERE id = 1")
    cur.execute("UPDATE nat SET id = 40 WHERE id = 4")  # a key change: the old key comes along
    cur.execute("DELETE FROM nat WHERE id IN (2, 3)")
    return start


@pytest.mark.skipif(staged.CODEC is None, reason="headrace._speedups not built")
def test_whole_events_in_c_stage_the_rows_of_the_python_decoder(mariadb_server: Any,
                                                                 mysql_db: tuple[str, str]) -> None:
    """On a table with a key and one without: the staged bytes stage what mysql-replication's events
    stage (zero dates too), and they came from C."""
    database, dsn = mysql_db
    with contextlib.closing(connect(mariadb_server.root_dsn + database)) as root, root.cursor() as cur:
        cur.execute(f"CREATE TABLE nat ({COLUMNS})")
        cur.execute(f"CREATE TABLE nokey ({COLUMNS.replace(' PRIMARY KEY', '')})")
        cur.execute("SET sql_mode = ''")  # zero dates
        cur.execute("SHOW MASTER STATUS")
        start = to_int(*cur.fetchone()[:2])
        for row in ROWS:
            cur.execute(f"INSERT INTO nat VALUES {row}")
            cur.execute(f"INSERT INTO nokey VALUES {row}")
        for table in ("nat", "nokey"):
            cur.execute(f"UPDATE {table} SET vc = 'changed', fl = 2.5 WHERE id = 1")
            cur.execute(f"UPDATE {table} SET id = 40 WHERE id = 4")
            cur.execute(f"DELETE FROM {table} WHERE id = 3")
    for table in ("nat", "nokey"):
        oid = table_id(database, table)
        native, native_stream = _changes(dsn, database, table, start, 7, native=True, as_staged=True)
        python, python_stream = _changes(dsn, database, table, start, 7, native=False)
        assert all(type(change) is bytes for change in native)
        assert all(type(change) is not bytes for change in python)
        assert _staged(native, native_stream, oid) == _staged(python, python_stream, oid)
        assert [staged.decode(change).relation_oid for change in native] == [oid] * 7


def test_c_decoder_equals_the_python_decoder(mariadb_server: Any, mysql_db: tuple[str, str]) -> None:
    database, dsn = mysql_db
    with contextlib.closing(connect(mariadb_server.root_dsn + database)) as root, root.cursor() as cur:
        cur.execute(f"CREATE TABLE nat ({COLUMNS})")
        start = _write_rows(cur)
    count = len(ROWS) + 2 + 2
    native, native_stream = _changes(dsn, database, "nat", start, count, native=True)
    python, python_stream = _changes(dsn, database, "nat", start, count, native=False)
    assert [s for _shape, s in native_stream._native.values()] != [None]  # the C decoder read them
    assert all(s is None for _shape, s in python_stream._native.values())
    assert native == python
    first = dict(zip(native_stream.schema(table_id(database, "nat")).column_names, native[0].new, strict=True))
    assert first["biu"] == "18446744073709551615" and first["fl"] == "1.1" and first["d9"] == "-0.123456789"
    assert first["dw"] == "-12345678901234567890123456789012345.123456789012345678901234567890"
    assert first["ts3"] == "1970-01-01 00:00:01.500000+00" and first["bl"] == "\\xdeadbeef00"
    assert len(first["ltx"]) == 70000 and first["dt"] == "0999-02-28"
    assert native[1].new[25:28] == ("-infinity", "-infinity", "-infinity")


def test_a_table_with_other_types_keeps_the_python_decoder(typed_table: tuple[str, str, int]) -> None:  # noqa: F811
    database, dsn, start = typed_table
    changes, stream = _changes(dsn, database, "typed", start, 3, native=True, as_staged=True)
    assert [s for _shape, s in stream._native.values()] == [None] and len(changes) == 3
    assert not any(type(change) is bytes for change in changes)  # events, as the Python decoder gives


from tests.source.mysql.test_types import typed_table  # noqa: E402, F401 (a fixture)


def _packet(event_type: int, body: bytes, checksum: int, table_id: int = 77) -> bytes:
    """A replication packet as the server sends it: the OK byte, the event header, the event."""
    event = struct.pack("<Q", table_id)[:6] + b"\x01\x00" + body + b"\xee" * checksum
    size = 19 + len(event)
    return b"\x00" + struct.pack("<IBIIIH", 1_700_000_000, event_type, 1, size, 4000 + size, 0) + event


def _row(number: int, text: str) -> bytes:
    """One image of (INT, VARCHAR(10)): no NULL, the int, the string with a 1-byte length."""
    raw = text.encode()
    return b"\x00" + struct.pack("<i", number) + bytes([len(raw)]) + raw


PLAN_SPECS = [(rows_native.K_INT, 4, 0), (rows_native.K_TEXT, 1, 0)]


@pytest.mark.parametrize("checksum", [0, 4])
def test_decode_event_reads_v1_and_v2_row_events(checksum: int) -> None:
    """Whole events without a server: MariaDB's v1 WRITE, MySQL's v2 UPDATE with extra data (both
    with and without the CRC32 after the event); as text tuples and as staged bytes."""
    decode_event = rows_native._decode_event
    assert decode_event is not None
    plans = {77: rows_native.plan(PLAN_SPECS, 123456789012345, True)}
    write = _packet(23, b"\x02\x03" + _row(-7, "héllo") + _row(8, ""), checksum)
    kind, table, log_pos, size, rows = decode_event(write, plans, checksum, False)
    assert (kind, table, log_pos - size, rows) == (0, 77, 4000, [("-7", "héllo"), ("8", "")])
    update = _packet(31, b"\x05\x00abc" + b"\x02\x03\x03" + _row(1, "a") + _row(2, "b"), checksum)
    assert decode_event(update, plans, checksum, False)[4] == [("1", "a"), ("2", "b")]
    (message,) = decode_event(update, plans, checksum, True)[4]
    assert staged.decode(message) == Update(123456789012345, ("2", "b"), ("1", "a"), "K")


def test_decode_event_declines_what_it_does_not_read() -> None:
    """Another table, a column left out of the image, another event type: None (mysql-replication
    reads it); a row cut short: an error."""
    decode_event = rows_native._decode_event
    assert decode_event is not None
    plans = {77: rows_native.plan(PLAN_SPECS, 1, True)}
    assert decode_event(_packet(23, b"\x02\x03" + _row(1, "a"), 4, table_id=78), plans, 4, False) is None
    assert decode_event(_packet(23, b"\x02\x01" + _row(1, "a"), 4), plans, 4, False) is None  # MINIMAL image
    assert decode_event(_packet(16, b"\x02\x03" + _row(1, "a"), 4), plans, 4, False) is None  # an XID
    with pytest.raises(ValueError, match="past the end"):
        decode_event(_packet(23, b"\x02\x03" + _row(1, "abc")[:-2], 4), plans, 4, False)
