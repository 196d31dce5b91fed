"""What capture knows about a staged file when it writes it, registered with the file in the log index.

The materializer used to find these by a Spark aggregation over the batch's files (row count,
latest TRUNCATE, TOAST markers): a whole Spark job per batch, most of a small batch's cost.
Capture holds every staged row when it writes the file (``StagingBuffer``), so it finds them for nothing.

The flags are not aware of the batch's skip point (the initial copy's position): a flag set by a
change the batch then skips only chooses a slower plan (``headrace.engines.spark.batch``), never a
different answer. The latest TRUNCATE is kept exactly, so the reader compares it with the skip point.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any

from headrace.core.position import Position


@dataclass(frozen=True)
class FileFacts:
    """Counts and flags over the rows of one staged file (or, summed with ``+``, of several)."""

    inserts: int = 0
    updates: int = 0
    deletes: int = 0
    truncates: int = 0
    last_truncate: Position | None = None  # the latest TRUNCATE's (commit LSN, ordinal)
    unchanged: bool = False  # a row left TOAST columns unchanged
    # An update without ``_old_key``: normal when the key did not change, but on a keyless table it
    # means the old row is missing (REPLICA IDENTITY was not FULL), which the materializer refuses.
    update_without_old: bool = False
    key_toast: bool = False  # an update moved the key and left TOAST columns unchanged
    # The latest commit time (µs since the epoch) of the file's rows: the status page's lag reads it here
    # instead of the file's footer, a request per applied file on an object store. None: not known.
    last_commit_us: int | None = None

    @property
    def rows(self) -> int:
        """Staged rows (every op, truncates included)."""
        return self.inserts + self.updates + self.deletes + self.truncates

    def __add__(self, other: FileFacts) -> FileFacts:
        truncs = [t for t in (self.last_truncate, other.last_truncate) if t is not None]
        return FileFacts(
            inserts=self.inserts + other.inserts,
            updates=self.updates + other.updates,
            deletes=self.deletes + other.deletes,
            truncates=self.truncates + other.truncates,
            last_truncate=max(truncs) if truncs else None,
            unchanged=self.unchanged or other.unchanged,
            update_without_old=self.update_without_old or other.update_without_old,
            key_toast=self.key_toast or other.key_toast,
            last_commit_us=max((t for t in (self.last_commit_us, other.last_commit_us) if t is not None), default=None),
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON object for ``_headrace.log_index.facts``."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        t = self.last_truncate
        out["last_truncate"] = None if t is None else [t.lsn, t.seq]
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> FileFacts:
        """Read back what ``to_json`` wrote (keys a newer version added are ignored)."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in obj.items() if k in known}
        t = values.get("last_truncate")
        values["last_truncate"] = None if t is None else Position(int(t[0]), int(t[1]))
        return cls(**values)


def total(facts: Iterable[FileFacts]) -> FileFacts:
    """The facts of several files together."""
    out = FileFacts()
    for f in facts:
        out = out + f
    return out


def facts_of(op: Sequence[str], lsn: Sequence[int], seq: Sequence[int], unchanged: Sequence[str | None],
             old_key: Sequence[str | None], ts: Sequence[int] = ()) -> FileFacts:
    """The facts of staged rows given column by column (``StagingBuffer`` at a flush).

    Found over whole columns with C-level counts; the per-row scans run only when there is
    something to find (an update, a TRUNCATE, an unchanged TOAST value).
    """
    counts = Counter(op)
    any_unchanged = unchanged.count(None) != len(unchanged)
    update_without_old = key_toast = False
    if counts["U"]:
        update_without_old = any(o == "U" and k is None for o, k in zip(op, old_key, strict=True))
        if any_unchanged:
            key_toast = any(o == "U" and k is not None and u is not None
                            for o, k, u in zip(op, old_key, unchanged, strict=True))
    last_truncate = None
    if counts["T"]:
        last_truncate = Position(*max((p, s) for o, p, s in zip(op, lsn, seq, strict=True) if o == "T"))
    return FileFacts(counts["I"], counts["U"], counts["D"], counts["T"], last_truncate, any_unchanged,
                     update_without_old, key_toast, max(ts) if ts else None)
