"""The row shape's types: each PostgreSQL/MySQL type as the Spark type every target and both engines
write (``spark_type``), and the rules for values no type holds (``ValueRules``).

The mapping from ``ColumnType`` to Spark type is a contract: the DuckLake target reads the same
rows, so change it only together with every target. The casts from a source's text output to these
types are each engine's: ``engines.spark.casts`` (Spark SQL, the reference) and ``engines.driver.casts``
(DuckDB, which takes only the text forms where it gives the very same value).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    StringType,
    TimestampNTZType,
    TimestampType,
)

from headrace.core.errors import UnsupportedError
from headrace.core.schema import ColumnType, TypeKind

# Spark's DecimalType holds at most 38 digits.
MAX_DECIMAL_PRECISION = 38


SPARK_TYPES: dict[TypeKind, DataType] = {
    TypeKind.INT: IntegerType(),
    TypeKind.LONG: LongType(),
    TypeKind.FLOAT: FloatType(),
    TypeKind.DOUBLE: DoubleType(),
    TypeKind.BOOLEAN: BooleanType(),
    TypeKind.STRING: StringType(),
    TypeKind.UUID: StringType(),
    TypeKind.JSON: StringType(),
    TypeKind.INTERVAL: StringType(),
    TypeKind.TIME: StringType(),
    TypeKind.DATE: DateType(),
    TypeKind.TIMESTAMP: TimestampNTZType(),
    TypeKind.TIMESTAMPTZ: TimestampType(),
    TypeKind.BINARY: BinaryType(),
}


def spark_type(ct: ColumnType) -> DataType:
    """The Spark type that holds values of logical type ``ct``."""
    if ct.kind in SPARK_TYPES:
        return SPARK_TYPES[ct.kind]
    if ct.kind is TypeKind.DECIMAL:
        if ct.precision is None or ct.scale is None:
            raise UnsupportedError(
                f"{ct.pg_type}: a DECIMAL logical type needs precision and scale "
                "(unconstrained numeric maps to STRING)"
            )
        if ct.precision > MAX_DECIMAL_PRECISION:
            raise UnsupportedError(
                f"{ct.pg_type}: precision {ct.precision} exceeds Spark's {MAX_DECIMAL_PRECISION} digits; "
                "map this column to STRING"
            )
        return DecimalType(ct.precision, ct.scale)
    if ct.kind is TypeKind.LIST:
        if ct.element is None:
            raise UnsupportedError(f"{ct.pg_type}: a LIST logical type needs an element type")
        return ArrayType(spark_type(ct.element), containsNull=True)
    raise UnsupportedError(f"{ct.pg_type}: no Spark type for logical type {ct.kind.value}")


# Values beyond a datetime target's range under ``infinity: clamp``: the bounds most readers can
# represent (Python, Java, pandas all hold years 1..9999), instead of Spark's or PostgreSQL's
# extremes, which many readers cannot.
CLAMP_BOUNDS: dict[TypeKind, tuple[str, str]] = {
    TypeKind.DATE: ("0001-01-01", "9999-12-31"),
    TypeKind.TIMESTAMP: ("0001-01-01 00:00:00", "9999-12-31 23:59:59.999999"),
    TypeKind.TIMESTAMPTZ: ("0001-01-01 00:00:00+00", "9999-12-31 23:59:59.999999+00"),
}


DATETIME_KINDS = frozenset(CLAMP_BOUNDS)


INT32_MAX = 2**31 - 1


INT64_MAX = 2**63 - 1


InfinityPolicy = Literal["clamp", "stop"]


@dataclass(frozen=True)
class ValueRules:
    """What the casts of one table do with values a target type cannot hold.

    ``table`` names the table in error messages. With ``keep_infinity`` (the target has infinite
    dates and timestamps) ``infinity``/``-infinity`` are stored as DuckDB stores them (largest
    int32 day, largest int64 microsecond). ``infinity`` is the policy for the other values past a
    date or timestamp range: ``clamp`` replaces them with ``CLAMP_BOUNDS``, ``stop`` stops the table.
    """

    table: str = "(unknown table)"
    infinity: InfinityPolicy = "stop"
    keep_infinity: bool = False


def value_rules(table: str, target: object, infinity: InfinityPolicy) -> ValueRules:
    """The rules for ``table`` written to ``target`` (a ``Target``) under the configured policy."""
    return ValueRules(table, infinity, keep_infinity=bool(getattr(target, "keeps_infinity", False)))


def parse_array_literal(text: str | None) -> list[str | None] | None:
    """Split PostgreSQL's one-dimensional array output into element texts.

    ``{1,2,NULL,"a b","x\\"y"}`` gives ``["1", "2", None, "a b", 'x"y']``: an unquoted NULL is SQL
    NULL, a quoted "NULL" is the string.

    Raises ValueError for what a list cannot hold faithfully: a multi-dimensional array
    (``{{1,2},{3,4}}``) and non-default lower bounds (``[0:1]={1,2}``, which print with a prefix).
    """
    if text is None:
        return None
    if text.startswith("["):
        raise ValueError(f"array with non-default bounds has no list form: {text[:80]!r}")
    if len(text) < 2 or text[0] != "{" or text[-1] != "}":
        raise ValueError(f"not a PostgreSQL array literal: {text[:80]!r}")
    items: list[str | None] = []
    i, end = 1, len(text) - 1
    if i == end:
        return items
    while True:
        if text[i] == "{":
            raise ValueError(f"multi-dimensional arrays are not supported: {text[:80]!r}")
        if text[i] == '"':
            buf = []
            i += 1
            while text[i] != '"':
                if text[i] == "\\":
                    i += 1
                buf.append(text[i])
                i += 1
            items.append("".join(buf))
            i += 1
        else:
            j = text.find(",", i, end)
            j = end if j < 0 else j
            raw = text[i:j]
            items.append(None if raw == "NULL" else raw)
            i = j
        if i >= end:
            return items
        i += 1  # the comma


def parse_array_or_none(text: str | None) -> list[str | None] | None:
    try:
        return parse_array_literal(text)
    except ValueError:
        return None


# Defined at import time so every use shares one UDF (and Spark ships it once per plan).
