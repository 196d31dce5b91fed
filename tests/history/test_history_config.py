"""The ``history`` section: modes per table, names of the extra tables, and the refusals' sentences."""

from __future__ import annotations

from pathlib import Path

import pytest

from headrace.core.errors import ConfigError
from headrace.core.names import TableName
from headrace.core.schema import Column, ColumnType, TableSchema, TypeKind
from headrace.history.config import HistoryConfig, history_table
from headrace.history.queries import CHANGELOG_AS_OF, CHANGELOG_BETWEEN, SCD2_AS_OF
from headrace.history.writer import refuse_keyless


def test_modes_default_to_the_mirror_and_follow_the_pipeline_and_table_settings() -> None:
    orders, items = TableName("public", "orders"), TableName("public", "items")
    assert HistoryConfig().modes(orders) == ("mirror",)
    config = HistoryConfig(mode="scd2", tables={"public.orders": ("mirror", "changelog", "soft_delete")})
    assert config.history_modes(orders) == ("changelog", "soft_delete")
    assert config.extra_modes(orders) == ("changelog", "soft_delete") and config.mirrored(orders)
    # mode: scd2 makes every other table an scd2 table under its own name, with no mirror
    assert config.modes(items) == ("scd2",) and not config.mirrored(items) and config.extra_modes(items) == ()
    one = HistoryConfig(tables={"public.orders": ("changelog",)})
    assert one.history_modes(orders) == ("changelog",) and not one.mirrored(orders)
    assert history_table("orders", "changelog") == "orders__changelog"


@pytest.mark.parametrize(("modes", "says"), [
    (["scd2", "changelog"], "write ['mirror', 'scd2', 'changelog']"),
    (["scd2", "mirror"], "write ['mirror', 'scd2']"),
    (["mirror", "changelog", "changelog"], "a mode is listed twice"),
    ([], "give at least one mode"),
])
def test_bad_table_modes_are_refused_with_the_fix(modes: list[str], says: str) -> None:
    with pytest.raises(ValueError, match=None) as caught:
        HistoryConfig(tables={"public.orders": modes})
    assert says in str(caught.value)


def test_scd2_and_soft_delete_refuse_a_table_without_a_key() -> None:
    bag = TableSchema(1, "public", "bag", (Column("a", ColumnType(TypeKind.INT, "integer"), 23),), key=())
    refuse_keyless(bag, "changelog")
    with pytest.raises(ConfigError, match="history mode scd2 needs a key and table public.bag has none"):
        refuse_keyless(bag, "scd2")


def test_the_history_page_shows_the_queries_the_tests_run() -> None:
    page = " ".join((Path(__file__).parents[2] / "docs" / "history.md").read_text().split())
    for query, table in ((SCD2_AS_OF, "orders__scd2"), (CHANGELOG_AS_OF, "orders__changelog"),
                         (CHANGELOG_BETWEEN, "orders__changelog")):
        text = query.format(table=f"lake.public.{table}", columns="id, name, bal", key="id")
        assert " ".join(text.split()) in page, query


def test_a_history_mode_in_place_of_the_mirror_is_taken_on_iceberg(tmp_path: Path) -> None:
    from headrace.config import parse_config

    raw = {"name": "t", "source": {"dsn": "postgresql://x/y", "tables": ["public.orders"]},
           "target": {"iceberg": {"warehouse": str(tmp_path / "w")}}, "staging": {"path": str(tmp_path / "s")}}
    parse_config({**raw, "history": {"tables": {"public.orders": ["mirror", "scd2"]}}})
    config = parse_config({**raw, "history": {"mode": "scd2"}})
    assert not config.history.mirrored(TableName("public", "orders"))
