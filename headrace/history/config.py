"""The ``history`` section: which modes each table is written in (docs/history.md).

``mirror`` is the table as the source holds it now (what headrace always wrote); ``changelog``,
``scd2`` and ``soft_delete`` keep the history the source throws away, each in a table of its own
named ``<table>__<mode>`` beside the mirror. The mirror stays: it is where the initial copy lands,
and the previous version every history table reads from (TOAST columns an update left unchanged,
the rows a history table starts from).
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
    """The target name of ``table``'s ``mode`` table (``orders__changelog``)."""
    return f"{table}{SUFFIX}{mode}"


class HistoryConfig(Frozen):
    """Per table, the modes it is written in; ``mirror`` alone when the section is absent."""

    mode: Mode = Field(
        "mirror", description="the pipeline's default mode: mirror, or a history mode (changelog, scd2,"
        " soft_delete) written beside the mirror as <table>__<mode>")
    tables: dict[str, tuple[Mode, ...]] = Field(
        default_factory=dict, description="per table (schema.table), the modes it is written in, e.g."
        " [mirror, changelog]; the first must be mirror (the table keeps its name), every other mode is"
        " written to <table>__<mode>")

    @field_validator("tables")
    @classmethod
    def _valid_tables(cls, tables: dict[str, tuple[Mode, ...]]) -> dict[str, tuple[Mode, ...]]:
        for name, modes in tables.items():
            try:
                TableName.parse(name)
            except TableNameError as exc:
                raise ValueError(f"history.tables: {exc}") from None
            if not modes:
                raise ValueError(f"history.tables {name}: give at least one mode, e.g. [mirror, changelog]")
            if len(set(modes)) != len(modes):
                raise ValueError(f"history.tables {name}: a mode is listed twice in {list(modes)}; list each once")
            if modes[0] != "mirror":
                raise ValueError(_not_in_place(name, modes))
        return tables

    def modes(self, table: TableName) -> tuple[Mode, ...]:
        """``table``'s modes, mirror first: its own entry, else the pipeline's ``mode`` beside the mirror."""
        for name, modes in self.tables.items():
            if TableName.parse(name) == table:
                return modes
        return ("mirror",) if self.mode == "mirror" else ("mirror", self.mode)

    def history_modes(self, table: TableName) -> tuple[Mode, ...]:
        """``table``'s modes other than the mirror, in the order configured."""
        return tuple(m for m in self.modes(table) if m != "mirror")


def _not_in_place(name: str, modes: tuple[Mode, ...]) -> str:
    wanted = list(modes) if "mirror" in modes else ["mirror", *modes]
    return (f"history.tables {name}: {list(modes)} would write {modes[0]} in place of the mirror, which this"
            f" version does not do (the mirror holds the copy and the previous versions); write"
            f" {wanted}: the {modes[0]} table is then {name.rsplit('.', 1)[-1]}__{modes[0]}")
