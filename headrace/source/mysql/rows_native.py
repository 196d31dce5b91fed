"""Row events decoded in C (``headrace/_binlog_rows.c``) straight to the text the stream stages.

mysql-replication decodes each value into a Python object that ``types.binlog_text`` then turns into
text; the C decoder reads the row image's bytes and writes the text at once, for the column types
it spells exactly as that path does (integers, FLOAT, DOUBLE, DECIMAL, character strings in UTF-8,
binary strings, DATE, DATETIME, TIMESTAMP, YEAR). A table with another type (TIME, BIT, ENUM, SET,
GEOMETRY, JSON, MariaDB's UUID/INET, strings in other character sets, BINARY(n)) keeps the Python
decoder, as does every table when the extension was not built (no C compiler); both give the same
text (``tests/source/mysql/test_rows_native.py``).

A row event of a table with a plan is read whole in C from the replication packet
(``BinlogConnection``): its header, table id, columns-present bitmaps and rows, with no
mysql-replication packet wrapper or event object; so are the fixed fields of XID and MariaDB GTID
events, in Python (``NativeEvent``). That library's classes, with their own Python
per-event parse, were a quarter of the stream's time after the rows were decoded in C (cProfile,
bench/mysql.py). Every other event, and a row event C declines (an image that is not FULL, a value
it does not spell), goes on to mysql-replication as before.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

from pymysql.constants.COMMAND import COM_BINLOG_DUMP
from pymysqlreplication.constants import FIELD_TYPE
from pymysqlreplication.row_event import UpdateRowsEvent

from headrace.core.schema import Column
from headrace.source.mysql.connect import MySqlConnection
from headrace.source.mysql.types import base_type

try:  # built by setup.py when a C compiler is there
    from headrace._binlog_rows import decode_event as _decode_event
    from headrace._binlog_rows import decode_rows as _decode_rows
except ImportError:  # pragma: no cover - depends on the build
    _decode_rows = _decode_event = None

_COM_BINLOG_DUMP_GTID = 0x1E
_ROW_EVENTS = frozenset((23, 24, 25, 30, 31, 32))  # WRITE/UPDATE/DELETE_ROWS v1 (MariaDB) and v2 (MySQL)
XID_EVENT, MARIADB_GTID_EVENT = 16, 162
_HEAD = struct.Struct("<IBIII")  # after the OK byte: timestamp, type, server id, event size, end position
_MARIADB_GTID = struct.Struct("<QIB")  # sequence number, domain id, flags
# (kind: 0 write, 1 update, 2 delete; binlog table id; the event's end in its file; its size; the
# row images: an UPDATE's before, after, before, ...)
Decoded = tuple[int, int, int, int, list[tuple[str | None, ...]] | list[bytes]]

Spec = tuple[int, int, int]
K_INT, K_FLOAT, K_DOUBLE, K_DECIMAL, K_TEXT, K_BINARY, K_DATE, K_DATETIME2, K_TIMESTAMP2, K_YEAR = range(1, 11)
_INT_BYTES = {FIELD_TYPE.TINY: 1, FIELD_TYPE.SHORT: 2, FIELD_TYPE.INT24: 3, FIELD_TYPE.LONG: 4,
              FIELD_TYPE.LONGLONG: 8}
_UTF8 = ("utf8mb4", "utf8mb3", "utf8")
_TEXTS = ("char", "varchar", "tinytext", "text", "mediumtext", "longtext")
_BLOBS = ("tinyblob", "blob", "mediumblob", "longblob", "varbinary")
_TIMES = {FIELD_TYPE.DATE: K_DATE, FIELD_TYPE.DATETIME2: K_DATETIME2, FIELD_TYPE.TIMESTAMP2: K_TIMESTAMP2,
          FIELD_TYPE.YEAR: K_YEAR}
_DATE_BASES = {K_DATE: "date", K_DATETIME2: "datetime", K_TIMESTAMP2: "timestamp", K_YEAR: "year"}


def available() -> bool:
    """Whether the C decoder was built."""
    return _decode_rows is not None


def _spec(binlog_column: Any, column: Column) -> Spec | None:
    code, base = binlog_column.type, base_type(column.type)
    if code in _INT_BYTES:
        return (K_INT, _INT_BYTES[code], int(bool(binlog_column.unsigned)))
    if code == FIELD_TYPE.FLOAT and base == "float":
        return (K_FLOAT, 0, 0)
    if code == FIELD_TYPE.DOUBLE and base == "double":
        return (K_DOUBLE, 0, 0)
    if code == FIELD_TYPE.NEWDECIMAL and base == "decimal":
        return (K_DECIMAL, int(binlog_column.precision), int(binlog_column.decimals))
    charset = (binlog_column.character_set_name or "").lower()
    if code in (FIELD_TYPE.VARCHAR, FIELD_TYPE.STRING) and base in ("char", "varchar") and charset in _UTF8:
        return (K_TEXT, 2 if binlog_column.max_length > 255 else 1, 0)
    if code == FIELD_TYPE.BLOB and base in _TEXTS and charset in _UTF8:
        return (K_TEXT, int(binlog_column.length_size), 0)
    if code == FIELD_TYPE.BLOB and base in _BLOBS:
        return (K_BINARY, int(binlog_column.length_size), 0)
    if code == FIELD_TYPE.VARCHAR and base == "varbinary":
        return (K_BINARY, 2 if binlog_column.max_length > 255 else 1, 0)
    kind = _TIMES.get(code)
    if kind is not None and _DATE_BASES[kind] == base:
        return (kind, int(getattr(binlog_column, "fsp", 0) or 0), 0)
    return None


def row_specs(binlog_columns: Sequence[Any], columns: Sequence[Column]) -> list[Spec] | None:
    """The C decoder's plan for a table (from its TABLE_MAP's columns and the stream's shape), or None
    when a column needs the Python decoder (or the extension is not built)."""
    if _decode_rows is None or len(binlog_columns) != len(columns):
        return None
    specs = []
    for binlog_column, column in zip(binlog_columns, columns, strict=True):
        spec = _spec(binlog_column, column)
        if spec is None:
            return None
        specs.append(spec)
    return specs


Plan = tuple[bytes, int, bool]


def plan(specs: list[Spec], oid: int, keyed: bool) -> Plan:
    """A table's plan as ``decode_event`` takes it: ``specs`` packed as C ints, the table's id, and
    whether it has a key (for staged changes, ``staged``)."""
    return struct.pack(f"{3 * len(specs)}i", *(n for spec in specs for n in spec)), oid, keyed


class NativeRows(Exception):  # noqa: N818 -- not an error: the way out of mysql-replication's fetchone
    """A row event read in C as the replication connection received it (``decoded``); raised out of
    mysql-replication's ``fetchone``, which never sees the packet, for the stream to take."""

    def __init__(self, decoded: Decoded) -> None:
        super().__init__()
        self.decoded = decoded


class NativeEvent(Exception):  # noqa: N818 -- not an error: the way out of mysql-replication's fetchone
    """An XID (a commit) or a MariaDB GTID event (a transaction's start), read from the packet's fixed
    fields as the connection received it: ``head`` (timestamp, type, server id, size, end position)
    and for a GTID ``gtid`` (sequence number, domain id, flags)."""

    def __init__(self, head: tuple[int, int, int, int, int], gtid: tuple[int, int, int] | None) -> None:
        super().__init__()
        self.head, self.gtid = head, gtid


class BinlogConnection(MySqlConnection):
    """The replication connection: once it asked for the binlog, a row event of a table in ``plans``
    (binlog table id -> ``plan``, kept by the stream) raises ``NativeRows`` with its rows (text
    tuples, or with ``staged`` one ``staged`` message per change) instead of being returned as a
    packet; any other packet is returned as before. mysql-replication opens its other connection (for
    metadata) with this class too: that one never asks for the binlog."""

    def __init__(self, *args: Any, plans: dict[int, Plan] | None = None, staged: bool = False,
                 **kwargs: Any) -> None:
        self.plans = plans if _decode_event is not None else None
        self.staged = staged
        self._checksum: int | None = None  # bytes after each event; known once the binlog is asked for
        super().__init__(*args, **kwargs)

    def _write_bytes(self, data: bytes) -> None:
        if self.plans is not None and len(data) > 4 and data[4] in (COM_BINLOG_DUMP, _COM_BINLOG_DUMP_GTID):
            # mysql-replication asks for events with checksums as the server writes them (CRC32 unless
            # binlog_checksum=NONE) by this session variable, set before it sends the dump command.
            with self.cursor() as cur:
                cur.execute("SELECT @master_binlog_checksum")
                row = cur.fetchone()
            self._checksum = 0 if row is None or row[0] in (None, b"NONE", "NONE") else 4
        super()._write_bytes(data)

    def _read_packet(self, packet_type: Any = None) -> Any:
        packet = super()._read_packet() if packet_type is None else super()._read_packet(packet_type)
        if self._checksum is None or self.plans is None:
            return packet
        data = packet._data
        kind = data[5] if len(data) > 20 and data[0] == 0 else 0
        if kind in _ROW_EVENTS and self.plans:
            decoded = _decode_event(data, self.plans, self._checksum, self.staged)  # type: ignore[misc]
            if decoded is not None:
                raise NativeRows(decoded)
        elif kind == XID_EVENT:
            raise NativeEvent(_HEAD.unpack_from(data, 1), None)
        elif kind == MARIADB_GTID_EVENT and len(data) >= 20 + _MARIADB_GTID.size:
            raise NativeEvent(_HEAD.unpack_from(data, 1), _MARIADB_GTID.unpack_from(data, 20))
        return packet


def decode(event: Any, specs: list[Spec]) -> list[tuple[str | None, ...]] | None:
    """The event's row images as text tuples (an UPDATE: before, after, before, ...), or None when the
    Python decoder must read it (a column left out of the image, a value C does not spell); then the
    event is as it was, unread."""
    assert _decode_rows is not None
    if not getattr(event, "complete", True) or not getattr(event, "_processed", True):
        return None
    full = bytes([255] * (len(specs) // 8)) + (bytes([(1 << (len(specs) % 8)) - 1]) if len(specs) % 8 else b"")
    update = isinstance(event, UpdateRowsEvent)
    if event.columns_present_bitmap != full or (update and event.columns_present_bitmap2 != full):
        return None  # binlog_row_image is not FULL: Python raises the error naming the fix
    packet = event.packet
    body = packet.read(event.event_size - packet.read_bytes)
    rows: list[tuple[str | None, ...]] | None = _decode_rows(body, 2 if update else 1, specs)
    if rows is None:
        packet.unread(body)
    return rows


def key_image(at: list[int], width: int) -> Callable[[tuple[str | None, ...]], tuple[str | None, ...]]:
    """A row image reduced to its key columns ``at`` (the others None): a delete's or a key change's
    old image. A leading single-column key (the common case) is one tuple concatenation."""
    if at == [0]:
        rest: tuple[None, ...] = (None,) * (width - 1)
        return lambda row: (row[0],) + rest
    blank: list[str | None] = [None] * width

    def key_only(row: tuple[str | None, ...]) -> tuple[str | None, ...]:
        key = blank.copy()
        for i in at:
            key[i] = row[i]
        return tuple(key)

    return key_only
