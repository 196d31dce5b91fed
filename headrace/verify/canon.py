"""One text per value, the same in the source (PostgreSQL or MySQL/MariaDB) and in DuckDB (the
target): what both sides hash.

A value is compared as the target holds it. The target keeps the kinds Spark has no type for
(text, uuid, json, interval, time; MySQL's TIME, BIT(n), ENUM and SET) as the source's text, so
PostgreSQL prints those with ``format('%s', ...)`` (which keeps ``char(n)`` padding) in a session
with the settings pgoutput's walsender pins (``SOURCE_SETTINGS``), and MySQL with ``CAST(... AS
CHAR)`` in a session with ``MYSQL_SESSION``. The other kinds get a form every engine can spell:
- integers, decimals (fixed scale), booleans and dates: their text, which is the same in all;
- floats: widened to double (exactly, in every engine), then as PostgreSQL (12+) prints a double:
  the shortest round-trip digits every engine prints too, laid out otherwise by DuckDB
  (``1000000000000000.0``, ``nan``) and MariaDB (``1e15``), whose sides take their text apart into
  significant digits and power of ten and lay it out again as PostgreSQL does (``1e+15``, ``NaN``):
  the string work on the sides that do it fastest, none on PostgreSQL's, which a single query
  computes on one core;
- timestamps: microseconds since the epoch (timestamptz: of the instant; timestamp: of the wall clock);
  MySQL's zero dates as ``-infinity``, as the targets hold them;
- binary values: lower-case hex; arrays: JSON.

A row's text is one ``concat`` of its columns, separated by commas: a value of a kind whose text
has no comma and is never empty (numbers, booleans, dates, timestamps) as it is ('' for NULL), any
other length-prefixed (``<bytes>:<text>``; ``:`` for NULL), so no value can forge a boundary and
the text is read back one way only. A row's hash is the first 60 bits of that text's MD5, as a
bigint on every side: the one MD5 a row costs. A row's identity hash (which range it falls in) is
the MD5 of its key's text, except for a key of one integer column, whose value is mixed by integer
arithmetic every engine computes alike (``key_hash``), and for a keyless table, whose identity is
the whole row (its row hash). A range's checksum is the count and the sum of its rows' hashes (a
multiset's, so duplicates count).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from headrace.core.names import quote_ident
from headrace.core.schema import Column, TableSchema, TypeKind

Dialect = Literal["postgres", "duckdb", "mysql"]

HASH_BITS = 60
# The session settings pgoutput's text is printed with (headrace.source.postgres.replication).
SOURCE_SETTINGS = {"TimeZone": "UTC", "DateStyle": "ISO, MDY", "IntervalStyle": "postgres",
                   "extra_float_digits": "1", "bytea_output": "hex"}
# A MySQL session reading for verify: UTC, UTF-8 texts, and the SQL spelling the other engines share
# (double-quoted names, ``||`` joining strings).
MYSQL_SESSION = ("SET time_zone = '+00:00', NAMES utf8mb4,"
                 " SESSION sql_mode = 'ANSI_QUOTES,PIPES_AS_CONCAT,NO_ENGINE_SUBSTITUTION'")
# Kinds the targets keep as PostgreSQL's text (DuckLake stores uuid, json and time typed; read as text).
_TEXT_KINDS = frozenset({TypeKind.STRING, TypeKind.UUID, TypeKind.JSON, TypeKind.INTERVAL, TypeKind.TIME})
_TIMESTAMPS = frozenset({TypeKind.TIMESTAMP, TypeKind.TIMESTAMPTZ})
_FLOATS = frozenset({TypeKind.FLOAT, TypeKind.DOUBLE})


def _text(expr: str, dialect: Dialect) -> str:
    return f"CAST({expr} AS {_TEXT_TYPE[dialect]})"


_TEXT_TYPE = {"postgres": "text", "duckdb": "VARCHAR", "mysql": "CHAR"}
_DOUBLE_TYPE = {"postgres": "double precision", "duckdb": "DOUBLE", "mysql": "DOUBLE"}
_INT_TYPE = {"postgres": "integer", "duckdb": "INTEGER", "mysql": "SIGNED"}


def _part(text: str, sep: str, first: bool, dialect: Dialect) -> str:
    """SQL: ``text`` before the first ``sep`` (``first``), else after it ('' without one)."""
    if dialect != "mysql":
        return f"split_part({text}, '{sep}', {1 if first else 2})"
    if first:
        return f"SUBSTRING_INDEX({text}, '{sep}', 1)"
    return f"CASE WHEN LOCATE('{sep}', {text}) > 0 THEN SUBSTRING_INDEX({text}, '{sep}', -1) ELSE '' END"


def _trim(text: str, char: str, leading: bool, dialect: Dialect) -> str:
    if dialect == "mysql":
        return f"TRIM({'LEADING' if leading else 'TRAILING'} '{char}' FROM {text})"
    return f"{'ltrim' if leading else 'rtrim'}({text}, '{char}')"


def float_parts(text: str, dialect: Dialect) -> tuple[str, str]:
    """SQL: the significant digits (no leading or trailing zeros; '' for zero) and the power of ten P
    of an engine's text of a double (``text``): the value is ±SIG × 10^P."""
    mant = _part(text, "e", True, dialect)
    exp = f"CAST(coalesce(nullif({_part(text, 'e', False, dialect)}, ''), '0') AS {_INT_TYPE[dialect]})"
    absolute = _trim(mant, "-", True, dialect)
    whole = _part(absolute, ".", True, dialect)
    all_digits = f"({whole} || {_part(absolute, '.', False, dialect)})"
    lead = _trim(all_digits, "0", True, dialect)
    sig = _trim(lead, "0", False, dialect)
    return sig, f"(length({whole}) + {exp} - (length({all_digits}) - length({lead})) - length({sig}))"


def float_text(text: str, sig: str, power: str, dialect: Dialect) -> str:
    """SQL: a double's text laid out as PostgreSQL (12+) prints it, from the engine's ``text`` and its
    ``float_parts`` (``sig``, ``power``): the same shortest digits, fixed notation for decimal
    exponents from -4 to 14, else ``d.ddde+XX``; ``NaN``, ``Infinity``, ``-Infinity``."""
    e = f"(length({sig}) - 1 + {power})"  # the first digit's decimal exponent
    fixed = (f"CASE WHEN {power} >= 0 THEN {sig} || repeat('0', {power})"
             f" WHEN {e} >= 0 THEN left({sig}, {e} + 1) || '.' || substr({sig}, {e} + 2)"
             f" ELSE '0.' || repeat('0', -{e} - 1) || {sig} END")
    scientific = (f"left({sig}, 1) || CASE WHEN length({sig}) > 1 THEN '.' || substr({sig}, 2) ELSE '' END"
                  f" || 'e' || CASE WHEN {e} < 0 THEN '-' ELSE '+' END || CASE WHEN abs({e}) < 10 THEN '0' ELSE '' END"
                  f" || {_text(f'abs({e})', dialect)}")
    sign = f"CASE WHEN left({text}, 1) = '-' THEN '-' ELSE '' END"
    return (f"CASE WHEN {text} IS NULL THEN NULL WHEN lower({text}) IN ('nan', '-nan') THEN 'NaN'"
            f" WHEN lower({text}) IN ('inf', 'infinity') THEN 'Infinity'"
            f" WHEN lower({text}) IN ('-inf', '-infinity') THEN '-Infinity'"
            f" ELSE {sign} || CASE WHEN {sig} = '' THEN '0' WHEN {e} >= -4 AND {e} < 15 THEN {fixed}"
            f" ELSE {scientific} END END")


def _mysql_raw(col: Column, q: str) -> str:
    """``raw_text`` of a MySQL/MariaDB column, as ``source.mysql.types.to_text`` gave it to the target."""
    from headrace.source.mysql.types import base_type, type_args  # the binlog reader's, loaded for MySQL only

    base = base_type(col.type)
    if base in ("date", "datetime", "timestamp"):
        zero = f"YEAR({q}) = 0 OR MONTH({q}) = 0 OR DAYOFMONTH({q}) = 0"  # a zero date: -infinity
        value = _text(q, "mysql") if base == "date" else \
            _text(f"TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', {q})", "mysql")
        return f"CASE WHEN {q} IS NULL THEN NULL WHEN {zero} THEN '-infinity' ELSE {value} END"
    if base == "bit":
        if col.type.kind is TypeKind.BOOLEAN:
            return f"CASE WHEN {q} IS NULL THEN NULL WHEN {q} + 0 <> 0 THEN 'true' ELSE 'false' END"
        return f"LPAD(BIN({q} + 0), {type_args(col.type)[0]}, '0')"
    if base == "year":
        return _text(f"{q} + 0", "mysql")  # the zero year as 0
    if col.type.kind is TypeKind.BINARY:
        return f"LOWER(HEX(SUBSTR({q}, 5)))" if base == "geometry" else f"LOWER(HEX({q}))"  # geometry: after its SRID
    if col.type.kind in _FLOATS:
        return _text(f"CAST({q} AS DOUBLE)", "mysql")
    return _text(q, "mysql")


def raw_text(col: Column, dialect: Dialect, expr: str | None = None) -> str:
    """SQL, the first step of ``value_text``: one conversion of each value to text. Final for every
    kind but floats, whose engine text ``middle_parts`` and ``final_text`` then take apart (the steps
    are separate so each value is converted once: string work on a text is cheap, a float's
    conversion is not)."""
    q = expr or quote_ident(col.name)
    kind = col.type.kind
    if dialect == "mysql":
        return _mysql_raw(col, q)
    pg = dialect == "postgres"
    if kind in _TEXT_KINDS:
        if pg and (col.type.pg_type == "text" or col.type.pg_type.startswith("character varying")):
            return q  # its own text (a call per value costs PostgreSQL's one-core sum)
        # format() calls the output function (char(n) keeps its padding) but makes NULL ''.
        return f"CASE WHEN {q} IS NOT NULL THEN format('%s', {q}) END" if pg else _text(q, dialect)
    if kind in _TIMESTAMPS:
        micros = f"CAST(extract(epoch FROM {q}) * 1000000 AS bigint)" if pg else f"epoch_us({q})"
        return f"CASE WHEN isfinite({q}) THEN {_text(micros, dialect)} ELSE {_text(q, dialect)} END"
    if kind is TypeKind.BINARY:
        return f"encode({q}, 'hex')" if pg else f"lower(hex({q}))"
    if kind is TypeKind.LIST:
        return f"CAST(array_to_json({q}) AS text)" if pg else f"CAST(to_json({q}) AS VARCHAR)"
    if kind in _FLOATS:
        return _text(f"CAST({q} AS {_DOUBLE_TYPE[dialect]})", dialect)
    return _text(q, dialect)  # int, long, decimal, boolean, date


def plain_double(col: Column, dialect: Dialect, expr: str | None = None) -> str | None:
    """SQL (DuckDB's floats only, else None): the value is one whose DuckDB text is PostgreSQL's but
    for a trailing ``.0`` (finite, zero or of magnitude from 1e-4 to below 1e15, where both print
    the shortest digits in fixed notation): a test on the number, computed beside its text in the
    first step (a test on the text cost DuckDB more than the layout it spares)."""
    if col.type.kind not in _FLOATS or dialect != "duckdb":
        return None
    x = f"CAST({expr or quote_ident(col.name)} AS DOUBLE)"
    return f"(isfinite({x}) AND (abs({x}) >= 0.0001 OR {x} = 0) AND abs({x}) < 1e15)"


def middle_parts(col: Column, dialect: Dialect, raw: str, plain: str | None = None) -> list[tuple[str, str]]:
    """SQL, the second step of ``value_text``, over ``raw`` (the first step's result) and, for
    DuckDB's floats, ``plain`` (the first step's ``plain_double``): (name, SQL) of the values the
    last step reads: a float's text and its ``float_parts`` (computed once a row, in a query level
    of their own: no engine here computes a sub-expression used twice only once); every other value
    as it is."""
    if col.type.kind not in _FLOATS or dialect == "postgres":
        return [("m", raw)]
    sig, power = float_parts(raw, dialect)
    if dialect != "duckdb":
        return [("m", raw), ("g", sig), ("p", power)]
    # DuckDB prints most doubles as PostgreSQL does but for a trailing ".0": those skip the layout
    # (its CASE computes a branch only for the rows that take it)
    assert plain is not None
    return [("m", raw), ("f", plain), ("g", f"CASE WHEN {plain} THEN NULL ELSE {sig} END"),
            ("p", f"CASE WHEN {plain} THEN NULL ELSE {power} END")]


def passes_on(parts: Sequence[tuple[str, str]] | dict[str, str]) -> bool:
    """The ``middle_parts`` of a value whose raw text is already the compared one."""
    return len(parts) == 1


def final_text(col: Column, dialect: Dialect, parts: dict[str, str]) -> str:
    """SQL, the last step of ``value_text``, over the ``middle_parts`` (by name): a float's compared
    form (``float_text``); a value with no parts to lay out (``passes_on``) as it is."""
    if passes_on(parts):
        return parts["m"]
    laid_out = float_text(parts["m"], parts["g"], parts["p"], dialect)
    if "f" not in parts:
        return laid_out
    text = parts["m"]
    return (f"CASE WHEN {parts['f']} THEN CASE WHEN suffix({text}, '.0') THEN left({text}, length({text}) - 2)"
            f" ELSE {text} END ELSE {laid_out} END")


def value_text(col: Column, dialect: Dialect, expr: str | None = None) -> str:
    """SQL giving column ``col``'s value (``expr``, default its quoted name) as the compared text;
    NULL stays NULL (inline: tests; queries over many rows take the steps one query level each,
    ``verify.sides``)."""
    plain = plain_double(col, dialect, expr)
    return final_text(col, dialect, dict(middle_parts(col, dialect, raw_text(col, dialect, expr), plain)))


# Kinds whose compared text never holds a comma and is never empty: joined without a length prefix.
_BARE_KINDS = frozenset({TypeKind.INT, TypeKind.LONG, TypeKind.DECIMAL, TypeKind.BOOLEAN, TypeKind.DATE,
                         *_TIMESTAMPS, *_FLOATS})


def joined(columns: Sequence[Column], texts: Sequence[str], dialect: Dialect) -> str:
    """SQL joining the compared ``texts`` of ``columns`` into one text, each value after a comma:
    a ``_BARE_KINDS`` value as it is ('' when NULL), any other as ``<bytes>:<text>`` (``:`` when
    NULL). One ``concat`` call (PostgreSQL and DuckDB skip its NULL arguments), not a chain of
    ``||``: each of those copies the text so far."""
    if dialect == "mysql":  # MySQL's CONCAT is NULL when any argument is
        parts = [f"COALESCE({t}, '')" if c.type.kind in _BARE_KINDS else f"COALESCE(CONCAT(LENGTH({t}), ':', {t}), ':')"
                 for c, t in zip(columns, texts, strict=True)]
    else:
        size = "strlen" if dialect == "duckdb" else "octet_length"
        parts = [t if c.type.kind in _BARE_KINDS else f"{size}({t}), ':', {t}"
                 for c, t in zip(columns, texts, strict=True)]
    if not parts:
        return "''"
    separated = ", ',', ".join(parts)
    return f"{'CONCAT' if dialect == 'mysql' else 'concat'}({separated})"


# A key of one integer column is mixed by arithmetic every engine computes alike (no MD5, no text):
# the key's 30-bit halves (truncating division and remainder, the same in all three engines, and
# never overflowing a bigint) mixed twice modulo the prime 2^31 - 1, the first mix giving the top
# bits (the ranges: consecutive keys spread evenly over them), the second the low 29.
_MIX = 2147483647
_HALF = 1073741824
_LOW_BITS = 536870912  # 2^29


def has_integer_key(table: TableSchema) -> bool:
    """Whether ``table``'s identity hash is ``key_hash`` of its one integer key column."""
    return len(table.key) == 1 and table.column(table.key[0]).type.kind in (TypeKind.INT, TypeKind.LONG)


def key_hash(expr: str, dialect: Dialect) -> str:
    """SQL: a 60-bit non-negative bigint mixing the integer ``expr`` (a key column's value)."""
    big = f"CAST({expr} AS {'SIGNED' if dialect == 'mysql' else 'BIGINT'})"
    div = {"postgres": "/", "duckdb": "//", "mysql": "DIV"}[dialect]
    high, low = f"({big} {div} {_HALF})", f"({big} % {_HALF})"

    def mix(a: int, b: int) -> str:
        return f"((({high} * {a} + {low} * {b}) % {_MIX} + {_MIX}) % {_MIX})"

    return f"({mix(16807, 48271)} * {_LOW_BITS} + {mix(69621, 39373)} % {_LOW_BITS})"


def hash60(text: str, dialect: Dialect) -> str:
    """SQL: the first 60 bits of ``text``'s MD5 as a non-negative bigint."""
    if dialect == "postgres":
        return f"CAST(CAST('x' || substr(md5({text}), 1, 15) AS bit(60)) AS bigint)"
    if dialect == "mysql":
        return f"CAST(CONV(SUBSTR(MD5({text}), 1, 15), 16, 10) AS SIGNED)"
    return f"CAST('0x' || substr(md5({text}), 1, 15) AS BIGINT)"


def identity_columns(table: TableSchema) -> list[Column]:
    """The columns that identify a row: the key, or every column of a keyless table (a multiset)."""
    return [table.column(k) for k in table.key] if table.key else list(table.columns)
