"""One text per value, the same in PostgreSQL and in DuckDB: what both sides hash.

A value is compared as the target holds it. The target keeps the kinds Spark has no type for
(text, uuid, json, interval, time) as PostgreSQL's text output, so the source side prints those
with ``format('%s', ...)`` (which keeps ``char(n)`` padding) in a session with the settings
pgoutput's walsender pins (``SOURCE_SETTINGS``). The other kinds get a form both engines can spell:
- integers, decimals (fixed scale), booleans and dates: their text, which is the same in both;
- floats: sign, shortest round-trip digits and decimal exponent (``-12345e3``), taken apart from
  each engine's text, since both print the shortest digits but lay them out differently
  (``100`` / ``100.0``, ``1e+15`` / ``1000000000000000.0``); NaN and infinities spelled once;
- timestamps: microseconds since the epoch (timestamptz: of the instant; timestamp: of the wall clock);
- bytea: lower-case hex; arrays: JSON.

A row's text joins its columns length-prefixed (``N`` for NULL), so no value can forge a boundary.
Hashes are the first 60 bits of the text's MD5, as a bigint on both sides; a range's checksum is
the count and the sum of its rows' hashes (a multiset's, so duplicates count).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from headrace.core.names import quote_ident
from headrace.core.schema import Column, TableSchema, TypeKind

Dialect = Literal["postgres", "duckdb"]

HASH_BITS = 60
# The session settings pgoutput's text is printed with (headrace.source.postgres.replication).
SOURCE_SETTINGS = {"TimeZone": "UTC", "DateStyle": "ISO, MDY", "IntervalStyle": "postgres",
                   "extra_float_digits": "1", "bytea_output": "hex"}
# Kinds the targets keep as PostgreSQL's text (DuckLake stores uuid, json and time typed; read as text).
_TEXT_KINDS = frozenset({TypeKind.STRING, TypeKind.UUID, TypeKind.JSON, TypeKind.INTERVAL, TypeKind.TIME})
_TIMESTAMPS = frozenset({TypeKind.TIMESTAMP, TypeKind.TIMESTAMPTZ})
_FLOATS = frozenset({TypeKind.FLOAT, TypeKind.DOUBLE})


def _text(expr: str, dialect: Dialect) -> str:
    return f"CAST({expr} AS {'text' if dialect == 'postgres' else 'VARCHAR'})"


def _float_digits(text: str, dialect: Dialect) -> str:
    """A float's text (finite) as ``[-]DIGITSeEXP`` with the digits' point after the last digit."""
    mant = f"split_part({text}, 'e', 1)"
    exp = f"CAST(coalesce(nullif(split_part({text}, 'e', 2), ''), '0') AS integer)"
    absolute = f"ltrim({mant}, '-')"
    whole = f"split_part({absolute}, '.', 1)"
    digits = f"({whole} || split_part({absolute}, '.', 2))"
    lead = f"ltrim({digits}, '0')"
    sig = f"rtrim({lead}, '0')"
    # value = 0.DIGITS × 10^(len(whole) + exp) = SIG × 10^(len(whole) + exp - zeros - len(sig))
    power = f"(length({whole}) + {exp} - (length({digits}) - length({lead})) - length({sig}))"
    sign = f"CASE WHEN left({text}, 1) = '-' THEN '-' ELSE '' END"
    return (f"CASE WHEN {sig} = '' THEN {sign} || '0' ELSE {sign} || {sig} || 'e' || "
            f"{_text(power, dialect)} END")


def value_text(col: Column, dialect: Dialect, expr: str | None = None) -> str:
    """SQL giving column ``col``'s value (``expr``, default its quoted name) as the compared text;
    NULL stays NULL."""
    q = expr or quote_ident(col.name)
    kind = col.type.kind
    pg = dialect == "postgres"
    if kind in _TEXT_KINDS:
        # format() calls the output function (char(n) keeps its padding) but makes NULL ''.
        return f"CASE WHEN {q} IS NOT NULL THEN format('%s', {q}) END" if pg else _text(q, dialect)
    if kind in _FLOATS:
        if pg:
            special = (f"WHEN {q} = 'NaN' THEN 'NaN' WHEN {q} = 'Infinity' THEN 'Infinity'"
                       f" WHEN {q} = '-Infinity' THEN '-Infinity'")
        else:
            special = (f"WHEN isnan({q}) THEN 'NaN' WHEN isinf({q}) AND {q} > 0 THEN 'Infinity'"
                       f" WHEN isinf({q}) THEN '-Infinity'")
        return f"CASE WHEN {q} IS NULL THEN NULL {special} ELSE {_float_digits(_text(q, dialect), dialect)} END"
    if kind in _TIMESTAMPS:
        micros = f"CAST(extract(epoch FROM {q}) * 1000000 AS bigint)" if pg else f"epoch_us({q})"
        return f"CASE WHEN isfinite({q}) THEN {_text(micros, dialect)} ELSE {_text(q, dialect)} END"
    if kind is TypeKind.BINARY:
        return f"encode({q}, 'hex')" if pg else f"lower(hex({q}))"
    if kind is TypeKind.LIST:
        return f"CAST(array_to_json({q}) AS text)" if pg else f"CAST(to_json({q}) AS VARCHAR)"
    return _text(q, dialect)  # int, long, decimal, boolean, date


def joined(texts: Sequence[str], dialect: Dialect) -> str:
    """SQL joining column texts into one: each ``N`` when NULL, else ``V<bytes>:<text>``."""
    size = "octet_length" if dialect == "postgres" else "strlen"
    parts = [f"CASE WHEN {t} IS NULL THEN 'N' ELSE 'V' || {_text(f'{size}({t})', dialect)} || ':' || {t} END"
             for t in texts]
    return " || ".join(parts) if parts else "''"


def hash60(text: str, dialect: Dialect) -> str:
    """SQL: the first 60 bits of ``text``'s MD5 as a non-negative bigint."""
    if dialect == "postgres":
        return f"CAST(CAST('x' || substr(md5({text}), 1, 15) AS bit(60)) AS bigint)"
    return f"CAST('0x' || substr(md5({text}), 1, 15) AS BIGINT)"


def identity_columns(table: TableSchema) -> list[Column]:
    """The columns that identify a row: the key, or every column of a keyless table (a multiset)."""
    return [table.column(k) for k in table.key] if table.key else list(table.columns)


def key_hash(table: TableSchema, dialect: Dialect) -> str:
    """SQL: the hash that places a row in a range (its key's; a keyless row's whole text)."""
    return hash60(joined([value_text(c, dialect) for c in identity_columns(table)], dialect), dialect)


def row_hash(table: TableSchema, dialect: Dialect) -> str:
    """SQL: the hash of a row's compared columns (all of the table's source columns)."""
    return hash60(joined([value_text(c, dialect) for c in table.columns], dialect), dialect)
