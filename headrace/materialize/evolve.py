"""Schema evolution: what turned a table's old shape into its new one, and whether targets can follow.

Capture stages every change with the shape the RELATION message before it described, and the
materializer applies a table's changes in order, one shape per batch. Between two batches of
different shapes, ``plan_changes`` lists the schema changes in between and the target applies them
(``Target.evolve``), so a change written before an ALTER lands in the old shape and one written
after it in the new.

Columns are matched by attnum when both shapes know it (a rename keeps the attnum; a column dropped
and added again under the same name gets a new one), by name otherwise.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from headrace.config import SchemaChangesConfig
from headrace.core.errors import SchemaChangeError
from headrace.core.names import display_ident
from headrace.core.schema import Column, ColumnType, SchemaChange, TableSchema, TypeKind
from headrace.logs import event

if TYPE_CHECKING:
    from headrace.core.interfaces import Target
    from headrace.state.store import StateStore

log = logging.getLogger("headrace.materialize")


def widens(old: ColumnType, new: ColumnType) -> bool:
    """Whether every value of ``old`` is a value of ``new`` in every target (Iceberg's promotions)."""
    if old == new:
        return True
    if (old.kind, new.kind) in ((TypeKind.INT, TypeKind.LONG), (TypeKind.FLOAT, TypeKind.DOUBLE)):
        return True
    if old.kind is TypeKind.DECIMAL and new.kind is TypeKind.DECIMAL:
        return (old.scale == new.scale and old.precision is not None and new.precision is not None
                and new.precision >= old.precision)
    return False


def same_target_type(old: ColumnType, new: ColumnType) -> bool:
    """Both types are stored alike by every target (e.g. varchar(10) and text; smallint and integer)."""
    def shape(t: ColumnType) -> tuple[object, ...]:
        return (t.kind, t.precision, t.scale, shape(t.element) if t.element else None)
    return shape(old) == shape(new)


def _match(old: TableSchema, new: TableSchema) -> list[tuple[Column | None, Column | None]]:
    """Pairs (old column, new column) of the same column; None on the side where it does not exist.

    By attnum where both sides know it; by name where one side does not. A column still unmatched
    whose attnum is unknown (renamed again before capture looked it up) is paired by position: a
    RELATION lists columns in attnum order and added columns come last, so a new column between two
    matched ones is the one unmatched old column between them, if there is exactly one.
    """
    by_attnum = {c.attnum: i for i, c in enumerate(old.columns) if c.attnum is not None}
    by_name = {c.name: i for i, c in enumerate(old.columns)}
    found: list[int | None] = []
    for col in new.columns:
        i = by_attnum.get(col.attnum) if col.attnum is not None else None
        j = by_name.get(col.name)
        if i is None and j is not None and (col.attnum is None or old.columns[j].attnum is None):
            i = j
        found.append(i if i not in found else None)
    for k, col in enumerate(new.columns):
        if found[k] is not None:
            continue
        lo = max((i for i in found[:k] if i is not None), default=-1)
        hi = min((i for i in found[k + 1:] if i is not None), default=len(old.columns))
        gap = [i for i in range(lo + 1, hi) if i not in found]
        unknown = col.attnum is None or any(old.columns[i].attnum is None for i in gap)
        if hi < len(old.columns) and len(gap) == 1 and unknown:
            found[k] = gap[0]
    pairs: list[tuple[Column | None, Column | None]] = [
        (old.columns[i] if i is not None else None, col) for i, col in zip(found, new.columns, strict=True)
    ]
    return pairs + [(c, None) for i, c in enumerate(old.columns) if i not in found]


def remapped_columns(old: TableSchema, new: TableSchema) -> list[tuple[Column, Column]]:
    """Columns (before, after) of the same PostgreSQL type that headrace now maps to another logical type.

    Only the config does that (a column added to or removed from ``source.columns_as_text``): the
    target column's type changes, which no target can follow in place.
    """
    return [(before, after) for before, after in _match(old, new)
            if before is not None and after is not None and not same_target_type(before.type, after.type)
            and before.type_oid != 0  # InvalidOid: a type not known by oid
            and (before.type_oid, before.typmod) == (after.type_oid, after.typmod)]


def _logical(ct: ColumnType) -> str:
    if ct.kind is TypeKind.LIST and ct.element is not None:
        return f"list<{_logical(ct.element)}>"
    if ct.kind is TypeKind.DECIMAL:
        return f"decimal({ct.precision},{ct.scale})"
    return ct.kind.value


def remap_error(table: TableSchema, pairs: list[tuple[Column, Column]]) -> SchemaChangeError:
    """The error for ``remapped_columns``: which columns, what changed, and the resync that follows it."""
    parts = []
    for before, after in pairs:
        listed = "now lists" if after.type.kind is TypeKind.STRING else "no longer lists"
        parts.append(f"column {display_ident(after.name)} ({after.type.pg_type}) is stored as {_logical(after.type)} instead of"
                     f" {_logical(before.type)} (source.columns_as_text {listed} it)")
    name = table.qualified_name
    return SchemaChangeError(
        f"{name}: {'; '.join(parts)}: the target table must be copied again in its new shape; run"
        f" `headrace resync {name}` (or restore source.columns_as_text and restart)")


def plan_changes(old: TableSchema, new: TableSchema, policy: SchemaChangesConfig) -> list[SchemaChange]:
    """The schema changes from ``old`` to ``new``, in the order a target applies them.

    Raises ``SchemaChangeError`` (saying what changed and how to recover) for what no target can
    follow in place: a type change that is not a widening, or a column added with a volatile default
    (PostgreSQL rewrote every row with values the change stream never carries). A new key needs
    nothing: the target holds exactly the source's rows, which the new key identifies as well.
    """
    order = {"drop_column": 0, "rename_column": 1, "alter_column_type": 2, "add_column": 3, "rename_table": 4}
    table = new.qualified_name
    fix = f"run `headrace resync {table}` to copy the table again in its new shape"
    changes: list[SchemaChange] = []
    unknown_fill = set(filter(None, new.extra.get("unknown_fill", "").split(",")))
    if remapped := remapped_columns(old, new):
        raise remap_error(new, remapped)
    for before, after in _match(old, new):
        if after is None:
            assert before is not None
            keep = policy.drop_column == "keep"
            kept = " (kept in the target; rows inserted from now on get NULL)" if keep else ""
            detail = f"column {before.name} dropped{kept}"
            changes.append(SchemaChange("drop_column", detail, before, apply=not keep))
        elif before is None:
            if after.name in unknown_fill:
                raise SchemaChangeError(
                    f"{table}: column {after.name} was added with a default whose value in the existing rows"
                    " the change stream does not carry (a volatile default such as clock_timestamp() or"
                    f" serial, or a table rewrite since, e.g. ALTER COLUMN TYPE, folded it into the rows); {fix}"
                )
            value = f" (existing rows: {after.missing})" if after.missing is not None else ""
            changes.append(SchemaChange("add_column", f"column {after.name} {after.type.pg_type} added{value}",
                                        after))
        else:
            if before.name != after.name:
                changes.append(SchemaChange("rename_column", f"column {before.name} renamed to {after.name}",
                                            after, old_name=before.name))
            if before.type != after.type:
                change = f"column {after.name} changed type from {before.type.pg_type} to {after.type.pg_type}"
                if not widens(before.type, after.type) and not same_target_type(before.type, after.type):
                    raise SchemaChangeError(
                        f"{table}: {change}, which the target cannot store in place (only widening: integer to"
                        f" bigint, real to double precision, numeric to a larger precision, varchar to text);"
                        f" {fix}"
                    )
                changes.append(SchemaChange("alter_column_type", change, after, old_type=before.type,
                                            apply=not same_target_type(before.type, after.type)))
    if (old.schema, old.name) != (new.schema, new.name):
        follow = policy.rename_table == "follow"
        detail = f"table {old.qualified_name} renamed to {table}" + (
            "" if follow else f" (target keeps {old.target_schema}.{old.target_table})")
        changes.append(SchemaChange("rename_table", detail, apply=follow))
    # Drops first (a new column may take a dropped one's name), renames before adds (likewise).
    return sorted(changes, key=lambda c: order[c.kind])


def evolve_table(state: StateStore, target: Target, old: TableSchema, new: TableSchema,
                 policy: SchemaChangesConfig, lsn: int | None) -> tuple[TableSchema, list[str]]:
    """Bring the target table from ``old`` to ``new``; return the schema to apply with and the DDL kinds.

    Idempotent: a crash after the target changed and before the state did runs it again, and the
    target skips what it already has. Records each change in ``_headrace.ddl_events``.
    """
    changes = plan_changes(old, new, policy)
    renamed = (old.schema, old.name) != (new.schema, new.name)
    if renamed and policy.rename_table == "keep":
        new = replace(new, target_as=(old.target_schema, old.target_table))
    elif not renamed:
        new = replace(new, target_as=old.target_as)
    target.evolve(old, new, changes)
    state.set_schema(new)
    for change in changes:
        state.record_ddl(new.oid, new.qualified_name, change.kind, change.detail, lsn)
        event(log, "table.schema_changed", table=new.qualified_name, kind=change.kind, detail=change.detail,
              applied=change.apply)
    return new, [c.kind for c in changes]
