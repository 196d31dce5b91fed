"""One table compared at one point: checksums per range on each side, the ranges that differ split
until they are small, then their rows compared, and each differing row judged settled or not.

The source is read in a snapshot at position P (it holds exactly the transactions that committed
before P); the target at a pinned snapshot taken once it applied everything before P, so it may
hold a little more: the changes of its last batch at or after P. A row the two sides disagree on
is reported only when the disagreement is proven to hold at P:
- the target row was written before P (``_hr_lsn < P``: nothing after P touched it), or
- the source row is the same tuple version (``tableoid:ctid:xmin``) in a read after the pin as in
  the snapshot (nothing changed it between P and the target's position), or
- a key appears more than once in the target.
Anything else (a row changed, inserted or deleted in that short window) is left for the next round,
at a later point, where it is compared again.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

from headrace.core.schema import TableSchema, TypeKind
from headrace.verify.canon import HASH_BITS, identity_columns
from headrace.verify.sides import Checksums, KeyTexts, LakeSide, Ranges, RowImage, SourceSide

A = TypeVar("A")
B = TypeVar("B")

LEAF_ROWS = 256  # a differing range at most this large is compared row by row
# Rows per range at the first level: leaf-sized, so a table that differs in a few rows costs two
# scans a side (checksums, then the rows of the differing ranges); 20M rows make 2^17 ranges, whose
# checksums are what the sides send.
RANGE_ROWS = 256
MAX_FIRST_BITS = 18
SPLIT_TO_ROWS = 16  # a differing range is split into ranges of about this many rows
# Rows of differing ranges above which they are not read (a target far from its source, an empty
# one): the table is reported as different with the count, not its keys; a resync is the cure.
MAX_ROWS_COMPARED = 200_000


class Progress:
    """What verify tells a person watching; this base tells nothing (scripts, tests)."""

    def table(self, done: int, total: int, name: str) -> None:
        """``done`` of ``total`` tables compared; ``name`` is next."""

    def note(self, text: str) -> None:
        """What verify is doing now."""

    def close(self) -> None:
        """Verify is done."""


@dataclass(frozen=True)
class Difference:
    """One differing key (keyless: one differing row value). ``kind``: ``changed`` (``columns``
    differ), ``missing`` (in the target), ``extra`` (in the target), ``duplicated`` (the key more
    than once in the target); keyless rows: ``count`` (the row's copies differ in number)."""

    key: list[Any]
    kind: str
    columns: list[str]
    source_rows: int
    target_rows: int

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "kind": self.kind, "columns": self.columns,
                "source_rows": self.source_rows, "target_rows": self.target_rows}


@dataclass
class TableCheck:
    """What verify found for one table."""

    table: str
    schema: TableSchema
    rows_source: int = 0
    rows_target: int = 0
    differences: list[Difference] = field(default_factory=list)
    # identity text -> (its hash, its key's texts): rows not settled yet
    pending: dict[str, tuple[int, KeyTexts]] = field(default_factory=dict)
    position: int | None = None  # the first point's position
    position_text: str | None = None  # as the source spells it
    error: str | None = None
    unlisted: int = 0  # rows in differing ranges, when too many to read (MAX_ROWS_COMPARED)

    @property
    def differs(self) -> bool:
        return bool(self.differences) or self.unlisted > 0


def both(source: Callable[[], A], target: Callable[[], B]) -> tuple[A, B]:
    """The two sides' queries at once (each engine works in its own process or threads)."""
    with ThreadPoolExecutor(1, thread_name_prefix="verify-target") as pool:
        on_target = pool.submit(target)
        return source(), on_target.result()


def _checksums(source: SourceSide, target: LakeSide, table: TableSchema, scope: Ranges,
               bits: int) -> tuple[Checksums, Checksums]:
    return both(lambda: source.checksums(table, scope, bits), lambda: target.checksums(table, scope, bits))


def _differing(src: Checksums, tgt: Checksums) -> list[int]:
    return sorted(r for r in src.keys() | tgt.keys() if src.get(r) != tgt.get(r))


def _largest(src: Checksums, tgt: Checksums, ranges: list[int]) -> int:
    return max(max(src.get(r, (0, 0))[0], tgt.get(r, (0, 0))[0]) for r in ranges)


def first_bits(estimated_rows: int) -> int:
    """Bits of the first level: ranges of about ``RANGE_ROWS`` rows."""
    return 0 if estimated_rows <= RANGE_ROWS else min(MAX_FIRST_BITS, math.ceil(math.log2(estimated_rows / RANGE_ROWS)))


def differing_leaves(source: SourceSide, target: LakeSide, check: TableCheck, sample: float,
                     estimated_rows: int, progress: Progress) -> Ranges | None:
    """Checksums per range on both sides, splitting differing ranges until they are leaf-sized;
    the leaves that differ (None: the table is equal)."""
    table = check.schema
    bits = first_bits(estimated_rows)
    scope = Ranges(0, None, sample)
    src, tgt = _checksums(source, target, table, scope, bits)
    check.rows_source = sum(n for n, _ in src.values())
    check.rows_target = sum(n for n, _ in tgt.values())
    diff = _differing(src, tgt)
    while diff and bits < HASH_BITS and _largest(src, tgt, diff) > LEAF_ROWS:
        progress.note(f"{check.table}: {len(diff)} of {max(len(src), len(tgt))} ranges differ, splitting them")
        more = max(1, math.ceil(math.log2(_largest(src, tgt, diff) / SPLIT_TO_ROWS)))
        scope = Ranges(bits, tuple(diff), sample)
        bits = min(HASH_BITS, bits + more)
        src, tgt = _checksums(source, target, table, scope, bits)
        diff = _differing(src, tgt)
    if diff and (rows := sum(max(src.get(r, (0, 0))[0], tgt.get(r, (0, 0))[0]) for r in diff)) > MAX_ROWS_COMPARED:
        check.unlisted = rows
    return Ranges(bits, tuple(diff), sample) if diff else None


def _group(rows: list[RowImage]) -> dict[str, list[RowImage]]:
    out: dict[str, list[RowImage]] = {}
    for r in rows:
        out.setdefault(r.ident, []).append(r)
    return out


def shown_value(kind: TypeKind, text: str | None) -> Any:
    """A compared text as the report shows it (JSON): numbers as numbers, timestamps in ISO 8601,
    the rest as the text compared."""
    if text is None:
        return None
    match kind:
        case TypeKind.INT | TypeKind.LONG:
            return int(text)
        case TypeKind.FLOAT | TypeKind.DOUBLE:
            return float(text) if text not in ("NaN", "Infinity", "-Infinity") else text
        case TypeKind.BOOLEAN:
            return text == "true"
        case TypeKind.TIMESTAMP | TypeKind.TIMESTAMPTZ if text.lstrip("-").isdigit():
            moment = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=int(text))
            return moment.isoformat() if kind is TypeKind.TIMESTAMPTZ else moment.replace(tzinfo=None).isoformat()
    return text


def key_texts(table: TableSchema, row: RowImage) -> KeyTexts:
    """The compared texts of ``row``'s key columns (a keyless row's: all its columns)."""
    names = table.column_names
    return tuple(row.values[names.index(c.name)] for c in identity_columns(table))


def _key_values(table: TableSchema, row: RowImage) -> list[Any]:
    """The identity's values (a keyless row's: all of them) as the report shows them."""
    names = table.column_names
    return [shown_value(c.type.kind, row.values[names.index(c.name)]) for c in identity_columns(table)]


def _changed_columns(table: TableSchema, a: RowImage, b: RowImage) -> list[str]:
    return [c.name for c, x, y in zip(table.columns, a.values, b.values, strict=True) if x != y]


def _older(tag: Any, position: int) -> bool:
    return tag is None or int(tag) < position


def judge(check: TableCheck, source_rows: list[RowImage], target_rows: list[RowImage], position: int,
          now: Callable[[Ranges], dict[str, set[str]]]) -> None:
    """Compare the rows of the differing leaves; add proven differences to ``check`` and keep the
    unproven ones in ``check.pending``. ``now`` reads the identities' source tuple versions anew."""
    table = check.schema
    src, tgt = _group(source_rows), _group(target_rows)
    unequal = []
    for ident in src.keys() | tgt.keys():
        s, t = src.get(ident, []), tgt.get(ident, [])
        # keyless: an identity is the whole row, so only the number of copies can differ
        same = len(s) == len(t) == 1 and s[0].row_hash == t[0].row_hash if table.key else len(s) == len(t)
        if not same:
            unequal.append(ident)
    firsts = [(src.get(i) or tgt[i])[0] for i in unequal]
    versions = now(_exactly(table, firsts)) if unequal else {}
    for ident in unequal:
        s, t = src.get(ident, []), tgt.get(ident, [])
        check.pending.pop(ident, None)
        old = sum(1 for r in t if _older(r.tag, position))
        unchanged = bool(s) and versions.get(ident) == {r.tag for r in s}
        if table.key:
            proven = len(t) > 1 or old == 1 or unchanged
        else:
            proven = old > len(s) or (unchanged and old == len(t))
        if not proven:
            check.pending[ident] = ((s or t)[0].ident_hash, key_texts(table, (s or t)[0]))
            continue
        check.differences.append(_difference(table, s, t))


def _exactly(table: TableSchema, rows: list[RowImage]) -> Ranges:
    """The identities of ``rows``, by whole hash and, for a keyed table, by key."""
    return Ranges(HASH_BITS, tuple(sorted({r.ident_hash for r in rows})),
                  keys=tuple(key_texts(table, r) for r in rows) if table.key else None)


def _difference(table: TableSchema, s: list[RowImage], t: list[RowImage]) -> Difference:
    key = _key_values(table, (s or t)[0])
    if not table.key:
        return Difference(key, "count", [], len(s), len(t))
    if not t:
        return Difference(key, "missing", [], 1, 0)
    if not s:
        return Difference(key, "extra" if len(t) == 1 else "duplicated", [], 0, len(t))
    columns = sorted({c for r in t for c in _changed_columns(table, s[0], r)},
                     key=table.column_names.index)
    return Difference(key, "changed" if len(t) == 1 else "duplicated", columns, 1, len(t))


def compare_table(source: SourceSide, target: LakeSide, current: SourceSide, check: TableCheck, position: int,
                  sample: float, estimated_rows: int, progress: Progress) -> None:
    """The first round for one table: every range (or the sampled share), at ``position``."""
    leaves = differing_leaves(source, target, check, sample, estimated_rows, progress)
    if leaves is None:
        return
    if check.unlisted:
        return
    progress.note(f"{check.table}: comparing the rows of {len(leaves.among or ())} ranges")
    src, tgt = both(lambda: source.rows(check.schema, leaves), lambda: target.rows(check.schema, leaves))
    judge(check, src, tgt, position, lambda exact: current.versions(check.schema, exact))


def recheck_table(source: SourceSide, target: LakeSide, current: SourceSide, check: TableCheck,
                  position: int) -> None:
    """A later round: only the identities not settled yet, at a new ``position``."""
    pending, check.pending = check.pending, {}
    exact = Ranges(HASH_BITS, tuple(sorted({h for h, _ in pending.values()})),
                   keys=tuple(k for _, k in pending.values()) if check.schema.key else None)
    src, tgt = both(lambda: source.rows(check.schema, exact), lambda: target.rows(check.schema, exact))
    judge(check, [r for r in src if r.ident in pending], [r for r in tgt if r.ident in pending], position,
          lambda exact: current.versions(check.schema, exact))
