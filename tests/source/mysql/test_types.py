"""MySQL/MariaDB types: the schema from a binlog TABLE_MAP equals the catalog's, copy (pymysql) and
binlog (mysql-replication) give the same text for every stored value, and that text is what
``cast_text`` reads."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from headrace.core.changes import Insert, Update
from headrace.core.schema import ColumnType, TypeKind
from headrace.source.mysql import types
from headrace.source.mysql.binlog import BinlogStream
from headrace.source.mysql.catalog import read_table_schema, table_id
from headrace.source.mysql.connect import connect
from headrace.source.mysql.position import to_int

COLUMNS = """
id INT PRIMARY KEY,
ti TINYINT, tiu TINYINT UNSIGNED, b BOOL, si SMALLINT, siu SMALLINT UNSIGNED, mi MEDIUMINT,
miu MEDIUMINT UNSIGNED, i INT NOT NULL, iu INT UNSIGNED, bi BIGINT, biu BIGINT UNSIGNED,
d DECIMAL(10,2), dw DECIMAL(65,30), fl FLOAT, db DOUBLE, bt1 BIT(1), bt BIT(10), y YEAR,
dt DATE, dtm DATETIME, dtm6 DATETIME(6), ts TIMESTAMP NULL, ts3 TIMESTAMP(3) NULL, tm TIME, tm2 TIME(2), tm4 TIME(4), tm6 TIME(6),
c CHAR(5), vc VARCHAR(20), tx TEXT, ltx LONGTEXT, bn BINARY(4), vb VARBINARY(8), bl BLOB,
en ENUM('a','b c'), st SET('x','y','z'), js JSON, g GEOMETRY, p POINT
"""

ROWS = [
    "(1, -128, 255, 1, -32768, 65535, -8388608, 16777215, -2147483648, 4294967295, -9223372036854775808,"
    " 18446744073709551615, -12345678.90, '12345678901234567890123456789012345.123456789012345678901234567890',"
    " 1.1, 0.1, b'1', b'1010000001', 2155, '2024-02-29', '2024-02-29 23:59:59', '1999-12-31 23:59:59.000001',"
    " '2038-01-19 03:14:07', '1970-01-01 00:00:01.500', '-838:59:59', '838:59:58.99', '-12:00:00.0001',"
    " '-00:59:59.999999', 'ab', 'é😀x', 'long 😀',"
    " REPEAT('z', 300), x'0102', x'00ff', x'deadbeef', 'b c', 'x,z', '{\"k\": [1, 2.5, \"é\"]}',"
    " ST_GeomFromText('LINESTRING(0 0, 1 1)'), POINT(1.5, -2))",
    "(2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -3.4028235e38, 2.2250738585072014e-308, b'0', b'0', 0,"
    " '0000-00-00', '0000-00-00 00:00:00', '2024-00-10 00:00:00', '0000-00-00 00:00:00', NULL, '00:00:00',"
    " '-00:00:00.01', '-00:00:01.5', '12:34:56', '', '', '', '', '', '', '', '', '', 'null', NULL, NULL)",
    "(3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 7, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,"
    " NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,"
    " NULL, NULL, NULL, NULL, NULL)",
]


def _streamed_rows(dsn: str, database: str, start: int, count: int) -> tuple[BinlogStream, list[Insert]]:
    """The first ``count`` inserts into ``typed`` from the binlog after ``start``."""
    stream = BinlogStream(dsn, 901, start, {(database, "typed")})
    inserts: list[Insert] = []
    while len(inserts) < count:
        inserts += [e for _pos, e in stream.read(100, 1.0) if isinstance(e, Insert)]
    stream.close()
    return stream, inserts


@pytest.fixture
def typed_table(mariadb_server: Any, mysql_db: tuple[str, str]) -> tuple[str, str, int]:
    name, dsn = mysql_db
    root = connect(mariadb_server.root_dsn.rstrip("/") + "/" + name)
    with contextlib.closing(root), root.cursor() as cur:
        cur.execute("SET sql_mode = ''")  # allows zero dates
        cur.execute(f"CREATE TABLE typed ({COLUMNS})")
        cur.execute("SHOW MASTER STATUS")
        file, offset = cur.fetchone()[:2]
        for row in ROWS:
            cur.execute(f"INSERT INTO typed VALUES {row}")
    return name, dsn, to_int(file, offset)


def test_table_map_schema_equals_catalog_and_copy_text_equals_binlog_text(typed_table: tuple[str, str, int]) -> None:
    database, dsn, start = typed_table
    conn = connect(dsn)
    schema = read_table_schema(conn, database, "typed")
    stream, inserts = _streamed_rows(dsn, database, start, len(ROWS))
    assert stream.schema(schema.oid) == schema  # built from the TABLE_MAP
    assert schema.oid == table_id(database, "typed") and schema.key == ("id",)

    kinds = {c.name: (c.type.kind, c.type.pg_type) for c in schema.columns}
    assert kinds["iu"] == (TypeKind.LONG, "int unsigned")
    assert kinds["biu"][0] is TypeKind.DECIMAL and kinds["dw"] == (TypeKind.STRING, "decimal(65,30)")
    assert kinds["bt1"][0] is TypeKind.BOOLEAN and kinds["ts3"] == (TypeKind.TIMESTAMPTZ, "timestamp(3)")
    assert kinds["vc"] == (TypeKind.STRING, "varchar(20)") and kinds["g"] == (TypeKind.BINARY, "geometry")

    with conn.cursor() as cur:
        cur.execute(f"SELECT {', '.join(types.select_expression(c) for c in schema.columns)} FROM typed ORDER BY id")
        copied = [tuple(types.to_text(v, c) for v, c in zip(row, schema.columns, strict=True)) for row in cur]
    conn.close()
    assert copied == [i.new for i in inserts]
    row1, row2, row3 = (dict(zip(schema.column_names, r, strict=True)) for r in copied)
    assert row1["biu"] == "18446744073709551615" and row1["fl"] == "1.1" and row1["db"] == "0.1"
    assert row1["dw"] == "12345678901234567890123456789012345.123456789012345678901234567890"
    assert row1["bt1"] == "t" and row1["bt"] == "1010000001" and row1["b"] == "1"
    assert row1["ts"] == "2038-01-19 03:14:07+00" and row1["ts3"] == "1970-01-01 00:00:01.500000+00"
    assert row1["tm"] == "-838:59:59" and row1["tm2"] == "838:59:58.99"
    assert row1["tm4"] == "-12:00:00.0001" and row1["tm6"] == "-00:59:59.999999"
    assert row1["vc"] == "é😀x" and row1["bn"] == "\\x01020000" and row1["en"] == "b c" and row1["st"] == "x,z"
    assert row1["p"] == "\\x" + "0101000000000000000000f83f00000000000000c0"  # WKB of POINT(1.5 -2)
    assert row2["dt"] == row2["dtm"] == row2["dtm6"] == row2["ts"] == "-infinity" and row2["y"] == "0"
    assert row2["st"] == "" and row2["en"] == "" and row2["tm2"] == "-00:00:00.01"
    assert row2["tm4"] == "-00:00:01.5000" and row2["tm6"] == "12:34:56.000000"
    assert row3["i"] == "7" and all(v is None for k, v in row3.items() if k not in ("id", "i"))


def test_copied_texts_cast_to_the_values(typed_table: tuple[str, str, int], spark: Any) -> None:
    """The copy's texts read back through ``cast_text`` as the values MariaDB holds (zero dates clamped)."""
    import datetime as dt
    from decimal import Decimal

    import pyarrow as pa
    from pyspark.sql import functions as F

    from headrace.core.spark_types import ValueRules
    from headrace.engines.spark.casts import cast_text, changed_value_counts
    from headrace.source.mysql.copy import copy_chunk

    database, dsn, _start = typed_table
    with contextlib.closing(connect(dsn)) as conn:
        schema = read_table_schema(conn, database, "typed")
    copied = pa.Table.from_batches(list(copy_chunk(dsn, schema, 0, 0))).to_pandas()
    frame = spark.createDataFrame(copied.drop(columns=["_pos"])).orderBy(F.col("c0").cast("int"))
    rules = ValueRules(f"{database}.typed", "clamp")
    wanted = {"biu", "iu", "bt1", "d", "fl", "db", "ts3", "dtm6", "dt", "dtm", "ts", "bn", "vc"}
    texts = [(c.name, c.type, F.col(f"c{i}")) for i, c in enumerate(schema.columns) if c.name in wanted]
    # Datetimes come back as text: Python cannot hold every instant near year 1 in the local zone.
    def value(name: str, ct: ColumnType, text: Any) -> Any:
        cast = cast_text(text, ct, rules, name)
        return (cast.cast("string") if ct.kind in (TypeKind.TIMESTAMP, TypeKind.TIMESTAMPTZ) else cast).alias(name)

    rows = frame.select(*(value(*t) for t in texts)).collect()
    counts = frame.agg(*(agg.alias(f"{name}_{reason}") for name, reason, agg in changed_value_counts(texts, rules)))
    one, two = rows[0].asDict(), rows[1].asDict()
    assert one["biu"] == Decimal("18446744073709551615") and one["iu"] == 4294967295 and one["bt1"] is True
    assert one["d"] == Decimal("-12345678.90") and one["fl"] == pytest.approx(1.1) and one["db"] == 0.1
    assert one["ts3"] == "1970-01-01 00:00:01.5" and one["dtm6"] == "1999-12-31 23:59:59.000001"
    assert one["dt"] == dt.date(2024, 2, 29) and one["bn"] == b"\x01\x02\x00\x00" and one["vc"] == "é😀x"
    assert two["dt"] == dt.date(1, 1, 1) and two["dtm"] == "0001-01-01 00:00:00" and two["bt1"] is False
    totals = counts.collect()[0].asDict()
    assert totals["dt_infinity_clamped"] == 1 and totals["ts_infinity_clamped"] == 1


def test_added_column_fills(mariadb_server: Any, mysql_db: tuple[str, str]) -> None:
    """What rows older than an added column hold, from the catalog's defaults (unknown for expressions)."""
    database, dsn = mysql_db
    with contextlib.closing(connect(mariadb_server.root_dsn + database)) as root, root.cursor() as cur:
        cur.execute("CREATE TABLE f (id INT PRIMARY KEY, s VARCHAR(9) DEFAULT 'it''s', n INT NOT NULL,"
                    " d DECIMAL(5,2) DEFAULT 1.5, z DATE NOT NULL, t TIMESTAMP NULL DEFAULT '2020-01-02 03:04:05',"
                    " c DATETIME DEFAULT CURRENT_TIMESTAMP, g INT AS (id + 1) VIRTUAL, nul TEXT)")
    with contextlib.closing(connect(dsn)) as conn:
        schema = read_table_schema(conn, database, "f")
    fills = {c.name: c.missing for c in schema.columns}
    assert fills == {"id": "0", "s": "it's", "n": "0", "d": "1.50", "z": "-infinity",
                     "t": "2020-01-02 03:04:05+00", "c": None, "g": None, "nul": None}
    assert schema.extra["unknown_fill"] == "c,g"


UUIDS = ["6ccd780c-baba-1026-9564-5b8c656024db",  # version 1 (time-based), the one MariaDB may reorder
         "123e4567-e89b-42d3-a456-426614174000", "00000000-0000-0000-0000-000000000000",
         "ffffffff-ffff-ffff-ffff-ffffffffffff", "017f22e2-79b0-7cc3-98c4-dc0c0c07398f",
         "6ccd780c-baba-1026-1564-5b8c65602400"]
INET4S = ["0.0.0.0", "1.2.3.4", "255.255.255.255", "10.0.0.0"]
INET6S = ["::", "::1", "::ffff:1.2.3.4", "::1.2.3.4", "::0.0.0.2", "2001:db8::1", "2001:db8:0:0:1:0:0:1",
          "fe80::1:0:0:0", "1:0:0:2:0:0:0:3", "1:2:3:4:5:6:7:8", "::ffff:0.0.0.0", "0:0:0:0:0:1:0:0", "1::",
          "::ffff:0:1.2.3.4", "64:ff9b::1.2.3.4", "1:0:2:3:4:5:6:7", "0:0:0:0:0:ffff:ffff:ffff"]


def test_mariadb_uuid_and_inet_types(mariadb_server: Any, mysql_db: tuple[str, str]) -> None:
    """UUID, INET4 and INET6 (a TABLE_MAP shows them as BINARY(n)): the catalog's and the binlog's schemas
    agree, and the copy, the binlog (inserts, an update, a column added later) and ``CAST(col AS CHAR)``
    give the same text for every value; NULL stays NULL."""
    database, dsn = mysql_db
    count = max(len(UUIDS), len(INET4S), len(INET6S))
    with contextlib.closing(connect(mariadb_server.root_dsn + database)) as root, root.cursor() as cur:
        cur.execute("CREATE TABLE fb (id INT PRIMARY KEY, u UUID, i4 INET4, i6 INET6, b16 BINARY(16),"
                    " nn UUID NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000')")
        cur.execute("SHOW MASTER STATUS")
        start = to_int(*cur.fetchone()[:2])
        for k in range(count + 1):  # the last row: all NULL
            u, i4, i6 = (values[k] if k < len(values) else None for values in (UUIDS, INET4S, INET6S))
            cur.execute("INSERT INTO fb (id, u, i4, i6, b16) VALUES (%s, %s, %s, %s, %s)",
                        (k, u, i4, i6, b"\x01" if k < count else None))
        cur.execute("UPDATE fb SET u = '11111111-2222-3333-4444-000000000000', i6 = '::ffff:9.8.7.6' WHERE id = 0")
        cur.execute("ALTER TABLE fb ADD COLUMN later INET6 NOT NULL")  # old rows hold '::'
        cur.execute("INSERT INTO fb (id, later) VALUES (100, 'a::b')")
        cur.execute("SELECT id, CAST(u AS CHAR), CAST(i4 AS CHAR), CAST(i6 AS CHAR), CONCAT('\\\\x', LOWER(HEX(b16))),"
                    " CAST(nn AS CHAR), CAST(later AS CHAR) FROM fb ORDER BY id")
        server = [tuple(None if v is None else str(v) for v in row) for row in cur.fetchall()]
    with contextlib.closing(connect(dsn)) as conn:
        schema = read_table_schema(conn, database, "fb")
        with conn.cursor() as cur:
            cur.execute(f"SELECT {', '.join(types.select_expression(c) for c in schema.columns)} FROM fb ORDER BY id")
            copied = [tuple(types.to_text(v, c) for v, c in zip(row, schema.columns, strict=True)) for row in cur]
    kinds = {c.name: (c.type.kind, c.type.pg_type) for c in schema.columns}
    assert kinds["u"] == (TypeKind.UUID, "uuid") and kinds["i4"] == (TypeKind.STRING, "inet4")
    assert kinds["i6"] == (TypeKind.STRING, "inet6") and kinds["b16"] == (TypeKind.BINARY, "binary(16)")
    assert copied == server
    assert schema.column("later").missing == "::" and schema.column("nn").missing is None  # a literal default

    stream = BinlogStream(dsn, 902, start, {(database, "fb")})
    changes: list[Any] = []
    try:
        while len(changes) < count + 3:
            changes += [e for _pos, e in stream.read(100, 1.0) if isinstance(e, Insert | Update)]
        assert stream.schema(schema.oid) == schema  # the TABLE_MAP after the ALTER, read as the catalog
    finally:
        stream.close()
    streamed = {int(e.new[0]): e.new for e in changes if isinstance(e, Insert)}
    assert len(streamed[0]) == 6 and streamed[100][6] == "a::b"
    for row in server[1:count + 1]:  # rows the update left alone: as inserted, in the table's old shape
        assert streamed[int(row[0])] == row[:6]
    (update,) = [e for e in changes if isinstance(e, Update)]
    assert update.new[1] == "11111111-2222-3333-4444-000000000000" and update.new[3] == "::ffff:9.8.7.6"
    assert streamed[0][1:4] == (UUIDS[0], INET4S[0], INET6S[0])
    assert streamed[100] == server[-1]


def test_inet6_text_matches_the_server_spelling() -> None:
    """``fixed_binary_text`` by itself, for the spellings the server test above pins."""
    import ipaddress

    for text in INET6S:
        packed = ipaddress.IPv6Address(text).packed
        assert types.fixed_binary_text("inet6", packed.rstrip(b"\0")) == types.fixed_binary_text("inet6", packed)
    assert types.fixed_binary_text("inet6", ipaddress.IPv6Address("1:0:2:3:4:5:6:7").packed) == "1::2:3:4:5:6:7"
    assert types.fixed_binary_text("inet6", ipaddress.IPv6Address("::ffff:1.2.3.4").packed) == "::ffff:1.2.3.4"
    assert types.fixed_binary_text("uuid", b"") == "00000000-0000-0000-0000-000000000000"
    assert types.fixed_binary_text("inet4", b"\x0a") == "10.0.0.0"
