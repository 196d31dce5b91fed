"""The initial copy's progress bars on a terminal: one tqdm bar per table being copied.

The log's ``snapshot.progress`` events are the record (and all a service or CI sees); the bars are for
a person watching ``headrace run`` in a terminal. Tables are copied side by side
(``snapshot.tables_at_once``), each from its own thread: tqdm keeps one line per open bar and
serialises their redraws with its own lock, where the hand-written ``\\r`` bar it replaces drew the
tables over each other on one line.
"""

from __future__ import annotations

import sys
import threading
from typing import TextIO

from tqdm import tqdm


class CopyBars:
    """Chunk bars by table name, drawn on ``stream`` only when it is a terminal."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream  # None: sys.stderr at each call (a test or a service may replace it)
        self._bars: dict[str, tqdm] = {}
        self._lock = threading.Lock()

    def show(self, table: str, done: int, total: int, rows: int) -> None:
        """``table`` has ``done`` of its ``total`` chunks copied, ``rows`` rows: draw it; the bar closes
        (and stays on screen) with its last chunk."""
        stream = self.stream if self.stream is not None else sys.stderr
        if not stream.isatty():
            return
        with self._lock:
            bar = self._bars.get(table)
            if bar is None:
                bar = self._bars[table] = tqdm(total=total, desc=table, unit="chunk", file=stream,
                                               dynamic_ncols=True, leave=True)
        bar.set_postfix_str(f"{rows:,} rows", refresh=False)
        bar.update(done - bar.n)
        if done >= total:
            with self._lock:
                self._bars.pop(table, None)
            bar.close()


BARS = CopyBars()  # the process's: every copy thread draws on the same terminal
