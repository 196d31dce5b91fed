"""Changes a source hands over still in their wire bytes, for capture to stage without decoding them.

Decoding a change into a Python value per column, a tuple and an event costs more than anything
else capture does per change, and the values are joined into the staged JSON at once. A source
whose INSERT, UPDATE and DELETE messages can be staged straight from their bytes (PostgreSQL's
pgoutput, in C) streams them as plain ``bytes`` and gives capture the ``UndecodedCodec`` that
stages them (``Source.undecoded``); capture decodes one only when the codec declines it. Either way
the staged row is byte for byte the one the decoded event gives.

Plain ``bytes``, not an object per change: a Python object per change, alive for one read of
10,000 messages, reached the oldest GC generation and made the collector run a full collection
every ~50K changes, 10 of them (1.8 s wall, loaded machine) in a 5.6 s drain of 500K changes
(bench/capture.py with gc callbacks); with (position, bytes) pairs, which the collector stops
tracking at its first look, 2 (0.5 s) and 3.2 CPU us per change instead of 4.4.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from headrace.core.changes import Delete, Insert, Update

# What a stager needs of a table, worked out once per table (``capture.buffer.TableBuffer.layout``):
# the JSON keys (``RowEncoder.keys``) of the row's and of the key's columns, the key's positions in
# the row, whether the table has no key (then every column is the key, and an update's old row is
# the identity of the row it replaces), and the row's columns as ``_unchanged_cols`` names them
# (``core.rows.unchanged_token``).
StageLayout = tuple[tuple[str, ...], tuple[str, ...], tuple[int, ...], bool, tuple[str, ...]]

# A stager: (a change's bytes, its table's layout, the staging buffer's eight column lists
# (``StagingBuffer.columns``), commit LSN, ordinal in the transaction, commit time in us, xid) ->
# the bytes the row added (as ``StagingBuffer.append`` counts them), or None with nothing appended:
# decode the change and stage the event instead.
Stager = Callable[[bytes, StageLayout, tuple[list[Any], ...], int, int, int, int], int | None]


@dataclass(frozen=True)
class UndecodedCodec:
    """How capture stages a source's undecoded changes."""

    relation_oid: Callable[[bytes], int]  # the table the change is of
    stage: Stager
    decode: Callable[[bytes], Insert | Update | Delete]  # the change as an event, when ``stage`` declines
    # The (sub)transaction a change inside a block of a streamed transaction is of (PostgreSQL's
    # protocol 2+ puts its xid in the message), and the codec of such changes; None: not streamed.
    xid: Callable[[bytes], int] | None = None
    streamed: UndecodedCodec | None = None
