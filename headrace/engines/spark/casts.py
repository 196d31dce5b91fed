"""From a source's text output to the row shape's Spark values (``core.spark_types.spark_type``), one
cast per logical type: Spark's side of the casts, the reference ``engines.driver.casts`` agrees with.

Values reach Spark as the text the source prints for them: COPY (text or CSV) for the initial copy,
pgoutput for the change stream, both in a session with ``TimeZone=UTC`` and ``DateStyle=ISO``. The
casts below are native Spark SQL expressions, except the parsing of array literals, which Spark has
no expression for (a Python UDF; element values are then cast natively).

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

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    DataType,
    StringType,
)

from headrace.core.errors import TERMINAL_MARKER
from headrace.core.names import ColumnName, TableName, TableNameError, columns_as_text_item, display_ident
from headrace.core.schema import ColumnType, TypeKind
from headrace.core.spark_types import (
    CLAMP_BOUNDS,
    DATETIME_KINDS,
    INT32_MAX,
    INT64_MAX,
    SPARK_TYPES,
    ValueRules,
    parse_array_or_none,
    spark_type,
)


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
        target = SPARK_TYPES[kind]
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


_parse_array = F.udf(parse_array_or_none, ArrayType(StringType(), containsNull=True))


def parse_array_udf(col: Column) -> Column:
    """``col`` parsed by ``parse_array_literal`` as an ``array<string>`` column.

    An array a list cannot hold comes out NULL, which the check in ``cast_text`` turns into an
    error naming the table, the column and the value.
    """
    return _parse_array(col)
