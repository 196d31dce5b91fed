"""pgoutput's wire format written by the tests: a TupleData of values (NULL, unchanged TOAST, text)."""

from __future__ import annotations

import struct
from collections.abc import Sequence

from headrace.core.changes import UNCHANGED


def tuple_data(row: Sequence[object]) -> bytes:
    """``row`` as pgoutput sends it: the column count, then 'n' (None), 'u' (``UNCHANGED``) or 't' with
    the value's text (``str``) as UTF-8 and its length."""
    out = struct.pack(">H", len(row))
    for v in row:
        if v is None:
            out += b"n"
        elif v is UNCHANGED:
            out += b"u"
        else:
            raw = str(v).encode()
            out += b"t" + struct.pack(">i", len(raw)) + raw
    return out
