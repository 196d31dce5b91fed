"""The bytes of the staged files this process wrote last to an object store, read back from memory.

Capture writes a staged file and the materializer, in the same process, reads it a moment later:
on a local folder that read is the page cache's; on an object store it is a HEAD and two ranged GETs
per file (pyarrow's footer and data reads), each a round trip to the store. A staged file is written
once under a name never reused and never changed, so the bytes this process uploaded are the file:
the last ``BUDGET`` bytes of them are kept here and read in place of the store. Spark's executors
and other processes read the store as before.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import pyarrow as pa

BUDGET = 64 << 20  # bytes: about a flush's worth of staged files (``staging.flush_bytes`` is 64 MiB)

_files: OrderedDict[str, pa.Buffer] = OrderedDict()
_held = 0
_lock = threading.Lock()


def keep(location: str, data: pa.Buffer) -> None:
    """Remember ``location``'s bytes, forgetting the oldest files beyond the budget."""
    global _held
    if data.size > BUDGET:
        return
    with _lock:
        old = _files.pop(location, None)
        _held -= old.size if old is not None else 0
        _files[location] = data
        _held += data.size
        while _held > BUDGET:
            _, dropped = _files.popitem(last=False)
            _held -= dropped.size


def read(location: str) -> pa.Buffer | None:
    """``location``'s bytes when this process wrote it lately, else None."""
    with _lock:
        return _files.get(location)


def forget(location: str) -> None:
    """The file was deleted: its bytes are not kept any longer."""
    global _held
    with _lock:
        dropped = _files.pop(location, None)
        _held -= dropped.size if dropped is not None else 0
