"""Row changes handed to capture still as bytes, staged in C with no Python value per column.

For a table whose row events C reads whole (``rows_native``), the stream hands capture each change as
one ``bytes`` in the shape of pgoutput's INSERT/UPDATE/DELETE (``headrace/_binlog_rows.c``,
``messages_of``): the operation, the table's 8-byte id, then the rows as pgoutput's TupleData of the
staged text. Capture stages them with the PostgreSQL source's stager (``headrace._speedups``'s
``stage_change``, which skips the first four bytes of the id as it skips a streamed message's xid),
the same path and the same staged rows as PostgreSQL's changes (``core.undecoded``). A Python object
per change alive through a read of 10,000 changes made the collector's full collections a third of
the stream's time (bench/mysql.py); plain bytes are not tracked.
"""

from __future__ import annotations

import struct

from headrace.core.changes import Delete, Insert, Update
from headrace.core.undecoded import UndecodedCodec

try:
    from headrace._speedups import decode_tuple as _decode_tuple
    from headrace._speedups import stage_change as _stage_change
except ImportError:  # pragma: no cover - depends on the build
    _stage_change = _decode_tuple = None

_TUPLE_AT = 10  # the operation, the 8-byte id, the marker
_ID = struct.Struct(">Q")


def relation_oid(buf: bytes) -> int:
    """The table id of a staged change (read in place: no slice, half the cost per change)."""
    return int(_ID.unpack_from(buf, 1)[0])


def decode(buf: bytes) -> Insert | Update | Delete:
    """A staged change as the event it stands for (when the stager declines it). Old rows are whole:
    staging picks the key's columns, as it does from the decoded events' key-only old rows."""
    assert _decode_tuple is not None
    oid, marker = relation_oid(buf), chr(buf[9])
    values, pos = _decode_tuple(buf, _TUPLE_AT, None)
    if buf[0] == ord("I"):
        return Insert(oid, values)
    if buf[0] == ord("D"):
        return Delete(oid, values, marker)
    new, _ = _decode_tuple(buf, pos + 1, None)
    return Update(oid, new, values, marker)


# None without headrace._speedups: the stream then hands over decoded events.
CODEC = (None if _stage_change is None
         else UndecodedCodec(relation_oid, lambda buf, *args: _stage_change(buf, *args, 5), decode))  # type: ignore[misc]
