"""One text per value, the same in PostgreSQL and in DuckDB: what both sides hash.

A value is compared as the target holds it. The target keeps the kinds Spark has no type for
(text, uuid, json, interval, time) as PostgreSQL's text output, so the source side prints those
with ``format('%s', ...)`` (which keeps ``char(n)`` padding) in a session with the settings
pgoutput's walsender pins (``SOURCE_SETTINGS``). The other kinds get a form both engines can spell:
- integers, decimals (fixed scale), booleans and dates: their text, which is the same in both;
- floats: PostgreSQL's text (12+: the shortest round-trip digits); DuckDB prints the same digits
  laid out otherwise (``100.0``, ``1000000000000000.0``, ``nan``), which its side lays out again as
  PostgreSQL does (``100``, ``1e+15``, ``NaN``): string work in the engine that does it fastest;
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


def _float_parts(text: str) -> str:
    """DuckDB SQL: a finite float's DuckDB text taken apart, as a struct: ``t`` the text, ``sig`` its
    significant digits and ``power`` (the value is ±SIG × 10^power)."""
    mant = f"split_part({text}, 'e', 1)"
    exp = f"CAST(coalesce(nullif(split_part({text}, 'e', 2), ''), '0') AS INTEGER)"
    absolute = f"ltrim({mant}, '-')"
    whole = f"split_part({absolute}, '.', 1)"
    all_digits = f"({whole} || split_part({absolute}, '.', 2))"
    lead = f"ltrim({all_digits}, '0')"
    sig = f"rtrim({lead}, '0')"
    power = f"(length({whole}) + {exp} - (length({all_digits}) - length({lead})) - length({sig}))"
    return f"struct_pack(t := {text}, sig := {sig}, power := {power})"


def _postgres_float(parts: str, digits: int) -> str:
    """DuckDB SQL laying out ``_float_parts`` as PostgreSQL (12+) prints a float: the same shortest
    digits, fixed notation for decimal exponents from -4 to below ``digits`` (15 for double, 6 for
    real), else ``d.ddde+XX``."""
    text, sig, power = f"{parts}.t", f"{parts}.sig", f"{parts}.power"
    e = f"(length({sig}) - 1 + {power})"  # the first digit's decimal exponent
    fixed = (f"CASE WHEN {power} >= 0 THEN {sig} || repeat('0', {power})"
             f" WHEN {e} >= 0 THEN left({sig}, {e} + 1) || '.' || substr({sig}, {e} + 2)"
             f" ELSE '0.' || repeat('0', -{e} - 1) || {sig} END")
    scientific = (f"left({sig}, 1) || CASE WHEN length({sig}) > 1 THEN '.' || substr({sig}, 2) ELSE '' END"
                  f" || 'e' || CASE WHEN {e} < 0 THEN '-' ELSE '+' END || CASE WHEN abs({e}) < 10 THEN '0' ELSE '' END"
                  f" || CAST(abs({e}) AS VARCHAR)")
    sign = f"CASE WHEN left({text}, 1) = '-' THEN '-' ELSE '' END"
    return (f"{sign} || CASE WHEN {sig} = '' THEN '0' WHEN {e} >= -4 AND {e} < {digits} THEN {fixed}"
            f" ELSE {scientific} END")


def raw_text(col: Column, dialect: Dialect, expr: str | None = None) -> str:
    """SQL, the first step of ``value_text``: one conversion of each value to text. Final for every
    kind but floats, whose engine text ``float_text`` then lays out (the steps are separate so
    each value is converted once: string work on a text is cheap, a float's conversion is not)."""
    q = expr or quote_ident(col.name)
    kind = col.type.kind
    pg = dialect == "postgres"
    if kind in _TEXT_KINDS:
        # format() calls the output function (char(n) keeps its padding) but makes NULL ''.
        return f"CASE WHEN {q} IS NOT NULL THEN format('%s', {q}) END" if pg else _text(q, dialect)
    if kind in _TIMESTAMPS:
        micros = f"CAST(extract(epoch FROM {q}) * 1000000 AS bigint)" if pg else f"epoch_us({q})"
        return f"CASE WHEN isfinite({q}) THEN {_text(micros, dialect)} ELSE {_text(q, dialect)} END"
    if kind is TypeKind.BINARY:
        return f"encode({q}, 'hex')" if pg else f"lower(hex({q}))"
    if kind is TypeKind.LIST:
        return f"CAST(array_to_json({q}) AS text)" if pg else f"CAST(to_json({q}) AS VARCHAR)"
    return _text(q, dialect)  # int, long, decimal, boolean, date; a float's own text


def middle_text(col: Column, dialect: Dialect, raw: str) -> str:
    """SQL, the second step of ``value_text``, over ``raw`` (the first step's result): DuckDB's float
    texts taken apart (``_float_parts``); every other value as it is."""
    if col.type.kind not in _FLOATS or dialect == "postgres":
        return raw
    return _float_parts(raw)


def final_text(col: Column, dialect: Dialect, middle: str) -> str:
    """SQL, the last step of ``value_text``, over ``middle``: DuckDB's floats laid out as PostgreSQL
    prints them (the string work on the side that does it fastest); every other value as it is."""
    if col.type.kind not in _FLOATS or dialect == "postgres":
        return middle
    digits = 15 if col.type.kind is TypeKind.DOUBLE else 6  # DBL_DIG, FLT_DIG
    text = f"{middle}.t"
    return (f"CASE WHEN {text} IS NULL THEN NULL WHEN {text} IN ('nan', '-nan') THEN 'NaN'"
            f" WHEN {text} = 'inf' THEN 'Infinity' WHEN {text} = '-inf' THEN '-Infinity'"
            f" ELSE {_postgres_float(middle, digits)} END")


def value_text(col: Column, dialect: Dialect, expr: str | None = None) -> str:
    """SQL giving column ``col``'s value (``expr``, default its quoted name) as the compared text;
    NULL stays NULL. Queries over many rows take the steps one query level each (``verify.sides``)."""
    return final_text(col, dialect, middle_text(col, dialect, raw_text(col, dialect, expr)))


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
