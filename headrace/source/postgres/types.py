"""PostgreSQL types (oid + typmod) → headrace logical types (``ColumnType``).

Builtin types resolve from a static table without a round trip, spelled as ``format_type()`` would
spell them. Everything else (enums, domains, arrays of those, extension types) is looked up once in
``pg_type`` by ``TypeCatalog`` and cached.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any

import psycopg

from headrace.core.names import ColumnName, TableName
from headrace.core.schema import ColumnType, TypeKind

# Iceberg (and most lakehouse formats) cap decimals at 38 digits.
MAX_DECIMAL_PRECISION = 38
NUMERIC_OID = 1700

_K = TypeKind
# oid → (kind, name as format_type spells it without a typmod)
_SCALARS: dict[int, tuple[TypeKind, str]] = {
    16: (_K.BOOLEAN, "boolean"),
    17: (_K.BINARY, "bytea"),
    18: (_K.STRING, '"char"'),
    19: (_K.STRING, "name"),
    20: (_K.LONG, "bigint"),
    21: (_K.INT, "smallint"),
    23: (_K.INT, "integer"),
    25: (_K.STRING, "text"),
    26: (_K.STRING, "oid"),
    114: (_K.JSON, "json"),
    142: (_K.STRING, "xml"),
    650: (_K.STRING, "cidr"),
    700: (_K.FLOAT, "real"),
    701: (_K.DOUBLE, "double precision"),
    774: (_K.STRING, "macaddr8"),
    790: (_K.STRING, "money"),
    829: (_K.STRING, "macaddr"),
    869: (_K.STRING, "inet"),
    1042: (_K.STRING, "bpchar"),
    1043: (_K.STRING, "character varying"),
    1082: (_K.DATE, "date"),
    1083: (_K.TIME, "time without time zone"),
    1114: (_K.TIMESTAMP, "timestamp without time zone"),
    1184: (_K.TIMESTAMPTZ, "timestamp with time zone"),
    1186: (_K.INTERVAL, "interval"),
    1266: (_K.STRING, "time with time zone"),
    1560: (_K.STRING, "bit"),
    1562: (_K.STRING, "bit varying"),
    NUMERIC_OID: (_K.DECIMAL, "numeric"),
    2950: (_K.UUID, "uuid"),
    3614: (_K.STRING, "tsvector"),
    3802: (_K.JSON, "jsonb"),
}

# array oid → element oid, for the builtin array types of the scalars above
_ARRAYS: dict[int, int] = {
    1000: 16, 1001: 17, 1002: 18, 1003: 19, 1016: 20, 1005: 21, 1007: 23, 1009: 25, 1028: 26,
    199: 114, 143: 142, 651: 650, 1021: 700, 1022: 701, 775: 774, 791: 790, 1040: 829, 1041: 869,
    1014: 1042, 1015: 1043, 1182: 1082, 1183: 1083, 1115: 1114, 1185: 1184, 1187: 1186, 1270: 1266,
    1561: 1560, 1563: 1562, 1231: 1700, 2951: 2950, 3643: 3614, 3807: 3802,
}

# interval typmod: range bits in the high 16 bits (datetime.h INTERVAL_MASK), precision in the low
_INTERVAL_RANGES = {
    1 << 2: " year", 1 << 1: " month", 1 << 3: " day", 1 << 10: " hour", 1 << 11: " minute",
    1 << 12: " second", (1 << 2) | (1 << 1): " year to month", (1 << 3) | (1 << 10): " day to hour",
    (1 << 3) | (1 << 10) | (1 << 11): " day to minute",
    (1 << 3) | (1 << 10) | (1 << 11) | (1 << 12): " day to second",
    (1 << 10) | (1 << 11): " hour to minute", (1 << 10) | (1 << 11) | (1 << 12): " hour to second",
    (1 << 11) | (1 << 12): " minute to second", 0x7FFF: "",
}


def _spell(oid: int, name: str, typmod: int) -> str:
    """``format_type(oid, typmod)`` for the builtin scalars."""
    if typmod < 0:
        return name
    if oid == NUMERIC_OID:
        precision, scale = numeric_precision_scale(typmod)
        return f"numeric({precision},{scale})"
    if oid == 1043:
        return f"character varying({typmod - 4})"
    if oid == 1042:
        return f"character({typmod - 4})"
    if oid in (1560, 1562):
        return f"{name}({typmod})"
    if oid in (1083, 1114, 1184, 1266):
        base, _, zone = name.partition(" ")
        return f"{base}({typmod}) {zone}"
    if oid == 1186:
        fields = _INTERVAL_RANGES.get((typmod >> 16) & 0x7FFF, "")
        precision = typmod & 0xFFFF
        return f"interval{fields}" + (f"({precision})" if precision != 0xFFFF else "")
    return name


def numeric_precision_scale(typmod: int) -> tuple[int, int]:
    """Precision and scale packed in a numeric typmod (PG15+ allows a negative scale: 11-bit signed)."""
    packed = typmod - 4
    return (packed >> 16) & 0xFFFF, ((packed & 0x7FF) ^ 1024) - 1024


def builtin_type(oid: int, typmod: int = -1) -> ColumnType | None:
    """The logical type of a builtin PostgreSQL type, or ``None`` if ``oid`` is not in the static table."""
    scalar = _SCALARS.get(oid)
    if scalar is not None:
        kind, name = scalar
        pg_type = _spell(oid, name, typmod)
        if kind is TypeKind.DECIMAL:
            return _numeric(pg_type, typmod)
        return ColumnType(kind, pg_type)
    element_oid = _ARRAYS.get(oid)
    if element_oid is not None:
        # An array column's typmod is its element's typmod.
        element = builtin_type(element_oid, typmod)
        assert element is not None
        return list_of(element)
    return None


def _numeric(pg_type: str, typmod: int) -> ColumnType:
    if typmod < 0:
        # Unconstrained numeric holds any precision and scale (and NaN, ±Infinity), which no fixed
        # decimal type can hold: keep its exact text rather than round it.
        return ColumnType(TypeKind.STRING, pg_type)
    precision, scale = numeric_precision_scale(typmod)
    if precision > MAX_DECIMAL_PRECISION or scale < 0 or scale > precision:
        # Wider than lakehouse decimals, or a scale they cannot express: text is lossless.
        return ColumnType(TypeKind.STRING, pg_type)
    return ColumnType(TypeKind.DECIMAL, pg_type, precision=precision, scale=scale)


def list_of(element: ColumnType) -> ColumnType:
    """A one-dimensional array of ``element`` (PostgreSQL does not record dimensions in the type)."""
    return ColumnType(TypeKind.LIST, element.pg_type + "[]", element=element)


_LOOKUP = """
SELECT t.typtype, t.typbasetype, t.typtypmod, t.typelem, format_type(t.oid, %s),
       EXISTS (SELECT FROM pg_type e WHERE e.oid = t.typelem AND e.typarray = t.oid
               AND e.typdelim = ',')
FROM pg_type t WHERE t.oid = %s
"""


class TypeCatalog:
    """Resolves any type oid of one database, asking ``pg_type`` for the non-builtin ones (cached).

    ``conn`` is a psycopg 3 connection to the source database, used only for types outside the
    static table. A lookup on an idle non-autocommit connection commits its own short transaction,
    so a long-lived catalog never leaves the connection idle in transaction (holding back xmin).

    ``as_text`` lists the columns the pipeline keeps as PostgreSQL's text output whatever their
    type (``source.columns_as_text``). ``column`` applies it: every path that reads a table's shape
    (copy, capture, add-table, start-up, check) resolves column types through it, so copy and
    stream always agree.
    """

    def __init__(self, conn: psycopg.Connection[Any], as_text: Collection[ColumnName] = ()) -> None:
        self._conn = conn
        self._cache: dict[tuple[int, int], ColumnType] = {}
        self.as_text = frozenset(as_text)

    def column(self, table: TableName, name: str, oid: int, typmod: int = -1) -> ColumnType:
        """The logical type of column ``name`` of ``table``: STRING when the config keeps it as text.

        A column kept as text keeps its PostgreSQL spelling (``integer[]``) for messages; its values
        are the text PostgreSQL prints, stored as a string.
        """
        mapped = self.column_type(oid, typmod)
        if ColumnName(table, name) in self.as_text:
            return ColumnType(TypeKind.STRING, mapped.pg_type)
        return mapped

    def column_type(self, oid: int, typmod: int = -1) -> ColumnType:
        """The logical type of a column of type ``oid`` with modifier ``typmod``."""
        builtin = builtin_type(oid, typmod)
        if builtin is not None:
            return builtin
        key = (oid, typmod)
        cached = self._cache.get(key)
        if cached is None:
            cached = self._cache[key] = self._lookup(oid, typmod)
        return cached

    def _lookup(self, oid: int, typmod: int) -> ColumnType:
        conn = self._conn
        if conn.autocommit or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            row = conn.execute(_LOOKUP, (typmod, oid)).fetchone()
        else:
            with conn.transaction():
                row = conn.execute(_LOOKUP, (typmod, oid)).fetchone()
        if row is None:
            # Dropped since the RELATION message was sent: text is still a faithful representation.
            return ColumnType(TypeKind.STRING, f"unknown type (oid {oid})")
        typtype, base_oid, base_typmod, elem_oid, spelling, is_array = row
        if typtype == "d":
            # A domain behaves as its base type; the domain's own typmod applies unless the column
            # has one (e.g. CREATE DOMAIN price AS numeric(10,2)).
            base = self.column_type(base_oid, typmod if typmod >= 0 else base_typmod)
            return dataclasses.replace(base, pg_type=spelling)
        if is_array:
            # The array type of its element, not merely a type with a typelem: int2vector,
            # oidvector, name and point have one too, but their text form is no array literal.
            # Arrays of box separate elements with ';' (typdelim): kept as text, like the box itself.
            element = self.column_type(elem_oid, typmod)
            return ColumnType(TypeKind.LIST, spelling, element=element)
        # Enums (category 'E'), composites, ranges, extension types: their text output is exact.
        return ColumnType(TypeKind.STRING, spelling)
