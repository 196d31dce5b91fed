"""A change a source hands over still in its wire bytes, for capture to stage without decoding it.

Decoding a change into a Python value per column, a tuple and an event costs more than anything
else capture does per change, and the values are joined into the staged JSON at once. A source
whose messages can be staged straight from their bytes (PostgreSQL's pgoutput, in C) hands its
INSERT, UPDATE and DELETE messages over as an ``UndecodedChange``; capture has it staged (``stage``)
and decodes it (``decode``) only when that declines. Either way the staged row is byte for byte the
one the decoded event gives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from headrace.core.changes import Delete, Insert, Update

# What a stager needs of a table, worked out once per table (``capture.buffer.TableBuffer.layout``):
# the JSON keys (``RowEncoder.keys``) of the row's and of the key's columns, the key's positions in
# the row, and whether the table has no key (then every column is the key, and an update's old row
# is the identity of the row it replaces).
StageLayout = tuple[tuple[str, ...], tuple[str, ...], tuple[int, ...], bool]

# A stager: (the change's bytes, its table's layout, the staging buffer's eight column lists
# (``StagingBuffer.columns``), commit LSN, ordinal in the transaction, commit time in us, xid) ->
# the bytes the row added (as ``StagingBuffer.append`` counts them), or None with nothing appended:
# decode the change and stage the event instead.
Stager = Callable[[bytes, StageLayout, tuple[list[Any], ...], int, int, int, int], int | None]


class UndecodedChange:
    """An INSERT, UPDATE or DELETE of table ``relation_oid``, still the source's bytes ``buf``.

    ``stage`` is a plain function (a ``staticmethod``), called as ``ev.stage(ev.buf, ...)``: a
    Python method around a C function was a measurable share of capture's time per change. Not an
    ABC either: capture matches every change against this class, and an ABC's ``isinstance`` is slower.
    """

    __slots__ = ("buf", "relation_oid")

    buf: bytes
    relation_oid: int
    stage: Stager

    def decode(self) -> Insert | Update | Delete:
        """The change as an event."""
        raise NotImplementedError
