"""From PostgreSQL's text output to Spark values, one cast per logical type.

Values reach Spark as the text PostgreSQL prints for them: COPY (text or CSV) for the initial copy,
pgoutput for the change stream, both in a session with ``TimeZone=UTC`` and ``DateStyle=ISO``. The
casts below are native Spark SQL expressions, except the parsing of array literals, which Spark has
no expression for (a Python UDF; element values are then cast natively).

The mapping from ``ColumnType`` to Spark type is a contract: the DuckLake target reads the same
DataFrames, so change it only together with every target.

Values a Spark type cannot hold become NULL (Spark's non-ANSI cast): ``infinity`` dates and
timestamps, ``NaN``/``Infinity`` in a ``numeric(p,s)`` column. Everything else round-trips exactly.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
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

_SIMPLE: dict[TypeKind, DataType] = {
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
    if ct.kind in _SIMPLE:
        return _SIMPLE[ct.kind]
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


def cast_text(col: Column, ct: ColumnType) -> Column:
    """``col`` (PostgreSQL text output, NULL for SQL NULL) cast to ``spark_type(ct)``."""
    kind = ct.kind
    target = spark_type(ct)
    if kind is TypeKind.BOOLEAN:
        # Only the server's own spellings; anything else would be a decoding bug, not a value.
        return F.when(col == "t", F.lit(True)).when(col == "f", F.lit(False))
    if kind is TypeKind.BINARY:
        # bytea_output=hex: "\x" then two hex digits per byte ("\x" alone is the empty value).
        return F.unhex(F.substring(col, 3, 1 << 30))
    if kind is TypeKind.LIST:
        assert ct.element is not None
        element = ct.element
        return F.transform(parse_array_udf(col), lambda item: cast_text(item, element))
    if isinstance(target, StringType):
        return col
    if kind in (TypeKind.DATE, TypeKind.TIMESTAMP, TypeKind.TIMESTAMPTZ):
        return _with_era(col, target)
    # Spark's string casts accept exactly what PostgreSQL prints for these types: integers,
    # shortest round-trip floats (and NaN, Infinity, -Infinity), fixed-scale decimals, ISO dates,
    # timestamps with up to six fractional digits, and UTC offsets like "+00" or "+05:30".
    return col.cast(target)


def text_value_frame(spark: SparkSession, text: str | None, ct: ColumnType) -> DataFrame:
    """A one-row DataFrame whose column ``v`` is PostgreSQL text ``text`` cast like any value of ``ct``.

    Used to fill a newly added column with the value PostgreSQL gives the rows older than it.
    """
    value = cast_text(F.lit(text).cast("string"), ct) if text is not None else F.lit(None).cast(spark_type(ct))
    return spark.range(1).select(value.alias("v"))


def _with_era(col: Column, target: DataType) -> Column:
    """Dates and timestamps, including PostgreSQL's ``... BC`` years.

    Spark's cast would read "0044-03-15 BC" as 44 AD, so the suffix is stripped and the year
    moved from Y AD to 1 - Y (astronomical numbering, which Spark's proleptic calendar uses).
    """
    bc = col.endswith(" BC")
    stripped = F.when(bc, F.regexp_replace(col, " BC$", "")).otherwise(col)
    value = stripped.cast(target)
    year = F.split(stripped, "-").getItem(0).cast("int")
    return F.when(bc, value + F.make_ym_interval(F.lit(1) - 2 * year, F.lit(0))).otherwise(value)


def parse_array_literal(text: str | None) -> list[str | None] | None:
    """Split PostgreSQL's one-dimensional array output into element texts.

    ``{1,2,NULL,"a b","x\\"y"}`` gives ``["1", "2", None, "a b", 'x"y']``: an unquoted NULL is SQL
    NULL, a quoted "NULL" is the string. A ``[lo:hi]=`` bounds prefix is ignored.
    """
    if text is None:
        return None
    if text.startswith("["):
        # Non-default lower bounds print as "[0:2]={...}"; a list keeps only the order.
        text = text[text.index("=") + 1 :]
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


def parse_array_udf(col: Column) -> Column:
    """``col`` parsed by ``parse_array_literal`` as an ``array<string>`` column."""
    return _parse_array(col)


# Defined at import time so every use shares one UDF (and Spark ships it once per plan).
_parse_array = F.udf(parse_array_literal, ArrayType(StringType(), containsNull=True))
