"""The columns of each history table beside the source's, and the Arrow shape its rows are written in."""

from __future__ import annotations

import pyarrow as pa

from headrace.core.errors import TerminalError
from headrace.core.schema import TableSchema
from headrace.engines.driver.casts import arrow_type
from headrace.history import build as b
from headrace.history.config import Mode

_TS = pa.timestamp("us", tz="UTC")
# (name, Arrow type, DuckDB type, Spark SQL type) after the source columns, per mode.
EXTRA: dict[Mode, tuple[tuple[str, pa.DataType, str, str], ...]] = {
    "changelog": ((b.OP, pa.string(), "VARCHAR", "STRING"), (b.COMMIT_TS, _TS, "TIMESTAMPTZ", "TIMESTAMP"),
                  (b.LSN, pa.int64(), "BIGINT", "BIGINT"), (b.SEQ, pa.int64(), "BIGINT", "BIGINT"),
                  (b.XID, pa.int64(), "BIGINT", "BIGINT")),
    "scd2": ((b.VALID_FROM, _TS, "TIMESTAMPTZ", "TIMESTAMP"), (b.VALID_TO, _TS, "TIMESTAMPTZ", "TIMESTAMP"),
             (b.CURRENT, pa.bool_(), "BOOLEAN", "BOOLEAN"), (b.LSN, pa.int64(), "BIGINT", "BIGINT"),
             (b.SEQ, pa.int64(), "BIGINT", "BIGINT"), (b.END_LSN, pa.int64(), "BIGINT", "BIGINT"),
             (b.END_SEQ, pa.int64(), "BIGINT", "BIGINT")),
    "soft_delete": ((b.DELETED_AT, _TS, "TIMESTAMPTZ", "TIMESTAMP"), (b.COMMIT_TS, _TS, "TIMESTAMPTZ", "TIMESTAMP"),
                    (b.LSN, pa.int64(), "BIGINT", "BIGINT"), (b.SEQ, pa.int64(), "BIGINT", "BIGINT")),
}
# The column that only the ``mode`` table has (never a mirror): a table under its own name that has it is
# that mode's table, holding history (a copy must not replace it).
IN_PLACE_MARKERS: dict[Mode, str] = {"changelog": b.OP, "scd2": b.CURRENT, "soft_delete": b.DELETED_AT}


def in_place_mode(columns: set[str]) -> Mode | None:
    """The history mode a table of these ``columns`` under its own name is written in; None: a mirror's."""
    return next((m for m, marker in IN_PLACE_MARKERS.items() if marker in columns), None)


def refuse_other_mode(table: TableSchema, name: str, columns: set[str], mode: Mode, what: str) -> None:
    """Before a table under its own name becomes the ``mode`` table: refused when its ``columns`` say it is
    another mode's (``what`` names the table to drop, e.g. "that lake table")."""
    if other := [m for m, marker in IN_PLACE_MARKERS.items() if marker in columns and m != mode]:
        raise TerminalError(f"table {table.qualified_name}: {name} is its {other[0]} table and history mode {mode}"
                            f" is configured for it: put back [{other[0]}], or drop {what} (its history is lost)"
                            f" and resync to start it as {mode}")


def arrow_schema(table: TableSchema, mode: Mode) -> pa.Schema:
    """The rows of ``table``'s ``mode`` table as the builders give them: source columns in the
    mirror batch's Arrow types, then the mode's columns."""
    fields = [pa.field(c.name, arrow_type(c.type)) for c in table.columns]
    fields += [pa.field(name, kind) for name, kind, _, _ in EXTRA[mode]]
    return pa.schema(fields)


def to_arrow(table: TableSchema, mode: Mode, rows: list[b.Row]) -> pa.Table:
    """``rows`` (dicts) as an Arrow table of ``arrow_schema``."""
    schema = arrow_schema(table, mode)
    return pa.Table.from_arrays([pa.array([r.get(f.name) for r in rows], f.type) for f in schema], schema=schema)


def key_table(table: TableSchema, keys: list[tuple[object, ...]]) -> pa.Table:
    """Keys as an Arrow table of the key columns."""
    fields = [pa.field(k, arrow_type(table.column(k).type)) for k in table.key]
    return pa.Table.from_pylist([dict(zip(table.key, k, strict=True)) for k in keys], schema=pa.schema(fields))
