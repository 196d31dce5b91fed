"""Copy-on-write for small tables, merge-on-read for large ones: the write mode follows the table's size.

Merge-on-read keeps a batch's cost off the table's size (it writes position deletes instead of
rewriting the data files a batch touches), but every batch adds a data file and a delete file, and
the next MERGE's scan reads them all (every delete file applies to every data file of the partition)
until maintenance compacts the table: at most hourly by default. Measured on 2 cores
(``bench/iceberg_batch_cpu.py``, 100-change driver batches, random keys, 2,000-row table): CPU per
batch rose from 0.97 s (batches 0-19) to 1.31 s (batches 140-159, 161 data and 160 delete files), the
executor tasks' share from 0.17 to 0.64 s, and it goes on rising. Copy-on-write rewrites the touched
files instead, which on a small table is all of it for little: 0.49 s a batch at batches 60-99, the
table one data file and no delete file throughout.

So a keyed table below ``copy_on_write_below_rows`` live rows (config) and ``COPY_ON_WRITE_MAX_BYTES``
of files is written copy-on-write, and switches back to merge-on-read at twice either (the gap keeps
a table near the line from switching at every batch). The switch is one metadata commit of the three ``write.*.mode`` properties through the
catalog's cached table, before the batch's MERGE is planned, so that MERGE already runs in the new
mode. Both modes give the same rows; readers (DuckDB, pyiceberg) read either.

A mode somebody else chose is left alone: each switch also records the mode headrace set
(``headrace.write-mode``), and a table whose ``write.merge.mode`` no longer equals that record was
changed by its owner (``ALTER TABLE ... SET TBLPROPERTIES``), so headrace keeps to that mode from then
on. To hand the choice back, set ``headrace.write-mode`` to the table's current mode, or unset both.
"""

from __future__ import annotations

from typing import Any

COPY_ON_WRITE = "copy-on-write"
MERGE_ON_READ = "merge-on-read"
MODE_PROPERTIES = ("write.delete.mode", "write.update.mode", "write.merge.mode")
# Back to merge-on-read at this multiple of the copy-on-write limits.
HYSTERESIS = 2
# Copy-on-write rewrites the files a batch touches (a random-key batch: all of them), so wide rows cap
# it too: at 100,000 narrow rows (0.45 MB of Parquet) a 100-change batch cost the same either way
# (1.10-1.34 s against 1.15 s, before merge-on-read's files pile up); past some MB the rewrite dominates.
COPY_ON_WRITE_MAX_BYTES = 16 * 1024 * 1024
# The mode headrace last set on the table; a write.merge.mode other than this one is its owner's.
SET_BY_HEADRACE = "headrace.write-mode"


def live_rows(table: Any) -> int | None:
    """Rows in the Iceberg ``table`` (a py4j ``Table``) by its current snapshot's summary, position-
    deleted rows taken off (metadata already loaded: no file read); None for a table without snapshot."""
    summary = _summary(table)
    records = summary.get("total-records")
    if records is None:
        return None
    return max(int(records) - int(summary.get("total-position-deletes") or 0), 0)


def _summary(table: Any) -> Any:
    snapshot = table.currentSnapshot()
    return snapshot.summary() if snapshot is not None else {}


def wanted_mode(rows: int | None, size: int, current: str, limit: int) -> str:
    """The write mode for a table of ``rows`` live rows in ``size`` bytes of files, now in mode
    ``current``: copy-on-write below ``limit`` rows and ``COPY_ON_WRITE_MAX_BYTES``, merge-on-read from
    ``HYSTERESIS`` times either, unchanged between (``limit`` 0 turns copy-on-write off)."""
    if limit <= 0:
        return MERGE_ON_READ
    rows = rows or 0
    if rows < limit and size < COPY_ON_WRITE_MAX_BYTES:
        return COPY_ON_WRITE
    if rows >= HYSTERESIS * limit or size >= HYSTERESIS * COPY_ON_WRITE_MAX_BYTES:
        return MERGE_ON_READ
    return current if current in (COPY_ON_WRITE, MERGE_ON_READ) else MERGE_ON_READ


def chosen_by_owner(properties: Any) -> bool:
    """Whether the table's owner set its write mode: ``write.merge.mode`` is set and is not the mode
    headrace last set (a table from before that record counts as headrace's: it set the mode at
    creation)."""
    current = properties.get("write.merge.mode")
    ours = properties.get(SET_BY_HEADRACE)
    return current is not None and ours is not None and current != ours


def follow_size(table: Any, rows: int | None, limit: int) -> str:
    """Set ``table``'s write mode for its size (``wanted_mode``) if it has another and its owner has not
    chosen one (``chosen_by_owner``); return the table's mode."""
    properties = table.properties()
    current = properties.get("write.merge.mode") or MERGE_ON_READ
    if chosen_by_owner(properties):
        return current
    mode = wanted_mode(rows, int(_summary(table).get("total-files-size") or 0), current, limit)
    if any(properties.get(p) != mode for p in (*MODE_PROPERTIES, SET_BY_HEADRACE)):
        table.refresh()  # the catalog's cached table may predate an owner's change: look again (rare)
        if chosen_by_owner(table.properties()):
            return str(table.properties().get("write.merge.mode"))
        update = table.updateProperties()
        for prop in (*MODE_PROPERTIES, SET_BY_HEADRACE):
            update = update.set(prop, mode)
        update.commit()
    return mode
