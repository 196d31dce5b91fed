"""Changes read from the slot, buffered per table until the next flush, as staging rows.

Each pgoutput change becomes one row of the fixed staging schema (``headrace.log.codec``): the
row's values as JSON text, the TOAST columns sent as "unchanged", and the old key when an update
moved the row to another key.

``stage`` runs once per change: what depends only on the table's columns (JSON keys, key positions)
is worked out once per buffer (``TableBuffer``), not per row. A change the source hands over still
in its bytes (``core.undecoded``: PostgreSQL's I/U/D messages, when ``headrace._speedups`` is built)
is staged from them by the source's codec with those keys, and decoded only when that declines
(anything unusual): the same rows, with no Python value per column.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from headrace.core.changes import UNCHANGED, Begin, Delete, Insert, Truncate, Update, Value
from headrace.core.rows import unchanged_token
from headrace.core.schema import TableSchema
from headrace.core.undecoded import StageLayout, UndecodedCodec
from headrace.log.codec import RowEncoder, StagingBuffer, row_encoder

if TYPE_CHECKING:
    from headrace.config import StagingConfig


@dataclass
class TableBuffer:
    """One table's changes since the last flush, all written under ``schema``."""

    schema: TableSchema
    buffer: StagingBuffer = field(default_factory=StagingBuffer)
    row: RowEncoder = field(init=False, repr=False)  # the whole row's columns
    key: RowEncoder = field(init=False, repr=False)  # the key's columns (every column without a key)
    key_at: tuple[int, ...] = field(init=False, repr=False)  # their positions in the row
    keyless: bool = field(init=False, repr=False)  # no key: the old row is an update's identity
    layout: StageLayout = field(init=False, repr=False)  # the above, for an undecoded change's stager

    def __post_init__(self) -> None:
        names = self.schema.column_names
        self.row = row_encoder(names)
        self.keyless = not self.schema.key
        key = self.schema.key or names
        self.key = row_encoder(tuple(key))
        self.key_at = tuple(names.index(name) for name in key)
        self.layout = (self.row.keys, self.key.keys, self.key_at, self.keyless,
                       tuple(unchanged_token(name) for name in names))


def buffered_bytes(buffers: dict[int, TableBuffer]) -> int:
    """Bytes held by ``buffers`` (the flush policy's measure)."""
    return sum(tb.buffer.nbytes for tb in buffers.values())


def flush_due(buffers: dict[int, TableBuffer], spilled_rows: int, idle: bool, policy: StagingConfig) -> bool:
    """The flush policy's size limit (rows or bytes) is reached (``idle``: the flusher is)."""
    rows = sum(len(tb.buffer) for tb in buffers.values()) + spilled_rows
    return rows >= (policy.flush_rows if idle else policy.flush_rows_busy) or buffered_bytes(buffers) >= policy.flush_bytes


def stage(ev: Insert | Update | Delete | Truncate | bytes, txn: Begin, seq: int, relations: Mapping[int, TableSchema],
          buffers: dict[int, TableBuffer], codec: UndecodedCodec | None = None) -> int:
    """Append ``ev`` (the ``seq``-th change of ``txn``) to its table's buffer; the bytes it added to
    the buffers (``buffered_bytes``). Changes of tables with no RELATION seen yet are not this
    pipeline's. ``bytes``: a change the stream left undecoded, staged with ``codec``."""
    if type(ev) is bytes:
        assert codec is not None, "an undecoded change from a source without a codec"
        oid = codec.relation_oid(ev)
        tb = buffers.get(oid) or _tracked(oid, relations, buffers)  # the call only at a table's first change
        if tb is None:
            return 0
        buf = tb.buffer
        staged = codec.stage(ev, tb.layout, buf.columns, txn.final_lsn, seq, txn.commit_ts_us, txn.xid)
        if staged is not None:
            buf.nbytes += staged
            return staged
        ev = codec.decode(ev)  # declined: staged from the event below, the rows are the same
    if type(ev) is Truncate:
        added = 0
        for oid in ev.relation_oids:
            if oid in relations:
                buf = _buffer(oid, relations, buffers).buffer
                added += buf.append("T", txn.final_lsn, seq, txn.commit_ts_us, txn.xid, None)
        return added
    oid = ev.relation_oid  # type: ignore[union-attr]
    tb = buffers.get(oid) or _tracked(oid, relations, buffers)
    if tb is None:
        return 0
    buf = tb.buffer
    match ev:
        case Insert():
            data, unchanged = tb.row.encode(ev.new)
            return buf.append("I", txn.final_lsn, seq, txn.commit_ts_us, txn.xid, data, unchanged)
        case Update():
            new, old = ev.new, ev.old
            old_key = None
            if old is not None:
                if ev.old_kind == "O":
                    # REPLICA IDENTITY FULL sends the whole old row (TOAST values inline), so a TOAST
                    # value the update left untouched is known here: stage it, not "unchanged".
                    new = tuple(o if v is UNCHANGED else v for v, o in zip(new, old, strict=True))
                if tb.keyless:
                    # No key: the old row is the identity of the row the update replaces.
                    old_key, _ = tb.row.encode(old)
                else:
                    old_vals = _pick(old, tb.key_at)
                    if old_vals != _pick(new, tb.key_at):
                        old_key, _ = tb.key.encode(old_vals)
            data, unchanged = tb.row.encode(new)
            return buf.append("U", txn.final_lsn, seq, txn.commit_ts_us, txn.xid, data, unchanged, old_key)
        case Delete():
            # The key's values (the whole old row without a key).
            data, _ = tb.key.encode(_pick(ev.old, tb.key_at))
            return buf.append("D", txn.final_lsn, seq, txn.commit_ts_us, txn.xid, data)
    return 0


def _tracked(oid: int, relations: Mapping[int, TableSchema], buffers: dict[int, TableBuffer]) -> TableBuffer | None:
    """The buffer of table ``oid``, made at its first change; None for a table with no RELATION seen."""
    tb = buffers.get(oid)
    if tb is None and oid in relations:
        tb = _buffer(oid, relations, buffers)
    return tb


def _buffer(oid: int, relations: Mapping[int, TableSchema], buffers: dict[int, TableBuffer]) -> TableBuffer:
    tb = buffers.get(oid)
    if tb is None:
        tb = buffers[oid] = TableBuffer(relations[oid])
    return tb


def _pick(values: tuple[Value, ...], at: tuple[int, ...]) -> tuple[Value, ...]:
    return tuple([values[i] for i in at])
