"""The schema change planner: which changes between two shapes, and which a target cannot follow."""

from __future__ import annotations

from dataclasses import replace

import pytest

from headrace.config import SchemaChangesConfig
from headrace.core.errors import SchemaChangeError
from headrace.core.schema import Column, ColumnType, TableSchema, TypeKind
from headrace.materialize.evolve import plan_changes, remapped_columns

INT = ColumnType(TypeKind.INT, "integer")
LONG = ColumnType(TypeKind.LONG, "bigint")
TEXT = ColumnType(TypeKind.STRING, "text")
VARCHAR = ColumnType(TypeKind.STRING, "character varying(20)")


def dec(p: int, s: int) -> ColumnType:
    return ColumnType(TypeKind.DECIMAL, f"numeric({p},{s})", p, s)


def table(*cols: tuple[str, ColumnType, int | None], name: str = "t") -> TableSchema:
    return TableSchema(1, "public", name, tuple(Column(n, t, 0, -1, True, a) for n, t, a in cols), ("id",))


OLD = table(("id", INT, 1), ("a", INT, 2), ("b", VARCHAR, 3), ("n", dec(10, 2), 4))
KEEP = SchemaChangesConfig()


def kinds(old: TableSchema, new: TableSchema, policy: SchemaChangesConfig = KEEP) -> list[tuple[str, bool]]:
    return [(c.kind, c.apply) for c in plan_changes(old, new, policy)]


def test_same_shape_plans_nothing() -> None:
    assert kinds(OLD, OLD) == []


def test_renames_follow_the_attnum_and_a_readded_column_is_new() -> None:
    renamed = table(("id", INT, 1), ("a2", INT, 2), ("b", VARCHAR, 3), ("n", dec(10, 2), 4))
    assert kinds(OLD, renamed) == [("rename_column", True)]
    # DROP a, ADD a (same name and type): a new attnum, so old values must not carry over.
    readded = table(("id", INT, 1), ("b", VARCHAR, 3), ("n", dec(10, 2), 4), ("a", INT, 5))
    assert kinds(OLD, readded) == [("drop_column", False), ("add_column", True)]
    # Without attnums (state written by an older version) columns match by name.
    no_attnums = table(("id", INT, None), ("a", INT, None), ("b", VARCHAR, None), ("n", dec(10, 2), None))
    assert kinds(no_attnums, OLD) == []


def test_widening_is_followed_and_same_storage_needs_no_target_change() -> None:
    wider = table(("id", INT, 1), ("a", LONG, 2), ("b", TEXT, 3), ("n", dec(14, 2), 4))
    assert kinds(OLD, wider) == [("alter_column_type", True), ("alter_column_type", False),
                                 ("alter_column_type", True)]


@pytest.mark.parametrize("a, n", [(TEXT, dec(10, 2)), (INT, dec(8, 2)), (INT, dec(12, 3))])
def test_anything_else_errors_naming_the_change_and_resync(a: ColumnType, n: ColumnType) -> None:
    changed = table(("id", INT, 1), ("a", a, 2), ("b", VARCHAR, 3), ("n", n, 4))
    with pytest.raises(SchemaChangeError, match=r"changed type from .* run `headrace resync public.t`"):
        plan_changes(OLD, changed, KEEP)


def test_a_rename_capture_looked_up_too_late_is_paired_by_position() -> None:
    # The catalog knew neither name any more (renamed again since): a lone gap between matches.
    late = replace(OLD, columns=tuple(replace(c, attnum=None) if c.name == "a" else c for c in OLD.columns))
    renamed = table(("id", INT, 1), ("a2", INT, None), ("b", VARCHAR, 3), ("n", dec(10, 2), 4))
    assert kinds(late, renamed) == [("rename_column", True)]
    # A trailing column could as well be new: not guessed.
    trailing = table(("id", INT, 1), ("a", INT, 2), ("b", VARCHAR, 3), ("n2", dec(10, 2), None))
    assert kinds(OLD, trailing) == [("drop_column", False), ("add_column", True)]


def test_an_added_column_whose_fill_is_unknown_needs_a_resync() -> None:
    added = replace(table(*[(c.name, c.type, c.attnum) for c in OLD.columns], ("at", TEXT, 5)),
                    extra={"unknown_fill": "at"})
    with pytest.raises(SchemaChangeError, match="volatile default"):
        plan_changes(OLD, added, KEEP)


def test_policies_decide_drops_and_table_renames_and_drops_come_first() -> None:
    new = table(("id", INT, 1), ("b", VARCHAR, 3), ("n", dec(10, 2), 4), ("c", TEXT, 6), name="t2")
    assert kinds(OLD, new) == [("drop_column", False), ("add_column", True), ("rename_table", False)]
    follow = SchemaChangesConfig(drop_column="drop", rename_table="follow")
    assert kinds(OLD, new, follow) == [("drop_column", True), ("add_column", True), ("rename_table", True)]


def test_a_column_the_config_now_keeps_as_text_needs_a_resync_naming_the_option() -> None:
    arr = ColumnType(TypeKind.LIST, "integer[]", element=INT)
    old = TableSchema(1, "public", "grid", (Column("id", INT, 23, -1, True, 1), Column("cells", arr, 1007, -1, True, 2)),
                      ("id",))
    as_text = replace(old, columns=(old.columns[0], replace(old.columns[1], type=ColumnType(TypeKind.STRING, "integer[]"))))
    assert [(b.name, a.type.kind) for b, a in remapped_columns(old, as_text)] == [("cells", TypeKind.STRING)]
    with pytest.raises(SchemaChangeError, match=r"column cells \(integer\[\]\) is stored as string instead of"
                       r" list<int> \(source.columns_as_text now lists it\).*`headrace resync public.grid`"):
        plan_changes(old, as_text, KEEP)
    with pytest.raises(SchemaChangeError, match="no longer lists it"):
        plan_changes(as_text, old, KEEP)
    # Another spelling of the same storage (an enum renamed) is no remapping.
    renamed = replace(as_text, columns=(old.columns[0], replace(as_text.columns[1], type=ColumnType(TypeKind.STRING, "x"))))
    assert remapped_columns(as_text, renamed) == []
