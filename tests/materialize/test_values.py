"""Values a Spark type cannot hold: an error naming table, column, value and fix, or the configured policy.

Never a silent NULL: each case below either fails the Spark job with ``TERMINAL_MARKER`` in the
message, or gives the documented value (DuckDB's infinity, or the clamp bounds).
"""

from __future__ import annotations

import datetime as dt

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from headrace.core.errors import TERMINAL_MARKER
from headrace.core.schema import ColumnType, TypeKind
from headrace.core.spark_types import INT32_MAX, INT64_MAX, ValueRules
from headrace.engines.spark.casts import cast_text

K = TypeKind
DATE = ColumnType(K.DATE, "date")
TS = ColumnType(K.TIMESTAMP, "timestamp without time zone")
TSTZ = ColumnType(K.TIMESTAMPTZ, "timestamp with time zone")
INT_ARRAY = ColumnType(K.LIST, "integer[]", element=ColumnType(K.INT, "integer"))
NUMERIC = ColumnType(K.DECIMAL, "numeric(10,2)", precision=10, scale=2)
STOP = ValueRules("public.t", "stop")
CLAMP = ValueRules("public.t", "clamp")
KEEP = ValueRules("public.t", "stop", keep_infinity=True)


def _cast(spark: SparkSession, text: str, ct: ColumnType, rules: ValueRules, as_number: bool = False) -> object:
    value = cast_text(F.lit(text).cast("string"), ct, rules, "c")
    if as_number:  # days or microseconds since the epoch: Python's datetime cannot hold the extremes
        value = F.unix_date(value) if ct.kind is K.DATE else F.unix_micros(value.cast("timestamp"))
    return spark.range(1).select(value.alias("v")).collect()[0]["v"]


@pytest.mark.parametrize(("text", "ct", "names"), [
    ("{{1,2},{3,4}}", INT_ARRAY, "one-dimensional"),
    ("[0:2]={1,2,3}", INT_ARRAY, "one-dimensional"),
    ("NaN", NUMERIC, "NaN or Infinity"),
    ("infinity", DATE, "infinity: clamp"),
    ("-infinity", TSTZ, "infinity: clamp"),
    ("294276-12-31 23:59:59.999999", TS, "infinity: clamp"),
])
def test_a_value_the_type_cannot_hold_stops_with_table_column_value_and_fix(
    spark: SparkSession, text: str, ct: ColumnType, names: str
) -> None:
    with pytest.raises(Exception) as caught:
        _cast(spark, text, ct, STOP)
    message = str(caught.value)
    assert TERMINAL_MARKER in message
    assert f"public.t column c: value '{text}' cannot be stored" in message
    assert names in message
    if ct.kind in (K.LIST, K.DECIMAL):  # the first fix leaves the source as it is: keep the column as text
        assert "add `- public.t.c` under `source.columns_as_text:`" in message
        alternative = "one-dimensional in the source" if ct.kind is K.LIST else "unconstrained numeric"
        assert message.index("source.columns_as_text") < message.index(alternative)


def test_a_numeric_nan_inside_an_array_names_the_whole_column_to_list(spark: SparkSession) -> None:
    prices = ColumnType(K.LIST, "numeric(10,2)[]", element=NUMERIC)
    with pytest.raises(Exception, match=r"public.t column c\[\]: value 'NaN'.*add `- public.t.c` under"):
        _cast(spark, "{1.5,NaN}", prices, STOP)


def test_a_long_value_is_cut_to_100_characters_in_the_message(spark: SparkSession) -> None:
    text = "{{" + ",".join(["1"] * 200) + "}}"
    with pytest.raises(Exception) as caught:
        _cast(spark, text, INT_ARRAY, STOP)
    assert f"value '{text[:100]}' cannot" in str(caught.value)


def test_a_bad_element_inside_an_array_names_the_column(spark: SparkSession) -> None:
    dates = ColumnType(K.LIST, "date[]", element=DATE)
    with pytest.raises(Exception, match=r"public.t column c\[\]: value 'infinity'"):
        _cast(spark, "{2024-01-01,infinity}", dates, STOP)


def test_clamp_replaces_infinity_and_out_of_range_with_the_bounds(spark: SparkSession) -> None:
    assert _cast(spark, "infinity", DATE, CLAMP) == dt.date(9999, 12, 31)
    assert _cast(spark, "-infinity", DATE, CLAMP) == dt.date(1, 1, 1)
    assert _cast(spark, "infinity", TS, CLAMP) == dt.datetime(9999, 12, 31, 23, 59, 59, 999999)
    assert _cast(spark, "294276-12-31 23:59:59.999999", TS, CLAMP) == dt.datetime(9999, 12, 31, 23, 59, 59, 999999)
    assert _cast(spark, "4713-01-01 00:00:00+00 BC", TSTZ, CLAMP, as_number=True) == -210863520000000000  # kept
    assert _cast(spark, "-infinity", TSTZ, CLAMP, as_number=True) == -62135596800000000  # 0001-01-01 00:00 UTC


def test_keep_stores_duckdb_infinity(spark: SparkSession) -> None:
    assert _cast(spark, "infinity", DATE, KEEP, as_number=True) == INT32_MAX
    assert _cast(spark, "-infinity", DATE, KEEP, as_number=True) == -INT32_MAX
    assert _cast(spark, "infinity", TS, KEEP, as_number=True) == INT64_MAX
    assert _cast(spark, "-infinity", TSTZ, KEEP, as_number=True) == -INT64_MAX
    # A finite value past the range is no infinity: it follows the policy (here: stop).
    with pytest.raises(Exception, match="294276"):
        _cast(spark, "294276-12-31 23:59:59.999999", TS, KEEP)


def test_ordinary_values_pass_the_check(spark: SparkSession) -> None:
    assert _cast(spark, "{1,NULL,3}", INT_ARRAY, STOP) == [1, None, 3]
    assert _cast(spark, "{}", INT_ARRAY, STOP) == []
    assert _cast(spark, "0001-01-01", DATE, STOP) == dt.date(1, 1, 1)
    assert _cast(spark, "1582-10-04", DATE, STOP) == dt.date(1582, 10, 4)  # proleptic Gregorian
