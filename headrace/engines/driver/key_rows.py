"""A table's keys held in memory between batches, so a batch finds the rows of its keys at a cost of
about the batch, not the table: what both targets keep for a table small enough
(``target.<format>.driver_key_rows``) instead of scanning its key column for every batch.

``KeyRows`` holds the rows (the key columns first, then whatever the target needs to find and
replace a row: Iceberg's file and row number, DuckLake's ``rowid``, and the positions), and which of
them are still live. Where the key is one integer column:
- the rows are kept sorted by key: the chunks as read in key order when each is sorted and they do
  not overlap (a copy writes a table in key order mostly), else sorted once (a copy of the rows); a
  batch's keys are found by binary search there (``_sorted_hits``), and by ``is_in`` among the rows
  appended since;
- replaced rows are only marked dead, new rows appended as a chunk;
- rows are taken chunk by chunk (``Table.take`` over many chunks costs about the table);
- once a quarter of the rows are dead, or the appended ones outgrow an eighth of the sorted ones,
  the rows are sorted again without the dead ones (amortized over the batches in between).
Other keys: ``is_in`` over every row.
"""

from __future__ import annotations

import collections
import operator
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

IDX = "_hr_index_row"  # a candidate row's number in its ``KeyRows``
# Rows appended (found by ``is_in``: at 2M rows ~20 ms for a batch of 10 keys, ~90 ms for 200,000)
# below which the rows are not sorted again for them. At 1M a transaction updating a 5M-row Iceberg
# table in batches of 200,000 had its 5M rows sorted every sixth batch, ~1.1 s each
# (bench/large_transaction.py); at 2M the quarter of dead rows comes first (every ninth).
RESORT_APPENDED = 2_000_000


@dataclass
class KeyRows:
    """Rows by key (the first column; see the module docstring); ``sort``: keep them sorted when the
    key is one integer column (a partial index, read for one batch, is not worth it)."""

    rows: pa.Table
    sort: bool = True
    _live: np.ndarray = field(init=False, repr=False)  # per row, with spare room at the end
    _dead: int = field(init=False, default=0)
    _base: int = field(init=False, default=0)  # rows[:_base]: as read or last sorted; the rest appended since
    _chunks: int = field(init=False, default=0)  # rows[:_base]'s chunks
    # rows[:_base]'s keys chunk by chunk, ascending, when the key is one unique integer column; else empty
    _runs: list[np.ndarray] = field(init=False, default_factory=list, repr=False)
    _firsts: np.ndarray = field(init=False, default_factory=lambda: np.zeros(0), repr=False)  # each run's first key
    _starts: np.ndarray = field(init=False, default_factory=lambda: np.zeros(0, np.int64), repr=False)  # first rows

    def __post_init__(self) -> None:
        self._live = np.ones(self.rows.num_rows, dtype=bool)
        if self.sort:
            self._sort()

    @property
    def live(self) -> np.ndarray:
        """Per row: not replaced or deleted since the rows were read."""
        return self._live[:self.rows.num_rows]

    @property
    def live_rows(self) -> int:
        """How many rows are ``live``: the table's rows the index stands for."""
        return self.rows.num_rows - self._dead

    def candidates(self, batch_keys: pa.Array | None) -> pa.Table:
        """The live rows holding one of ``batch_keys`` (None: every live row), with their row numbers
        here (``IDX``), ascending."""
        live = self.live
        if batch_keys is None:
            at = np.flatnonzero(live)
        elif not self._runs:
            at = np.flatnonzero(live & pc.is_in(self.rows.column(0), value_set=batch_keys)
                                .to_numpy(zero_copy_only=False))
        else:
            at = np.concatenate([self._sorted_hits(batch_keys), self._appended_hits(batch_keys)])
        return take_ascending(self.rows, at).append_column(IDX, pa.array(at, pa.int64()))

    def _sorted_hits(self, batch_keys: pa.Array) -> np.ndarray:
        """Live sorted rows holding one of ``batch_keys``, ascending (binary search: keys are unique there)."""
        wanted = np.unique(batch_keys.to_numpy(zero_copy_only=False))
        run_of = np.searchsorted(self._firsts, wanted, side="right") - 1
        found = []
        for run, mine in _groups(run_of, wanted):
            if run < 0:
                continue  # below the first key
            keys = self._runs[run]
            at = np.minimum(np.searchsorted(keys, mine), len(keys) - 1)
            found.append(self._starts[run] + at[keys[at] == mine])
        at = np.concatenate(found) if found else np.zeros(0, dtype=np.int64)
        return at[self._live[at]]

    def _appended_hits(self, batch_keys: pa.Array) -> np.ndarray:
        """Live rows appended since the last sort holding one of ``batch_keys``, ascending."""
        appended = self.rows.num_rows - self._base
        if not appended:
            return np.zeros(0, dtype=np.int64)
        mask = pc.is_in(self.rows.column(0).slice(self._base), value_set=batch_keys).to_numpy(zero_copy_only=False)
        return self._base + np.flatnonzero(mask & self._live[self._base:self.rows.num_rows])

    def update(self, removed: np.ndarray, added: pa.Table) -> None:
        """The rows at ``removed`` (``IDX``) gone, ``added`` (the rows' columns) appended."""
        removed = np.unique(removed)
        self._dead += int(self._live[removed].sum())
        self._live[removed] = False
        if added.num_rows:
            before, n = self.rows.num_rows, added.num_rows
            self.rows = pa.concat_tables([self.rows, added.select(self.rows.column_names).cast(self.rows.schema)])
            if len(self._live) < before + n:  # room doubles: appending costs about the batch
                grown = np.zeros(max(2 * len(self._live), before + n), dtype=bool)
                grown[:before] = self._live[:before]
                self._live = grown
            self._live[before:before + n] = True
        appended = self.rows.num_rows - self._base
        if (self._dead > self.rows.num_rows // 4
                or (self._runs and appended > max(RESORT_APPENDED, self._base // 8))):
            self._sort()
        elif self.rows.column(0).num_chunks > self._chunks + 64:  # the appended rows as one chunk
            self.rows = pa.concat_tables([self.rows.slice(0, self._base),
                                          self.rows.slice(self._base).combine_chunks()])

    def _sort(self) -> None:
        """Drop the dead rows, and keep the rest sorted by key when it is one integer column (``_runs``)."""
        rows, key = self.rows, self.rows.column(0)
        keep = np.flatnonzero(self.live) if self._dead else None
        self._runs = []
        if self.sort and rows.num_rows and pa.types.is_integer(key.type) and not key.null_count:
            rows = in_key_order(rows, keep)
            runs = [batch.column(0).to_numpy() for batch in rows.to_batches()]
            if not any((keys[1:] == keys[:-1]).any() for keys in runs):  # unique: one row a key
                self._runs = runs
                self._firsts = np.array([keys[0] for keys in runs])
                self._starts = np.cumsum([0, *(len(keys) for keys in runs[:-1])]).astype(np.int64)
        elif keep is not None:
            rows = take_ascending(rows, keep)
        self.rows, self._base, self._chunks = rows, rows.num_rows, rows.column(0).num_chunks
        self._live = np.ones(rows.num_rows, dtype=bool)
        self._dead = 0


def in_key_order(rows: pa.Table, keep: np.ndarray | None = None) -> pa.Table:
    """``rows`` (an integer first column, no NULL), only those at ``keep`` (ascending; None: all),
    sorted by it: with every row kept, its chunks reordered when each is sorted and they do not
    overlap (no copy); else one sort of the kept keys (stable: rows already in key order, the bulk of
    them, are one run for it) and one take, one chunk. Empty chunks dropped.

    Filtering the dead rows out first cost more than the sort: 56M rows of four int64 columns, 4.2 s
    to filter, 1.5 s to sort the keys, 1.9 s to take."""
    batches = [b for b in rows.to_batches() if b.num_rows]
    keys = [b.column(0).to_numpy() for b in batches]
    if keep is None and all((k[1:] >= k[:-1]).all() for k in keys):
        order = sorted(range(len(batches)), key=lambda i: keys[i][0])
        if all(keys[a][-1] < keys[b][0] for a, b in zip(order, order[1:], strict=False)):
            return pa.Table.from_batches([batches[i] for i in order], schema=rows.schema)
    every = np.concatenate(keys) if keys else np.zeros(0, dtype=np.int64)
    ordered = np.argsort(every, kind="stable") if keep is None else keep[np.argsort(every[keep], kind="stable")]
    return rows.take(pa.array(ordered, pa.int64())).combine_chunks()


def take_ascending(rows: pa.Table, at: np.ndarray) -> pa.Table:
    """``rows.take(at)`` for ascending ``at``, chunk by chunk: ``Table.take`` over many chunks costs
    about the whole table."""
    batches = rows.to_batches()
    if len(batches) <= 1:
        return rows.take(pa.array(at, pa.int64()))
    starts = np.cumsum([0, *(b.num_rows for b in batches[:-1])])
    chunk_of = np.searchsorted(starts, at, side="right") - 1
    parts = [batches[c].take(pa.array(mine - starts[c], pa.int64())) for c, mine in _groups(chunk_of, at)]
    return pa.Table.from_batches(parts, schema=rows.schema) if parts else rows.schema.empty_table()


def _groups(group_of: np.ndarray, values: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """(group, its slice of ``values``) for each group in ``group_of`` (non-decreasing, one per value):
    slices, not a mask per group, which cost the values times the groups (a table read from DuckLake
    comes in runs of 2,048 rows: 200K keys over 5M rows' 2,442 runs, 0.24-0.35 s -> ~0.03 s)."""
    if not len(values):
        return
    groups, first = np.unique(group_of, return_index=True)
    ends = [*first[1:], len(values)]
    for group, lo, hi in zip(groups, first, ends, strict=True):
        yield int(group), values[lo:hi]


class _Held(Protocol):
    @property
    def held_rows(self) -> int: ...


Index = TypeVar("Index", bound=_Held)


class KeyCache(Generic[Index]):
    """Indexes of recently applied tables by place (a table's location or name), up to the budget
    ``put`` is given in all (least recently used out first), measured by ``size`` (default: the rows
    each holds). Whether an index still follows its table is for the target to check: each holds what
    it needs (the snapshot it is at)."""

    def __init__(self, size: Callable[[Index], int] = operator.attrgetter("held_rows")) -> None:
        self._lock = threading.Lock()
        self._size = size
        self._indexes: collections.OrderedDict[str, Index] = collections.OrderedDict()

    def take(self, place: str) -> Index | None:
        """The index of the table at ``place``, out of the cache until ``put`` back (a failed apply
        leaves it out: read again)."""
        with self._lock:
            return self._indexes.pop(place, None)

    def put(self, place: str, index: Index, budget: int) -> None:
        with self._lock:
            self._indexes.pop(place, None)
            self._indexes[place] = index
            while len(self._indexes) > 1 and sum(map(self._size, self._indexes.values())) > budget:
                self._indexes.popitem(last=False)

    def drop(self, place: str) -> None:
        with self._lock:
            self._indexes.pop(place, None)
