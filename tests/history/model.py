"""A reference model of the history modes: the whole change sequence replayed one change at a time.

Deliberately unlike ``headrace.history.build`` (which works batch by batch against the rows before
the batch): here every table is recomputed from the full sequence, in the plainest way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Row = tuple[Any, ...]  # (id, v, t)


@dataclass
class Model:
    """The source's rows and every mode's expected table after ``apply``-ing changes in order."""

    rows: dict[int, tuple[str, str, int, int, int]] = field(default_factory=dict)  # id -> v, t, lsn, seq, ts
    changelog: list[tuple[Any, ...]] = field(default_factory=list)  # op, id, v, t, lsn, seq, xid
    versions: list[list[Any]] = field(default_factory=list)  # id, v, t, from ts, to ts, current, lsn, seq
    soft: dict[int, list[Any]] = field(default_factory=dict)  # id -> v, t, deleted ts or None

    def seed(self) -> None:
        """History turned on now: every history table starts from the mirror's rows."""
        self.changelog = [("I", k, v, t, lsn, seq, None) for k, (v, t, lsn, seq, _) in self.rows.items()]
        self.versions = [[k, v, t, ts, None, True, lsn, seq] for k, (v, t, lsn, seq, ts) in self.rows.items()]
        self.soft = {k: [v, t, None] for k, (v, t, _, _, _) in self.rows.items()}

    def _close(self, key: int, ts: int) -> None:
        for version in self.versions:
            if version[0] == key and version[5]:
                version[4], version[5] = ts, False

    def _open(self, key: int, lsn: int, seq: int, ts: int) -> None:
        v, t, _, _, _ = self.rows[key]
        self.versions.append([key, v, t, ts, None, True, lsn, seq])
        self.soft[key] = [v, t, None]

    def apply(self, op: str, lsn: int, seq: int, ts: int, key: int | None, v: str | None, t: str | None,
              old: int | None) -> None:
        """One change: t None on an update means TOAST left unchanged; ``old``, the key it moves from."""
        if op == "T":
            self.changelog.append(("T", None, None, None, lsn, seq, lsn))
            for k in self.rows:
                self._close(k, ts)
                self.soft[k][2] = ts
            self.rows.clear()
            return
        assert key is not None
        if op == "D":
            self.changelog.append(("D", key, None, None, lsn, seq, lsn))
            self._close(key, ts)
            self.soft[key][2] = ts
            del self.rows[key]
            return
        source = old if old is not None else key
        kept_t = self.rows[source][1] if t is None else t
        if old is not None and old != key:
            self.changelog.append(("D", old, None, None, lsn, seq, lsn))
            self._close(old, ts)
            self.soft[old][2] = ts
            del self.rows[old]
            op = "I"
        else:
            self._close(key, ts)
        assert v is not None
        self.rows[key] = (v, kept_t, lsn, seq, ts)
        self.changelog.append((op, key, v, kept_t, lsn, seq, lsn))
        self._open(key, lsn, seq, ts)
