"""Logical types as DuckDB types, and the casts from the Spark row shape into them.

DuckDB has closer matches than Spark for several PostgreSQL types (UUID, JSON, TIME), which
arrive as PostgreSQL's text output and are cast inside DuckDB. Intervals stay PostgreSQL's text:
DuckLake stores DuckDB's INTERVAL as Parquet's INTERVAL, which holds milliseconds and no negative
part, so ``-1 day`` could not be written and microseconds would be dropped. Spark writes the other types
to Parquet exactly as DuckLake stores them, so those files can be registered without a rewrite.
"""

from __future__ import annotations

from typing import Any

from headrace.core.errors import UnsupportedError
from headrace.core.schema import ColumnType, TypeKind

_SIMPLE: dict[TypeKind, str] = {
    TypeKind.INT: "INTEGER",
    TypeKind.LONG: "BIGINT",
    TypeKind.FLOAT: "REAL",
    TypeKind.DOUBLE: "DOUBLE",
    TypeKind.BOOLEAN: "BOOLEAN",
    TypeKind.STRING: "VARCHAR",
    TypeKind.DATE: "DATE",
    TypeKind.TIME: "TIME",
    TypeKind.TIMESTAMP: "TIMESTAMP",
    TypeKind.TIMESTAMPTZ: "TIMESTAMPTZ",
    TypeKind.BINARY: "BLOB",
    TypeKind.UUID: "UUID",
    TypeKind.JSON: "JSON",
    TypeKind.INTERVAL: "VARCHAR",  # PostgreSQL's text: see the module docstring
}

# Kinds that travel as text in Spark and so cannot be registered from Spark's Parquet as they are.
TEXT_KINDS = frozenset({TypeKind.UUID, TypeKind.JSON, TypeKind.TIME})


def duck_type(col_type: ColumnType) -> str:
    """The DuckDB type that stores ``col_type``."""
    if col_type.kind is TypeKind.DECIMAL:
        if col_type.precision is None or col_type.precision > 38:
            raise UnsupportedError(
                f"{col_type.pg_type}: DuckDB decimals hold at most 38 digits; "
                "map this column to STRING in the source type mapping"
            )
        return f"DECIMAL({col_type.precision},{col_type.scale or 0})"
    if col_type.kind is TypeKind.LIST:
        if col_type.element is None:
            raise UnsupportedError(f"{col_type.pg_type}: array type without an element type")
        return duck_type(col_type.element) + "[]"
    return _SIMPLE[col_type.kind]


def registers_directly(col_type: ColumnType) -> bool:
    """True when Spark's Parquet for this type is exactly what DuckLake stores (no cast needed)."""
    if col_type.kind is TypeKind.LIST:
        return col_type.element is not None and registers_directly(col_type.element)
    return col_type.kind not in TEXT_KINDS


def cast_in(expr: str, col_type: ColumnType) -> str:
    """SQL turning a value of the incoming Spark shape into the DuckDB type of ``col_type``."""
    return f"CAST({expr} AS {duck_type(col_type)})"


def cast_out(expr: str, col_type: ColumnType) -> str:
    """SQL reading a stored value back in the Spark row shape (text kinds as text)."""
    if col_type.kind in (TypeKind.UUID, TypeKind.JSON, TypeKind.TIME):
        return f"CAST({expr} AS VARCHAR)"
    if (
        col_type.kind is TypeKind.LIST
        and col_type.element
        and col_type.element.kind in TEXT_KINDS
    ):
        return f"CAST({expr} AS VARCHAR[])"
    return expr


def spark_type(col_type: ColumnType) -> Any:
    """The Spark type of this column in the row shape (see ``Target``)."""
    from pyspark.sql import types as T

    simple: dict[TypeKind, Any] = {
        TypeKind.INT: T.IntegerType(),
        TypeKind.LONG: T.LongType(),
        TypeKind.FLOAT: T.FloatType(),
        TypeKind.DOUBLE: T.DoubleType(),
        TypeKind.BOOLEAN: T.BooleanType(),
        TypeKind.DATE: T.DateType(),
        TypeKind.TIMESTAMP: T.TimestampNTZType(),
        TypeKind.TIMESTAMPTZ: T.TimestampType(),
        TypeKind.BINARY: T.BinaryType(),
    }
    if col_type.kind is TypeKind.DECIMAL:
        return T.DecimalType(col_type.precision or 38, col_type.scale or 0)
    if col_type.kind is TypeKind.LIST and col_type.element is not None:
        return T.ArrayType(spark_type(col_type.element))
    return simple.get(col_type.kind, T.StringType())
