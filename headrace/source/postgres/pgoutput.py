"""Decoder for the pgoutput logical replication protocol, versions 1 and 2.

Reference: "Logical Replication Message Formats" in the PostgreSQL manual. Version 2 (PostgreSQL
14+, with ``streaming 'on'``) adds transactions streamed while in progress: Stream Start (``S``),
Stream Stop (``E``), Stream Commit (``c``) and Stream Abort (``A``), and every message between a
Stream Start and its Stop carries its (sub)transaction's xid right after the kind byte
(``decode(..., streamed=True)``). No two-phase messages (version 3) are asked for. ``messages
'true'`` (PG14+) adds the ``M`` message that heartbeats ride on.

This is the hot path of capture: every change passes through ``decode``. It therefore works on the
raw bytes with precompiled ``struct.Struct`` unpackers, dispatches on the first byte through a
table, and decodes each text value with a single slice + ``decode`` (no per-byte loops).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from headrace.core.changes import (
    UNCHANGED,
    Begin,
    Commit,
    Delete,
    Event,
    Insert,
    Message,
    Relation,
    RelationColumn,
    StreamAbort,
    StreamCommit,
    Streamed,
    StreamStart,
    StreamStop,
    Truncate,
    Update,
    Value,
)
from headrace.core.errors import UnsupportedError
from headrace.core.undecoded import UndecodedCodec

__all__ = ["PG_EPOCH_OFFSET_US", "MalformedMessage", "UNDECODED", "UNDECODED_KINDS", "decode"]

# PostgreSQL timestamps count microseconds from 2000-01-01 00:00 UTC; headrace uses the Unix epoch.
PG_EPOCH_OFFSET_US = 946_684_800 * 1_000_000

_BEGIN = struct.Struct(">QqI")  # final LSN, commit timestamp, xid
_COMMIT = struct.Struct(">BQQq")  # flags, commit LSN, end LSN, commit timestamp
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_U16 = struct.Struct(">H")
_OID_KIND = struct.Struct(">Ic")  # relation oid + the byte after it ('N', 'K' or 'O')
_REL_COLUMN_TAIL = struct.Struct(">Ii")  # type oid, typmod
_MESSAGE_HEAD = struct.Struct(">BQ")  # flags, LSN
_TRUNCATE_HEAD = struct.Struct(">IB")  # number of relations, option bits

_unpack_u32 = _U32.unpack_from
_unpack_i32 = _I32.unpack_from
_unpack_u16 = _U16.unpack_from

_N, _K, _O = b"N", b"K", b"O"

# The native TupleData decoder (headrace/_speedups.c, built by setup.py when a C compiler is there):
# a quarter of capture's time went to this one loop in Python. Same values, same errors.
try:
    from headrace._speedups import decode_tuple as _native_decode
except ImportError:  # not built: the Python loop below
    _native_decode = None
_native_tuple: Callable[[bytes, int, object], tuple[tuple[Value, ...], int] | None] | None = _native_decode

# The native stager of whole INSERT/UPDATE/DELETE messages; without it there is no ``UNDECODED``
# codec and the stream hands over decoded events only, as before.
try:
    from headrace._speedups import stage_change as _native_stage_change
    from headrace._speedups import stage_streamed_change as _native_stage_streamed
except ImportError:  # not built (or built before the second): the decoded path
    _native_stage_change = _native_stage_streamed = None

# The fields of the streaming messages (and a streamed message's xid), natively when built.
try:
    from headrace._speedups import stream_head as _native_stream_head
except ImportError:
    _native_stream_head = None

_STREAM_COMMIT = struct.Struct(">IBQQq")  # xid, flags, commit LSN, end LSN, commit timestamp
_STREAM_ABORT = struct.Struct(">II")  # xid, subtransaction xid


class MalformedMessage(ValueError):
    """The bytes are not a pgoutput message (truncated, or an unknown message type)."""


# The first byte of the messages a stream may hand over undecoded (``UNDECODED``): 'I', 'U', 'D'.
UNDECODED_KINDS = frozenset(b"IUD")


def relation_oid(buf: bytes) -> int:
    """The relation oid of an INSERT, UPDATE or DELETE message."""
    return _unpack_u32(buf, 1)[0]  # type: ignore[no-any-return]


def python_stream_head(buf: bytes) -> tuple[object, ...] | None:
    """The fields of a streaming message, as ``_speedups.stream_head`` gives them: ``('S', xid,
    first)``, ``('E',)``, ``('c', xid, flags, commit_lsn, end_lsn, commit_ts)``, ``('A', xid,
    subxid)``, or ``(kind, xid)`` for any other message (the xid a message in a streamed block
    carries); None when the message is too short for them."""
    if not buf:
        return None
    kind = chr(buf[0])
    try:
        if kind == "E":
            return ("E",)
        if kind == "S":
            return ("S", _unpack_u32(buf, 1)[0], bool(buf[5]))
        if kind == "c":
            return ("c", *_STREAM_COMMIT.unpack_from(buf, 1))
        if kind == "A":
            return ("A", *_STREAM_ABORT.unpack_from(buf, 1))
        return (kind, _unpack_u32(buf, 1)[0])
    except (struct.error, IndexError):
        return None


stream_head: Callable[[bytes], tuple[object, ...] | None] = _native_stream_head or python_stream_head


def _head(buf: bytes) -> tuple[object, ...]:
    head = stream_head(buf)
    if head is None:
        raise MalformedMessage(f"truncated pgoutput {chr(buf[0])!r} streaming message")
    return head


def _stream_start(buf: bytes) -> StreamStart:
    _, xid, first = _head(buf)
    return StreamStart(xid, first)  # type: ignore[arg-type]


def _stream_stop(buf: bytes) -> StreamStop:
    return StreamStop()


def _stream_commit(buf: bytes) -> StreamCommit:
    _, xid, _flags, commit_lsn, end_lsn, ts = _head(buf)
    return StreamCommit(xid, commit_lsn, end_lsn, ts + PG_EPOCH_OFFSET_US)  # type: ignore[arg-type,operator]


def _stream_abort(buf: bytes) -> StreamAbort:
    # Protocol 4 (parallel apply) appends the abort's LSN and time; 2 has the two xids only.
    _, xid, subxid = _head(buf)
    return StreamAbort(xid, subxid)  # type: ignore[arg-type]


def streamed_relation_oid(buf: bytes) -> int:
    """The relation oid of an INSERT, UPDATE or DELETE message inside a streamed block."""
    return _unpack_u32(buf, 5)[0]  # type: ignore[no-any-return]


def streamed_xid(buf: bytes) -> int:
    """The (sub)transaction xid a message inside a streamed block carries."""
    return _unpack_u32(buf, 1)[0]  # type: ignore[no-any-return]


def _change(buf: bytes) -> Insert | Update | Delete:
    return decode(buf)  # type: ignore[return-value]


def _cstring(buf: bytes, pos: int) -> tuple[str, int]:
    """A NUL-terminated UTF-8 string at ``pos``; returns it and the position after the NUL."""
    end = buf.index(0, pos)
    return buf[pos:end].decode(), end + 1


def _tuple(buf: bytes, pos: int) -> tuple[tuple[Value, ...], int]:
    """TupleData at ``pos``: the column values and the position after them."""
    if _native_tuple is not None:
        decoded = _native_tuple(buf, pos, UNCHANGED)
        if decoded is not None:
            return decoded  # type: ignore[no-any-return]
        # None: a value kind the native decoder does not take; the code below names the error.
    return _python_tuple(buf, pos)


def _python_tuple(buf: bytes, pos: int) -> tuple[tuple[Value, ...], int]:
    """``_tuple`` in Python (used when ``headrace._speedups`` was not built, and by the tests)."""
    (ncols,) = _unpack_u16(buf, pos)
    pos += 2
    values: list[Value] = []
    append = values.append
    for _ in range(ncols):
        kind = buf[pos]
        if kind == 116:  # 't': Int32 length, then the text output of the value
            start = pos + 5
            pos = start + _unpack_i32(buf, pos + 1)[0]
            append(buf[start:pos].decode())
        elif kind == 110:  # 'n': SQL NULL
            append(None)
            pos += 1
        elif kind == 117:  # 'u': unchanged TOASTed value, its bytes are not sent
            append(UNCHANGED)
            pos += 1
        elif kind == 98:  # 'b': only sent when the 'binary' option is on, which headrace never sets
            raise UnsupportedError("pgoutput sent a binary tuple value; start replication without 'binary'")
        else:
            raise MalformedMessage(f"unknown tuple value kind {kind!r} at offset {pos}")
    return tuple(values), pos


def _begin(buf: bytes) -> Begin:
    final_lsn, ts, xid = _BEGIN.unpack_from(buf, 1)
    return Begin(final_lsn, ts + PG_EPOCH_OFFSET_US, xid)


def _commit(buf: bytes) -> Commit:
    _flags, commit_lsn, end_lsn, ts = _COMMIT.unpack_from(buf, 1)
    return Commit(commit_lsn, end_lsn, ts + PG_EPOCH_OFFSET_US)


def _relation(buf: bytes) -> Relation:
    (oid,) = _unpack_u32(buf, 1)
    namespace, pos = _cstring(buf, 5)
    name, pos = _cstring(buf, pos)
    replica_identity = chr(buf[pos])
    (ncols,) = _unpack_u16(buf, pos + 1)
    pos += 3
    columns = []
    for _ in range(ncols):
        flags = buf[pos]
        col_name, pos = _cstring(buf, pos + 1)
        type_oid, typmod = _REL_COLUMN_TAIL.unpack_from(buf, pos)
        pos += 8
        columns.append(RelationColumn(col_name, type_oid, typmod, bool(flags & 1)))
    # The protocol sends an empty namespace for pg_catalog.
    return Relation(oid, namespace or "pg_catalog", name, replica_identity, tuple(columns))


def _insert(buf: bytes) -> Insert:
    oid, marker = _OID_KIND.unpack_from(buf, 1)
    if marker != _N:
        raise MalformedMessage(f"INSERT: expected 'N', got {marker!r}")
    new, _ = _tuple(buf, 6)
    return Insert(oid, new)


def _update(buf: bytes) -> Update:
    oid, marker = _OID_KIND.unpack_from(buf, 1)
    if marker == _N:
        new, _ = _tuple(buf, 6)
        return Update(oid, new)
    if marker != _K and marker != _O:
        raise MalformedMessage(f"UPDATE: expected 'K', 'O' or 'N', got {marker!r}")
    old, pos = _tuple(buf, 6)
    if buf[pos] != 78:  # 'N'
        raise MalformedMessage("UPDATE: old tuple not followed by 'N'")
    new, _ = _tuple(buf, pos + 1)
    return Update(oid, new, old, marker.decode())


def _delete(buf: bytes) -> Delete:
    oid, marker = _OID_KIND.unpack_from(buf, 1)
    if marker != _K and marker != _O:
        raise MalformedMessage(f"DELETE: expected 'K' or 'O', got {marker!r}")
    old, _ = _tuple(buf, 6)
    return Delete(oid, old, marker.decode())


def _truncate(buf: bytes) -> Truncate:
    count, options = _TRUNCATE_HEAD.unpack_from(buf, 1)
    oids = struct.unpack_from(f">{count}I", buf, 6)
    return Truncate(oids, cascade=bool(options & 1), restart_identity=bool(options & 2))


def _message(buf: bytes) -> Message:
    flags, lsn = _MESSAGE_HEAD.unpack_from(buf, 1)
    prefix, pos = _cstring(buf, 10)
    (length,) = _unpack_u32(buf, pos)
    content = buf[pos + 4 : pos + 4 + length]
    if len(content) != length:
        raise MalformedMessage("MESSAGE: content shorter than its length")
    return Message(lsn, bool(flags & 1), prefix, content)


def _ignored(buf: bytes) -> None:
    # TYPE ('Y') describes a non-builtin type; headrace looks types up in pg_type instead.
    # ORIGIN ('O') names the origin of a replicated transaction; headrace does not filter on it.
    return None


_DECODERS: dict[int, Callable[[bytes], Event | None]] = {
    ord("B"): _begin,
    ord("C"): _commit,
    ord("R"): _relation,
    ord("I"): _insert,
    ord("U"): _update,
    ord("D"): _delete,
    ord("T"): _truncate,
    ord("M"): _message,
    ord("Y"): _ignored,
    ord("O"): _ignored,
    ord("S"): _stream_start,
    ord("E"): _stream_stop,
    ord("c"): _stream_commit,
    ord("A"): _stream_abort,
}
_STREAM_CONTROL = frozenset(b"SEcA")  # the streaming messages themselves: never inside a block


def decode(buf: bytes | memoryview, streamed: bool = False) -> Event | None:
    """Decode one pgoutput message into a change event; ``None`` for TYPE and ORIGIN messages.

    ``streamed``: the message is inside a block of a streamed transaction (between Stream Start and
    Stop), so it carries its (sub)transaction's xid: it comes back as ``Streamed(xid, event)``.
    Raises ``MalformedMessage`` for truncated or unknown messages.
    """
    if type(buf) is not bytes:
        # One copy up front is cheaper than decoding many small memoryview slices.
        buf = bytes(buf)
    if not streamed or not buf or buf[0] in _STREAM_CONTROL:
        return _decode(buf)  # type: ignore[arg-type]
    xid = _head(buf)[1]  # type: ignore[arg-type]
    return Streamed(xid, _decode(buf[:1] + buf[5:]))  # type: ignore[arg-type]


def _streamed_change(buf: bytes) -> Insert | Update | Delete:
    return decode(buf, streamed=True).event  # type: ignore[union-attr,return-value]


def _decode(buf: bytes) -> Event | None:
    if not buf:
        raise MalformedMessage("empty pgoutput message")
    decoder = _DECODERS.get(buf[0])
    if decoder is None:
        raise MalformedMessage(f"unknown pgoutput message type {chr(buf[0])!r}")
    try:
        return decoder(buf)  # type: ignore[arg-type]
    except MalformedMessage:
        raise
    except UnicodeDecodeError as exc:
        raise MalformedMessage(
            f"pgoutput {chr(buf[0])!r} message holds text that is not UTF-8 (server_encoding must be UTF8)"
        ) from exc
    except (struct.error, IndexError, ValueError) as exc:
        raise MalformedMessage(f"truncated or corrupt pgoutput {chr(buf[0])!r} message: {exc}") from exc


# INSERT, UPDATE and DELETE messages staged straight from their bytes (``headrace._speedups``'s
# ``stage_change``: the JSON from the UTF-8 bytes, no Python value per column), when it is built.
# Capture alone spent about half its time per change making a Python value per column, a tuple and
# an event, only to join them into the staged JSON at once (cProfile, bench/capture.py).
# Inside a streamed block the same, the relation oid 4 bytes later (after the xid).
UNDECODED = (None if _native_stage_change is None
             else UndecodedCodec(relation_oid, _native_stage_change, _change, streamed_xid, UndecodedCodec(
                 streamed_relation_oid, _native_stage_streamed,  # type: ignore[arg-type]
                 _streamed_change, streamed_xid)))
