"""The ``history`` section: which modes each table is written in (docs/history.md).

``mirror`` is the table as the source holds it now (what headrace always wrote); ``changelog``,
``scd2`` and ``soft_delete`` keep the history the source throws away. A table in one mode keeps its
name: ``[scd2]`` (or ``mode: scd2``) makes the table itself an scd2 table, with no mirror; the
initial copy lands in it and becomes its first rows (``HistoryWriter.start``). A table in more modes
lists the mirror first (``[mirror, changelog]``): the mirror keeps the name and every other mode is
written to ``<table>__<mode>`` beside it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from headrace.core.names import TableName, TableNameError
from headrace.core.settings import Frozen

Mode = Literal["mirror", "changelog", "scd2", "soft_delete"]
HISTORY_MODES: tuple[Mode, ...] = ("changelog", "scd2", "soft_delete")
SUFFIX = "__"  # <table>__<mode>


def history_table(table: str, mode: Mode) -> str:
    """The target name of ``table``'s extra ``mode`` table (``orders__changelog``)."""
    return f"{table}{SUFFIX}{mode}"


class HistoryConfig(Frozen):
    """Per table, the modes it is written in; ``mirror`` alone when the section is absent."""

    mode: Mode = Field(
        "mirror", description="the pipeline's default mode: mirror, or a history mode (changelog, scd2,"
        " soft_delete) every table is written in under its own name, with no mirror")
    tables: dict[str, tuple[Mode, ...]] = Field(
        default_factory=dict, description="per table (schema.table), the modes it is written in: one mode"
        " ([scd2]: the table itself is the scd2 table), or mirror first and more modes ([mirror, changelog]:"
        " each mode after the mirror is written to <table>__<mode>)")

    @field_validator("tables")
    @classmethod
    def _valid_tables(cls, tables: dict[str, tuple[Mode, ...]]) -> dict[str, tuple[Mode, ...]]:
        for name, modes in tables.items():
            try:
                TableName.parse(name)
            except TableNameError as exc:
                raise ValueError(f"history.tables: {exc}") from None
            if not modes:
                raise ValueError(f"history.tables {name}: give at least one mode, e.g. [scd2] or [mirror, changelog]")
            if len(set(modes)) != len(modes):
                raise ValueError(f"history.tables {name}: a mode is listed twice in {list(modes)}; list each once")
            if len(modes) > 1 and modes[0] != "mirror":
                raise ValueError(_mirror_first(name, modes))
        return tables

    def modes(self, table: TableName) -> tuple[Mode, ...]:
        """``table``'s modes: its own entry, else the pipeline's ``mode`` alone."""
        for name, modes in self.tables.items():
            if TableName.parse(name) == table:
                return modes
        return (self.mode,)

    def mirrored(self, table: TableName) -> bool:
        """``table`` has a mirror (under its own name)."""
        return "mirror" in self.modes(table)

    def history_modes(self, table: TableName) -> tuple[Mode, ...]:
        """``table``'s modes other than the mirror, in the order configured (each batch writes them)."""
        return tuple(m for m in self.modes(table) if m != "mirror")

    def extra_modes(self, table: TableName) -> tuple[Mode, ...]:
        """The modes written to ``<table>__<mode>`` tables: every mode after the first."""
        return self.modes(table)[1:]


def _mirror_first(name: str, modes: tuple[Mode, ...]) -> str:
    rest = [m for m in modes if m != "mirror"]
    return (f"history.tables {name}: {list(modes)} names more than one mode without the mirror first; a table"
            f" without a mirror is written in one mode ([{rest[0]}]: the table itself), a table in several"
            f" lists the mirror first and the rest go beside it: write {['mirror', *rest]}")
