"""Table names: the SQL-style parser, the display form and the quoting of each dialect."""

from __future__ import annotations

import pytest
import yaml

from headrace.config import SourceConfig, columns_as_text_item
from headrace.core.names import ColumnName, TableName, TableNameError, display_ident, quote_ident, quote_spark


@pytest.mark.parametrize(("text", "schema", "name"), [
    ("orders", "public", "orders"),
    ("public.orders", "public", "orders"),
    ("Sales.Orders", "sales", "orders"),  # unquoted folds to lower case, as in SQL
    ('"Sales"."Order Items"', "Sales", "Order Items"),
    ('"Sales".orders', "Sales", "orders"),
    ('public."a.b"', "public", "a.b"),
    ('public."x""y"', "public", 'x"y'),
    ("public.order", "public", "order"),  # a reserved word needs no quotes in the config
    ("café.表", "café", "表"),  # non-ASCII letters are fine unquoted, and kept as they are
    ("CAFÉ.T", "cafÉ", "t"),  # PostgreSQL folds ASCII only
    (" public . orders ", "public", "orders"),
    ('"in/out"', "public", "in/out"),
    ("s$1.t_2", "s$1", "t_2"),
])
def test_parse(text: str, schema: str, name: str) -> None:
    parsed = TableName.parse(text)
    assert (parsed.schema, parsed.name) == (schema, name)
    assert TableName.parse(str(parsed)) == parsed  # the display form parses back to the same name


@pytest.mark.parametrize(("text", "says"), [
    ("public.Order Items", "quote a name that holds spaces.*'public.\"Order Items\"'"),
    ("a.b.c", "3 dot-separated parts"),
    ('"abc', "unclosed double quote"),
    ("", "empty table name"),
    ("public.", "an empty part"),
    ('public.""', "empty quoted part"),
    ('public."x"y', "after a quoted name"),
    ("t" * 64, "64 bytes: PostgreSQL names are at most 63 bytes"),
])
def test_parse_errors_say_what_and_how(text: str, says: str) -> None:
    with pytest.raises(TableNameError, match=says):
        TableName.parse(text)


def test_63_bytes_is_the_limit() -> None:
    name = "é" * 31 + "x"
    assert len(name.encode()) == 63
    assert TableName.parse(f'"{name}"').name == name


@pytest.mark.parametrize(("name", "shown"), [
    ("orders", "orders"), ("_x1", "_x1"), ("Orders", '"Orders"'), ("order", '"order"'),
    ("select", '"select"'), ("a b", '"a b"'), ("a$b", '"a$b"'), ("1a", '"1a"'), ('x"y', '"x""y"'),
    ("café", '"café"'),
])
def test_display_matches_postgresql_quote_ident(name: str, shown: str) -> None:
    assert display_ident(name) == shown


def test_display_and_sql_forms() -> None:
    assert str(TableName("public", "orders")) == "public.orders"  # unchanged for existing users
    assert str(TableName("Sales", "Order Items")) == '"Sales"."Order Items"'
    assert TableName("public", "orders").sql == '"public"."orders"'


def test_dialect_quoting() -> None:
    assert quote_ident('a"b') == '"a""b"'
    assert quote_spark("a`b.c") == "`a``b.c`"


def test_config_tables_are_kept_in_display_form() -> None:
    source = SourceConfig(dsn="x", tables=["orders", 'Sales."Order Items"', '"Sales"."User"'])
    assert source.tables == ["public.orders", 'sales."Order Items"', '"Sales"."User"']
    assert source.table_names[2] == TableName("Sales", "User")


def test_config_errors_name_the_entry() -> None:
    with pytest.raises(ValueError, match="source.tables: table name 'public.Order Items'"):
        SourceConfig(dsn="x", tables=["public.Order Items"])
    with pytest.raises(ValueError, match="lists public.orders twice"):
        SourceConfig(dsn="x", tables=["orders", '"public"."orders"'])


@pytest.mark.parametrize(("text", "table", "column"), [
    ("public.grid.cells", TableName("public", "grid"), "cells"),
    ("grid.Cells", TableName("public", "grid"), "cells"),  # table.column is in public; unquoted folds
    ('"Sales"."Order Items"."Weird Col"', TableName("Sales", "Order Items"), "Weird Col"),
    ('s."a.b"."c""d"', TableName("s", "a.b"), 'c"d'),
])
def test_column_names_parse_like_sql(text: str, table: TableName, column: str) -> None:
    parsed = ColumnName.parse(text)
    assert parsed == ColumnName(table, column)
    assert ColumnName.parse(str(parsed)) == parsed  # the display form parses back


@pytest.mark.parametrize(("text", "says"), [
    ("cells", "has 1 dot-separated part(s); write schema.table.column"),
    ("a.b.c.d", "has 4 dot-separated part(s)"),
    ('public.grid."cells', "column 'public.grid.\"cells' has an unclosed double quote"),
    ("public.grid.Weird Col", "'Weird Col', which SQL cannot read unquoted"),
    ("", "empty column: write schema.table.column"),
])
def test_column_name_errors_say_how_to_write_it(text: str, says: str) -> None:
    with pytest.raises(TableNameError) as caught:
        ColumnName.parse(text)
    assert says in str(caught.value)


def test_config_columns_as_text_kept_in_display_form_and_checked() -> None:
    source = SourceConfig(dsn="x", tables=["grid"], columns_as_text=["Grid.Cells", '"Sales"."Order Items"."Weird Col"'])
    assert source.columns_as_text == ["public.grid.cells", '"Sales"."Order Items"."Weird Col"']
    assert source.text_columns == {ColumnName(TableName("public", "grid"), "cells"),
                                   ColumnName(TableName("Sales", "Order Items"), "Weird Col")}
    with pytest.raises(ValueError, match="no wildcards"):
        SourceConfig(dsn="x", tables=["grid"], columns_as_text=["public.grid.*"])
    with pytest.raises(ValueError, match="source.columns_as_text lists public.grid.cells twice"):
        SourceConfig(dsn="x", tables=["grid"], columns_as_text=["grid.cells", '"public"."grid"."cells"'])
    with pytest.raises(ValueError, match="source.columns_as_text: column 'cells' has 1"):
        SourceConfig(dsn="x", tables=["grid"], columns_as_text=["cells"])


def test_the_yaml_item_parses_back_to_the_same_column() -> None:
    for column in (ColumnName(TableName("public", "grid"), "cells"),
                   ColumnName(TableName("Sales", "Order Items"), "Weird Col"),
                   ColumnName(TableName("s", "t"), "a: #b 'c'")):
        item = columns_as_text_item(column)
        assert item.startswith("- ")
        (text,) = yaml.safe_load(item)
        assert ColumnName.parse(text) == column
    assert columns_as_text_item(ColumnName(TableName("public", "grid"), "cells")) == "- public.grid.cells"
