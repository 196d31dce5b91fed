"""A change a source hands over still in its wire bytes, for capture to stage without decoding it.

Decoding a change into a Python value per column, a tuple and an event costs more than anything
else capture does per change, and the values are joined into the staged JSON at once. A source
whose messages can be staged straight from their bytes (PostgreSQL's pgoutput, in C) hands its
INSERT, UPDATE and DELETE messages over as an ``UndecodedChange``; capture asks it for the staged
row (``staged``) and decodes it (``decode``) only when that declines. Either way the staged row is
byte for byte the one the decoded event gives.
"""

from __future__ import annotations

from headrace.core.changes import Delete, Insert, Update


class UndecodedChange:
    """An INSERT, UPDATE or DELETE of table ``relation_oid``, not decoded yet.

    Not an ABC: capture matches every change against this class, and an ABC's ``isinstance``
    check is a slower one.
    """

    __slots__ = ("relation_oid",)

    relation_oid: int

    def staged(self, row_keys: tuple[str, ...], key_keys: tuple[str, ...], key_at: tuple[int, ...],
               keyless: bool) -> tuple[str, str, str | None] | None:
        """The staged row's ``_op``, ``_data`` and ``_old_key`` (``capture.buffer.stage``'s rules),
        given the JSON keys (``RowEncoder.keys``) of the row's and the key's columns and the key's
        positions in the row; None when this change must be decoded instead."""
        raise NotImplementedError

    def decode(self) -> Insert | Update | Delete:
        """The change as an event."""
        raise NotImplementedError
