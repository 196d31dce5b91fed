"""PostgreSQL's text output (and a MySQL source's staged text, spelled alike) cast to the row shape's
values by DuckDB: for batches applied on the driver, and for copy chunks written as files
(``cast_texts``, from ``engines.chunks.chunk_rows``).

The Spark path (``headrace.core.spark_types.cast_text``) is the reference: a value cast here must
come out exactly as Spark casts it. So each type accepts only the text forms where DuckDB's cast
and Spark's are known to agree (``FAST_FORMS``, the forms PostgreSQL prints for ordinary values)
and raises for anything else (BC dates, years past 9999, infinity where the target has none, NaN
in a decimal, bytea in escape format, ...). The raise is not an error the user sees: the batch
goes to the Spark path instead (``headrace.engines.driver.batch``), which casts every value
or stops the table with its usual message. A fallback costs time, never a different value.

Arrays are split by the same parser Spark's path uses (``parse_array_literal``, registered as a
DuckDB function), then each element is cast as above.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import duckdb
import pyarrow as pa
from duckdb.func import FunctionNullHandling

from headrace.core.lanes import NotOnLane
from headrace.core.schema import ColumnType, TypeKind
from headrace.core.spark_types import DATETIME_KINDS, ValueRules, parse_array_or_none

FALLBACK_MARKER = "headrace-driver-fallback"  # in the message of every raise below
PARSE_ARRAY = "hr_parse_array"

K = TypeKind
_INT = r"-?[0-9]{1,10}"
_LONG = r"-?[0-9]{1,19}"
# Shortest round-trip output (and the special values), which Java's parser and DuckDB's both read
# correctly rounded.
_FLOATING = r"-?(([0-9]+(\.[0-9]+)?(e[+-]?[0-9]+)?)|Infinity)|NaN"
_DATE = r"[0-9]{4}-[0-9]{2}-[0-9]{2}"  # years 0001-9999 AD: no era suffix, no extended years
_TIME = r"[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?"
_OFFSET = r"[+-][0-9]{2}(:[0-9]{2})?"

# The text each kind takes here (a full match); everything else falls back to Spark.
FAST_FORMS: dict[TypeKind, str] = {
    K.INT: _INT,
    K.LONG: _LONG,
    K.FLOAT: _FLOATING,
    K.DOUBLE: _FLOATING,
    K.DATE: _DATE,
    K.TIMESTAMP: f"{_DATE} {_TIME}",
    K.TIMESTAMPTZ: f"{_DATE} {_TIME}{_OFFSET}",
    K.BINARY: r"\\x([0-9a-fA-F]{2})*",  # bytea_output=hex
}
_DUCK: dict[TypeKind, str] = {
    K.INT: "INTEGER", K.LONG: "BIGINT", K.FLOAT: "REAL", K.DOUBLE: "DOUBLE", K.DATE: "DATE",
    K.TIMESTAMP: "TIMESTAMP", K.TIMESTAMPTZ: "TIMESTAMPTZ",
}
# Kinds Spark keeps as PostgreSQL's text: nothing to cast.
TEXT_KINDS = frozenset({K.STRING, K.UUID, K.JSON, K.INTERVAL, K.TIME})


def arrow_type(ct: ColumnType) -> pa.DataType:
    """The Arrow type Spark's ``toArrow`` gives a column of ``ct`` (``spark_types.spark_type``)."""
    simple: dict[TypeKind, pa.DataType] = {
        K.INT: pa.int32(), K.LONG: pa.int64(), K.FLOAT: pa.float32(), K.DOUBLE: pa.float64(),
        K.BOOLEAN: pa.bool_(), K.DATE: pa.date32(), K.TIMESTAMP: pa.timestamp("us"),
        K.TIMESTAMPTZ: pa.timestamp("us", tz="UTC"), K.BINARY: pa.binary(),
    }
    if ct.kind in simple:
        return simple[ct.kind]
    if ct.kind in TEXT_KINDS:
        return pa.string()
    if ct.kind is K.DECIMAL:
        assert ct.precision is not None and ct.scale is not None
        return pa.decimal128(ct.precision, ct.scale)
    assert ct.kind is K.LIST and ct.element is not None
    return pa.list_(pa.field("element", arrow_type(ct.element)))


def cast_sql(text: str, ct: ColumnType, rules: ValueRules, column: str) -> str:
    """SQL casting ``text`` (a VARCHAR expression, NULL for SQL NULL) to ``arrow_type(ct)``'s values,
    raising ``FALLBACK_MARKER`` for text outside the fast forms."""
    if ct.kind in TEXT_KINDS:
        return text
    if ct.kind is K.LIST:
        assert ct.element is not None
        parsed = f"{PARSE_ARRAY}({text})"
        element = cast_sql("hr_e", ct.element, rules, column + "[]")
        return (f"CASE WHEN {text} IS NULL THEN NULL WHEN {parsed} IS NULL THEN {_fallback(text, column, ct)} "
                f"ELSE list_transform({parsed}, hr_e -> {element}) END")
    if ct.kind is K.BOOLEAN:
        value = f"CASE {text} WHEN 't' THEN true WHEN 'f' THEN false ELSE {_fallback(text, column, ct)} END"
        return f"CASE WHEN {text} IS NULL THEN NULL ELSE {value} END"
    if ct.kind is K.DECIMAL:
        # At most the column's scale of fraction digits: Spark and DuckDB round differently, but
        # PostgreSQL prints numeric(p,s) with exactly s of them. Too many integer digits: DuckDB's
        # cast raises (Spark's stops the table).
        fraction = rf"(\.[0-9]{{1,{ct.scale}}})?" if ct.scale else ""
        form, cast = rf"-?[0-9]+{fraction}", f"CAST({text} AS DECIMAL({ct.precision},{ct.scale}))"
    elif ct.kind is K.BINARY:
        form, cast = FAST_FORMS[K.BINARY], f"unhex(substr({text}, 3))"
    else:
        form, cast = FAST_FORMS[ct.kind], f"CAST({text} AS {_DUCK[ct.kind]})"
    branches = f"WHEN regexp_full_match({text}, {literal(form)}) THEN {cast}"
    if ct.kind in DATETIME_KINDS and rules.keep_infinity:
        # The target keeps infinity: DuckDB's infinities are the values Spark's path stores.
        branches += (f" WHEN {text} = 'infinity' THEN CAST('infinity' AS {_DUCK[ct.kind]})"
                     f" WHEN {text} = '-infinity' THEN CAST('-infinity' AS {_DUCK[ct.kind]})")
    return f"CASE WHEN {text} IS NULL THEN NULL {branches} ELSE {_fallback(text, column, ct)} END"


def literal(text: str) -> str:
    """A DuckDB string literal."""
    return "'" + text.replace("'", "''") + "'"


def _fallback(text: str, column: str, ct: ColumnType) -> str:
    # The value in the message makes the expression non-constant (DuckDB would fold a constant
    # error() at bind time) and says which value sent the batch to Spark.
    return f"error({literal(f'{FALLBACK_MARKER}: column {column} ({ct.pg_type}) value ')} || left({text}, 80))"


def register_functions(con: duckdb.DuckDBPyConnection) -> None:
    """Make ``PARSE_ARRAY`` (PostgreSQL array text to VARCHAR[], NULL when no list holds it) known to ``con``."""
    # "special": the function may return NULL (DuckDB's default refuses a NULL result).
    con.create_function(PARSE_ARRAY, parse_array_or_none, ["VARCHAR"], "VARCHAR[]", null_handling=FunctionNullHandling.SPECIAL,
                        side_effects=False)


_local = threading.local()


def connection() -> duckdb.DuckDBPyConnection:
    """This thread's in-memory DuckDB for the casts (apply workers and copy threads cast at once)."""
    con: duckdb.DuckDBPyConnection | None = getattr(_local, "con", None)
    if con is None:
        # One thread each: apply workers build several tables' batches at once, copy threads cast
        # several chunks, and the cores are shared with capture and Spark.
        con = duckdb.connect(config={"threads": 1})
        con.execute("SET TimeZone = 'UTC'")
        register_functions(con)
        _local.con = con
    return con


def cast_texts(texts: Sequence[tuple[str, pa.ChunkedArray, ColumnType]]) -> list[pa.ChunkedArray]:
    """Each (column name, text, type) cast to ``arrow_type``'s values as Spark's ``cast_text`` casts
    it (under the default ``ValueRules``: no infinity kept); raises ``NotOnLane`` naming the first
    value outside the fast forms, which only Spark's casts decide."""
    if not texts:
        return []
    con = connection()
    data = pa.table({f"c{i}": text for i, (_, text, _) in enumerate(texts)})
    rules = ValueRules()
    select = ", ".join(f"{cast_sql(f'c{i}', ct, rules, name)} AS c{i}" for i, (name, _, ct) in enumerate(texts))
    con.register("hr_texts", data)
    try:
        result = con.execute(f"SELECT {select} FROM hr_texts").arrow()
        cast = result if isinstance(result, pa.Table) else result.read_all()
    except duckdb.Error as exc:
        message = str(exc)
        at = message.find(FALLBACK_MARKER)
        raise NotOnLane(" ".join(message[max(at, 0):].split())[:300]) from exc
    finally:
        con.unregister("hr_texts")
    return [cast.column(i).cast(arrow_type(ct)) for i, (_, _, ct) in enumerate(texts)]


def has_datetime(ct: ColumnType) -> bool:
    """The column holds dates or timestamps (or a list of them): values ``clamp`` may change."""
    kind = ct.element.kind if ct.kind is K.LIST and ct.element is not None else ct.kind
    return kind in DATETIME_KINDS
