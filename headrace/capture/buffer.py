"""Changes read from the slot, buffered per table until the next flush, as staging rows.

Each pgoutput change becomes one row of the fixed staging schema (``headrace.log.codec``): the
row's values as JSON text, the TOAST columns sent as "unchanged", and the old key when an update
moved the row to another key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from headrace.core.changes import UNCHANGED, Begin, Delete, Insert, Truncate, Update, Value
from headrace.core.schema import TableSchema
from headrace.log.codec import StagingBuffer, encode_row


@dataclass
class TableBuffer:
    """One table's changes since the last flush, all written under ``schema``."""

    schema: TableSchema
    buffer: StagingBuffer = field(default_factory=StagingBuffer)


def buffered_bytes(buffers: dict[int, TableBuffer]) -> int:
    """Bytes held by ``buffers`` (the flush policy's measure)."""
    return sum(tb.buffer.nbytes for tb in buffers.values())


def stage(ev: Insert | Update | Delete | Truncate, txn: Begin, seq: int, relations: dict[int, TableSchema],
          buffers: dict[int, TableBuffer]) -> list[tuple[int, str]]:
    """Append ``ev`` (the ``seq``-th change of ``txn``) to its table's buffer; the (table oid, op)
    of each staged row. Changes of tables with no RELATION seen yet are not this pipeline's."""
    if isinstance(ev, Truncate):
        staged = []
        for oid in ev.relation_oids:
            if oid in relations:
                _buffer(oid, relations, buffers).append("T", txn.final_lsn, seq, txn.commit_ts_us, txn.xid, None)
                staged.append((oid, "T"))
        return staged
    schema = relations.get(ev.relation_oid)
    if schema is None:
        return []
    buf = _buffer(ev.relation_oid, relations, buffers)
    names = schema.column_names
    match ev:
        case Insert():
            data, unchanged = encode_row(names, ev.new)
            buf.append("I", txn.final_lsn, seq, txn.commit_ts_us, txn.xid, data, unchanged)
            op = "I"
        case Update():
            new = ev.new
            if ev.old is not None and ev.old_kind == "O":
                # REPLICA IDENTITY FULL sends the whole old row (TOAST values inline), so a TOAST
                # value the update left untouched is known here: stage it, not "unchanged".
                new = tuple(o if v is UNCHANGED else v for v, o in zip(new, ev.old, strict=True))
            data, unchanged = encode_row(names, new)
            old_key = None
            if ev.old is not None and not schema.key:
                # No key: the old row is the identity of the row the update replaces.
                old_key, _ = encode_row(names, ev.old)
            elif ev.old is not None:
                old_vals = _key_values(schema, ev.old)
                if old_vals != _key_values(schema, new):
                    old_key = json.dumps(old_vals, ensure_ascii=False, separators=(",", ":"))
            buf.append("U", txn.final_lsn, seq, txn.commit_ts_us, txn.xid, data, unchanged, old_key)
            op = "U"
        case Delete():
            key = _key_values(schema, ev.old) if schema.key else dict(zip(names, ev.old, strict=True))
            data = json.dumps(key, ensure_ascii=False, separators=(",", ":"))
            buf.append("D", txn.final_lsn, seq, txn.commit_ts_us, txn.xid, data)
            op = "D"
    return [(ev.relation_oid, op)]


def _buffer(oid: int, relations: dict[int, TableSchema], buffers: dict[int, TableBuffer]) -> StagingBuffer:
    tb = buffers.get(oid)
    if tb is None:
        tb = buffers[oid] = TableBuffer(relations[oid])
    return tb.buffer


def _key_values(schema: TableSchema, values: tuple[Value, ...]) -> dict[str, Value]:
    names = schema.column_names
    return {name: values[names.index(name)] for name in schema.key}
