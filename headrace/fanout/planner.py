"""Turn one shared change read into per-destination deletes and upserts, with Arrow compute.

Input: rows of ``ducklake_table_changes`` (``snapshot_id``, ``rowid``, ``change_type`` and the table's
columns) whose routing value belongs to the group being served. Per key, ordered by snapshot and
with a pre-state (``delete``/``update_preimage``) before a post-state (``insert``/``update_postimage``):

* the **first** change tells where the row was before the range: a pre-state routed to ``v`` means
  the destination of ``v`` holds it (so it is deleted there);
* the **last** change tells where it is after: a post-state routed to ``v`` is upserted there; a
  pre-state last means the row is gone or moved to a value outside the group.

So a cross-tenant move deletes on the old destination and upserts on the new; an insert then delete
in one range cancels (first is a post-state, last a pre-state: nothing written); an update shadowed
by a later delete only leaves the delete. The reasoning holds on a read filtered to the group's
routing values: any change that leaves ``v`` shows a pre-state routed to ``v``, so it is visible.
Splitting sorts once by destination index and slices, so it costs O(n log n), not O(n * destinations).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

CHANGE_COLUMNS = ("snapshot_id", "rowid", "change_type")
POST_STATES = pa.array(["insert", "update_postimage"])


@dataclass(frozen=True, slots=True)
class DestinationChanges:
    """What one destination must apply for one range: delete these keys, then insert these rows."""

    delete_keys: pa.Table
    upserts: pa.Table
    rows_read: int
    removed: int = 0  # keys deleted and not upserted again (net deletions)

    @property
    def empty(self) -> bool:
        return self.delete_keys.num_rows == 0 and self.upserts.num_rows == 0


@dataclass(slots=True)
class RoutedBatch:
    """The result of ``route``: per routing value, and the rows that netted out."""

    by_value: dict[str | int, DestinationChanges] = field(default_factory=dict)
    cancelled: int = 0  # keys inserted and deleted (or moved away) inside the range


def route_index(column: pa.ChunkedArray | pa.Array, values: Sequence[str | int]) -> pa.Array:
    """Position of each row's routing value in ``values`` (null for NULL or unknown values)."""
    value_set = pa.array(list(values), type=column.type)
    out = pc.index_in(column, value_set=value_set)
    return out.combine_chunks() if isinstance(out, pa.ChunkedArray) else out


def split_by_index(table: pa.Table, index: pa.Array, count: int) -> list[pa.Table]:
    """Rows of ``table`` grouped by ``index`` (0..count-1; nulls dropped): one sort, then slices."""
    if table.num_rows == 0:
        return [table.slice(0, 0)] * count
    valid = pc.is_valid(index)
    if not pc.all(valid).as_py():
        table = table.filter(valid)
        index = index.filter(valid)
    idx = index.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    order = np.argsort(idx, kind="stable")
    ordered = table.take(pa.array(order))
    offsets = np.concatenate(([0], np.cumsum(np.bincount(idx, minlength=count))))
    return [ordered.slice(int(offsets[i]), int(offsets[i + 1] - offsets[i])) for i in range(count)]


def route(
    changes: pa.Table,
    field_name: str,
    key_columns: Sequence[str],
    values: Sequence[str | int],
) -> RoutedBatch:
    """Resolve a change read and split it by routing value (full-change or append-only mode)."""
    data_columns = [c for c in changes.column_names if c not in CHANGE_COLUMNS]
    read_counts = _read_counts(changes, field_name, values)
    if not key_columns:
        return _route_appends(changes, field_name, values, data_columns, read_counts)
    if changes.num_rows == 0:
        empty = DestinationChanges(changes.select(list(key_columns)), changes.select(data_columns), 0)
        return RoutedBatch({v: empty for v in values})
    first, last = resolve_first_last(changes, key_columns)
    first_is_pre = pc.invert(pc.is_in(first["change_type"], value_set=POST_STATES))
    last_is_post = pc.is_in(last["change_type"], value_set=POST_STATES)
    # Where the row was before the range (only when the first change is a pre-state) and after it.
    before = pc.if_else(first_is_pre, route_index(first[field_name], values), None)
    after = pc.if_else(last_is_post, route_index(last[field_name], values), None)
    cancelled = pc.sum(pc.and_(pc.invert(first_is_pre), pc.invert(last_is_post))).as_py() or 0
    deletes = split_by_index(first.select(list(key_columns)), before, len(values))
    upserts = split_by_index(last.select(data_columns), after, len(values))
    gone = pc.fill_null(pc.not_equal(before, after), True)
    removed = _bincount(pc.filter(before, gone), len(values))
    return RoutedBatch(
        {
            v: DestinationChanges(deletes[i], upserts[i], read_counts[i], removed[i])
            for i, v in enumerate(values)
        },
        cancelled=int(cancelled),
    )


def resolve_first_last(changes: pa.Table, key_columns: Sequence[str]) -> tuple[pa.Table, pa.Table]:
    """First and last change of every key, aligned row by row (the preimage resolution step)."""
    post = pc.is_in(changes["change_type"], value_set=POST_STATES)
    ranked = changes.append_column("_hr_post", post)
    order = pc.sort_indices(
        ranked,
        sort_keys=[(k, "ascending") for k in key_columns]
        + [("snapshot_id", "ascending"), ("_hr_post", "ascending")],
    )
    ordered = changes.take(order)
    n = ordered.num_rows
    if n == 1:
        return ordered, ordered
    boundary = None
    for key in key_columns:
        col = ordered[key].combine_chunks()
        differs = pc.fill_null(pc.not_equal(col.slice(1), col.slice(0, n - 1)), True)
        boundary = differs if boundary is None else pc.or_(boundary, differs)
    assert boundary is not None
    true = pa.array([True])
    is_first = pa.concat_arrays([true, boundary])
    is_last = pa.concat_arrays([boundary, true])
    return ordered.filter(is_first), ordered.filter(is_last)


def _route_appends(
    changes: pa.Table,
    field_name: str,
    values: Sequence[str | int],
    data_columns: list[str],
    read_counts: list[int],
) -> RoutedBatch:
    inserts = changes.filter(pc.equal(changes["change_type"], "insert")).select(data_columns)
    parts = split_by_index(inserts, route_index(inserts[field_name], values), len(values))
    no_keys = pa.table({})
    return RoutedBatch({v: DestinationChanges(no_keys, parts[i], read_counts[i]) for i, v in enumerate(values)})


def _read_counts(changes: pa.Table, field_name: str, values: Sequence[str | int]) -> list[int]:
    if changes.num_rows == 0:
        return [0] * len(values)
    return _bincount(route_index(changes[field_name], values), len(values))


def _bincount(index: pa.Array, count: int) -> list[int]:
    idx = index.drop_null().to_numpy(zero_copy_only=False).astype(np.int64)
    return [int(c) for c in np.bincount(idx, minlength=count)]
