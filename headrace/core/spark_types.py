"""From PostgreSQL's text output to Spark values, one cast per logical type (shared by the
materializer, which casts staged changes and copies, and the targets, which map types and fill
added columns).

Values reach Spark as the text PostgreSQL prints for them: COPY (text or CSV) for the initial copy,
pgoutput for the change stream, both in a session with ``TimeZone=UTC`` and ``DateStyle=ISO``. The
casts below are native Spark SQL expressions, except the parsing of array literals, which Spark has
no expression for (a Python UDF; element values are then cast natively).

The mapping from ``ColumnType`` to Spark type is a contract: the DuckLake target reads the same
DataFrames, so change it only together with every target.

Never a silent NULL: Spark's (non-ANSI) cast gives NULL for text it cannot hold, so every cast is
checked, and a non-NULL text that became NULL stops the table with a message naming the table,
the column, the value and the fix (``TERMINAL_MARKER``, raised inside the Spark task).
``infinity``/``-infinity`` dates and timestamps, and timestamps past Spark's range (after
294247 AD), follow ``ValueRules``: a target that stores infinity keeps it (DuckDB's infinity is
the largest int32 day / int64 microsecond, which Spark carries through Parquet and Arrow
unchanged); otherwise the configured policy, ``clamp`` (to ``CLAMP_BOUNDS``) or ``stop``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

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

from headrace.core.errors import TERMINAL_MARKER, UnsupportedError
from headrace.core.names import ColumnName, TableName, TableNameError, columns_as_text_item, display_ident
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


def cast_text(col: Column, ct: ColumnType, rules: ValueRules | None = None, column: str = "?") -> Column:
    """``col`` (PostgreSQL text output, NULL for SQL NULL) cast to ``spark_type(ct)``.

    A non-NULL text the cast cannot represent raises inside the Spark task (``TERMINAL_MARKER``),
    naming ``rules.table``, ``column``, the value and the fix; nothing becomes NULL silently.
    """
    rules = rules or ValueRules()
    return _checked(col, _cast(col, ct, rules, column), ct, rules, column)


def _checked(text: Column, value: Column, ct: ColumnType, rules: ValueRules, column: str) -> Column:
    """``value``, or a task failure where ``text`` was a value and ``value`` came out NULL."""
    if isinstance(spark_type(ct), StringType):
        return value
    message = F.concat(
        F.lit(f"{TERMINAL_MARKER}{rules.table} column {column}: value '"),
        F.substring(text, 1, 100),
        F.lit(f"' cannot be stored as {spark_type(ct).simpleString()} ({ct.pg_type}); {_fix(ct, rules, column)}"),
    )
    return F.when(text.isNotNull() & value.isNull(), F.raise_error(message)).otherwise(value)


def _fix(ct: ColumnType, rules: ValueRules, column: str = "?") -> str:
    """The remedy the error message names, by kind.

    Where the target type cannot hold the value, the first remedy keeps the column as PostgreSQL's
    text in the target (``source.columns_as_text``), which leaves the user's database as it is.
    """
    as_text = (f"keep the column as text in the target: add `{_as_text_line(rules.table, column)}` under"
               f" `source.columns_as_text:` in the pipeline config, restart, and run `headrace resync {rules.table}`")
    if ct.kind is TypeKind.LIST:
        return (f"arrays map to lists, which hold one dimension with lower bound 1: {as_text}; or store it"
                f" one-dimensional in the source and run `headrace resync {rules.table}`")
    if ct.kind is TypeKind.DECIMAL:
        return (f"a numeric(p,s) target holds no NaN or Infinity: {as_text}; or change the source column to"
                f" unconstrained numeric (kept as exact text) or replace the value, then run"
                f" `headrace resync {rules.table}`")
    if ct.kind in DATETIME_KINDS:
        return ("set `values: {infinity: clamp}` in the pipeline config to store the nearest bound "
                f"({' / '.join(CLAMP_BOUNDS[ct.kind])}) instead, then retry the table")
    return f"this is a headrace bug: please report it with the value; `headrace resync {rules.table}` after a fix"


def _as_text_line(table: str, column: str) -> str:
    """The ``source.columns_as_text`` YAML item for ``column`` (an array's elements' name ends in ``[]``)."""
    name = column.removesuffix("[]")
    try:
        return columns_as_text_item(ColumnName(TableName.parse(table), name))
    except TableNameError:  # not a table's display name (a test's rules): still say what to list
        return f"- {table}.{display_ident(name)}"


def _cast(col: Column, ct: ColumnType, rules: ValueRules, column: str) -> Column:
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
        return F.transform(parse_array_udf(col), lambda item: cast_text(item, element, rules, column + "[]"))
    if isinstance(target, StringType):
        return col
    if kind in DATETIME_KINDS:
        return _beyond_range(col, _with_era(col, target), ct, rules)
    # Spark's string casts accept exactly what PostgreSQL prints for these types: integers,
    # shortest round-trip floats (and NaN, Infinity, -Infinity), fixed-scale decimals, ISO dates,
    # timestamps with up to six fractional digits, and UTC offsets like "+00" or "+05:30".
    return col.cast(target)


def text_value_frame(spark: SparkSession, text: str | None, ct: ColumnType, keep_infinity: bool = False
                     ) -> DataFrame:
    """A one-row DataFrame whose column ``v`` is PostgreSQL text ``text`` cast like any value of ``ct``.

    Used to fill a newly added column with the value PostgreSQL gives the rows older than it. An
    infinite default is kept where the target stores infinity (``keep_infinity``), else clamped.
    """
    if text is None:
        return spark.range(1).select(F.lit(None).cast(spark_type(ct)).alias("v"))
    rules = ValueRules("(added column)", "clamp", keep_infinity)
    value = cast_text(F.lit(text).cast("string"), ct, rules, "default value")
    return spark.range(1).select(value.alias("v"))


def _beyond_range(col: Column, value: Column, ct: ColumnType, rules: ValueRules) -> Column:
    """``value``, with infinities and values past Spark's range handled by ``rules.infinity``.

    Under ``stop`` they stay NULL, and the check in ``cast_text`` stops the table.
    """
    target = spark_type(ct)
    if rules.infinity == "clamp":
        low_text, high_text = CLAMP_BOUNDS[ct.kind]
        low, high = F.lit(low_text).cast(target), F.lit(high_text).cast(target)
        past = value.isNull() & col.isNotNull()
        below = col.startswith("-infinity") | col.endswith(" BC")
        value = F.when(past & below, low).when(past, high).otherwise(value)
    if not rules.keep_infinity:
        return value
    # DuckDB's infinities are the largest int32 day and int64 microsecond.
    if ct.kind is TypeKind.DATE:
        pos, neg = F.date_from_unix_date(F.lit(INT32_MAX)), F.date_from_unix_date(F.lit(-INT32_MAX))
    else:
        pos = F.timestamp_micros(F.lit(INT64_MAX)).cast(target)
        neg = F.timestamp_micros(F.lit(-INT64_MAX)).cast(target)
    return F.when(col == "infinity", pos).when(col == "-infinity", neg).otherwise(value)


def changed_value_counts(texts: list[tuple[str, ColumnType, Column]], rules: ValueRules
                         ) -> list[tuple[str, str, Column]]:
    """Aggregates counting the values ``cast_text`` changes under ``clamp``: ``(column, reason, sum)``.

    ``texts`` holds each column's name, type and text. Reasons: ``infinity_clamped`` (the target
    has no infinity) and ``out_of_range_clamped`` (a timestamp past 294247 AD). Elements of arrays
    count one by one. Nothing to count under ``stop`` (the table stops instead).
    """
    if rules.infinity != "clamp":
        return []
    out = []
    for name, ct, text in texts:
        element = ct.element if ct.kind is TypeKind.LIST else None
        kind = element.kind if element is not None else ct.kind
        if kind not in DATETIME_KINDS:
            continue
        target = _SIMPLE[kind]
        for reason in ("infinity_clamped", "out_of_range_clamped"):
            if reason == "infinity_clamped" and rules.keep_infinity:
                continue

            changed = _changed_test(target, infinite=reason == "infinity_clamped")
            if element is not None:
                n = F.size(F.filter(F.coalesce(parse_array_udf(text), F.array().cast("array<string>")), changed))
            else:
                n = changed(text).cast("int")
            out.append((name, reason, F.sum(n)))
    return out


def _changed_test(target: DataType, infinite: bool) -> Callable[[Column], Column]:
    """A one-argument test (``F.filter`` calls a two-argument one with the index) of clamped text."""
    def changed(text: Column) -> Column:
        is_infinite = text.isin("infinity", "-infinity")
        past = text.isNotNull() & _with_era(text, target).isNull()
        return past & (is_infinite if infinite else ~is_infinite)
    return changed


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


def parse_array_udf(col: Column) -> Column:
    """``col`` parsed by ``parse_array_literal`` as an ``array<string>`` column.

    An array a list cannot hold comes out NULL, which the check in ``cast_text`` turns into an
    error naming the table, the column and the value.
    """
    return _parse_array(col)


def _parse_or_none(text: str | None) -> list[str | None] | None:
    try:
        return parse_array_literal(text)
    except ValueError:
        return None


# Defined at import time so every use shares one UDF (and Spark ships it once per plan).
_parse_array = F.udf(_parse_or_none, ArrayType(StringType(), containsNull=True))
