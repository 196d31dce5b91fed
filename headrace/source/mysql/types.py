"""MySQL/MariaDB types -> headrace logical types (``ColumnType``), and values -> the text ``cast_text`` reads.

One spelling per type, built the same way from the catalog (``information_schema.columns``) and from
a binlog TABLE_MAP event (type codes plus ``binlog_row_metadata=FULL``), so a table's schema read
either way compares equal and capture sees a schema change only when the table changed. The
spelling leaves out what a TABLE_MAP cannot tell: display widths (``int(11)``, so ``tinyint(1)``
and ``BOOL`` are ``tinyint``), ENUM/SET member lists, the geometry subtype.

Values reach Spark as the text PostgreSQL would print for the logical type (``core.spark_types``):
``to_text`` turns what pymysql (the copy) or mysql-replication (the binlog) returns into that
text, identical for the same stored value whichever path read it (tested).

Zero dates: MySQL's ``0000-00-00`` (and dates with a zero month or day, and the zero TIMESTAMP)
have no value in any target; they arrive as ``-infinity`` and so follow ``values.infinity`` like
PostgreSQL's infinite dates: ``stop`` stops the table naming the column, ``clamp`` stores
0001-01-01 (counted as ``infinity_clamped``), DuckLake keeps -infinity. Never a silent NULL.
"""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import json
import struct
from collections.abc import Callable, Sequence
from typing import Any, Final

from pymysqlreplication.constants import FIELD_TYPE

from headrace.core.errors import SourceError
from headrace.core.schema import Column, ColumnType, TypeKind
from headrace.source.mysql import binlog_time  # noqa: F401  (at import: the binlog's TIME read right)
from headrace.source.mysql.fixed_binary import FIXED_BINARY_TYPES, fixed_binary_text

# Iceberg (and most lakehouse formats) cap decimals at 38 digits; wider ones are kept as exact text,
# as for PostgreSQL's numeric (source.postgres.types).
MAX_DECIMAL_PRECISION = 38
ZERO_DATE_TEXT = "-infinity"


class _ZeroDate:
    """What the binlog stream passes for a zero or partly-zero date (mysql-replication gives None)."""

    def __repr__(self) -> str:
        return "ZERO_DATE"


ZERO_DATE: Final = _ZeroDate()

_K = TypeKind
_INTEGERS = ("tinyint", "smallint", "mediumint", "int", "bigint")
_TEXTS = ("tinytext", "text", "mediumtext", "longtext")
_BLOBS = ("tinyblob", "blob", "mediumblob", "longblob")
_GEOMETRIES = ("geometry", "point", "linestring", "polygon", "multipoint", "multilinestring", "multipolygon",
               "geometrycollection")
# Bytes per character, for the lengths a TABLE_MAP gives in bytes (charsets not listed: 1).
_MBMAXLEN = {"utf8mb4": 4, "utf8mb3": 3, "utf8": 3, "ucs2": 2, "utf16": 4, "utf16le": 4, "utf32": 4,
             "big5": 2, "gbk": 2, "sjis": 2, "cp932": 2, "euckr": 2, "gb2312": 2, "ujis": 3, "eucjpms": 3}


def _spelled(base: str, unsigned: bool = False, *args: int) -> ColumnType:
    """The logical type of MySQL type ``base`` (lower case) with its arguments (length, precision...)."""
    sign = " unsigned" if unsigned else ""
    spelling = f"{base}({','.join(map(str, args))}){sign}" if args else f"{base}{sign}"
    if base in _INTEGERS:
        if base == "bigint":
            # BIGINT UNSIGNED reaches 2^64-1, past a long: an exact 20-digit decimal.
            return ColumnType(_K.DECIMAL, spelling, 20, 0) if unsigned else ColumnType(_K.LONG, spelling)
        return ColumnType(_K.LONG if base == "int" and unsigned else _K.INT, spelling)
    if base == "decimal":
        precision, scale = args
        if precision > MAX_DECIMAL_PRECISION:
            return ColumnType(_K.STRING, spelling)
        return ColumnType(_K.DECIMAL, spelling, precision, scale)
    # TIME is a duration (-838:59:59..838:59:59), which no time-of-day type (TypeKind.TIME) holds.
    # MariaDB's UUID maps as PostgreSQL's uuid does; INET4/INET6 are kept as the server's text.
    simple = {"float": _K.FLOAT, "double": _K.DOUBLE, "year": _K.INT, "date": _K.DATE, "time": _K.STRING,
              "datetime": _K.TIMESTAMP, "timestamp": _K.TIMESTAMPTZ, "json": _K.JSON, "geometry": _K.BINARY,
              "uuid": _K.UUID, "inet4": _K.STRING, "inet6": _K.STRING}
    if base in simple:
        return ColumnType(simple[base], spelling)
    if base == "bit":
        return ColumnType(_K.BOOLEAN if args == (1,) else _K.STRING, spelling)
    if base in ("binary", "varbinary") or base in _BLOBS:
        return ColumnType(_K.BINARY, spelling)
    # char, varchar, the texts, enum, set, and anything unknown: the server's text is exact.
    return ColumnType(_K.STRING, spelling)


def column_type(data_type: str, column_type_text: str, numeric_precision: int | None,
                numeric_scale: int | None, datetime_precision: int | None, char_length: int | None
                ) -> ColumnType:
    """The logical type of a column from its ``information_schema.columns`` row
    (``DATA_TYPE, COLUMN_TYPE, NUMERIC_PRECISION, NUMERIC_SCALE, DATETIME_PRECISION,
    CHARACTER_MAXIMUM_LENGTH``)."""
    base = data_type.lower()
    unsigned = "unsigned" in column_type_text.lower()
    if base == "decimal":
        return _spelled(base, unsigned, int(numeric_precision or 10), int(numeric_scale or 0))
    if base in ("float", "double"):
        return _spelled(base, unsigned)
    if base == "bit":
        return _spelled(base, False, int(numeric_precision or 1))
    if base in ("time", "datetime", "timestamp"):
        return _spelled(base, False, *([datetime_precision] if datetime_precision else []))
    if base in ("char", "varchar", "binary", "varbinary"):
        return _spelled(base, False, int(char_length or 0))
    if base in _GEOMETRIES:
        return _spelled("geometry")
    return _spelled(base, unsigned)


def binlog_column_type(column: Any, declared: str | None = None) -> ColumnType:
    """The logical type of a column of a binlog TABLE_MAP (a ``pymysqlreplication.column.Column``),
    spelled as ``column_type`` spells the same column from the catalog. ``declared`` is the
    catalog's type for a column MariaDB declares as UUID, INET4 or INET6, which a TABLE_MAP shows as
    BINARY(n): taken when the sizes agree."""
    code = column.type
    if declared is not None and code == FIELD_TYPE.STRING and (column.collation_name or "binary") == "binary" \
            and column.max_length == FIXED_BINARY_TYPES.get(declared):
        return _spelled(declared)
    unsigned = bool(column.unsigned)
    ints = {FIELD_TYPE.TINY: "tinyint", FIELD_TYPE.SHORT: "smallint", FIELD_TYPE.INT24: "mediumint",
            FIELD_TYPE.LONG: "int", FIELD_TYPE.LONGLONG: "bigint"}
    if code in ints:
        return _spelled(ints[code], unsigned)
    if code == FIELD_TYPE.NEWDECIMAL:
        return _spelled("decimal", unsigned, column.precision, column.decimals)
    if code in (FIELD_TYPE.FLOAT, FIELD_TYPE.DOUBLE):
        return _spelled("float" if code == FIELD_TYPE.FLOAT else "double", unsigned)
    if code == FIELD_TYPE.BIT:
        return _spelled("bit", False, column.bits)
    fractional = {FIELD_TYPE.TIME2: "time", FIELD_TYPE.DATETIME2: "datetime", FIELD_TYPE.TIMESTAMP2: "timestamp"}
    if code in fractional:
        return _spelled(fractional[code], False, *([column.fsp] if column.fsp else []))
    plain = {FIELD_TYPE.TIME: "time", FIELD_TYPE.DATETIME: "datetime", FIELD_TYPE.TIMESTAMP: "timestamp",
             FIELD_TYPE.DATE: "date", FIELD_TYPE.NEWDATE: "date", FIELD_TYPE.YEAR: "year",
             FIELD_TYPE.ENUM: "enum", FIELD_TYPE.SET: "set", FIELD_TYPE.JSON: "json",
             FIELD_TYPE.GEOMETRY: "geometry"}
    if code in plain:
        return _spelled(plain[code])
    charset = (column.collation_name or "binary").split("_")[0]
    binary = charset == "binary"
    if code in (FIELD_TYPE.VARCHAR, FIELD_TYPE.VAR_STRING, FIELD_TYPE.STRING):
        base = ("varbinary" if binary else "varchar") if code != FIELD_TYPE.STRING else \
            ("binary" if binary else "char")
        return _spelled(base, False, column.max_length // _MBMAXLEN.get(charset, 1))
    if code == FIELD_TYPE.BLOB:
        return _spelled((_BLOBS if binary else _TEXTS)[column.length_size - 1])
    return ColumnType(_K.STRING, f"binlog type {code}")


# Cached: called for every value of every row.
@functools.lru_cache(maxsize=4096)
def base_type(ct: ColumnType) -> str:
    """The MySQL type's name without its arguments or ``unsigned`` (``bit(5)`` -> ``bit``)."""
    return ct.pg_type.split("(")[0].split(" ")[0]


@functools.lru_cache(maxsize=4096)
def type_args(ct: ColumnType) -> tuple[int, ...]:
    """The MySQL type's arguments (``decimal(10,2)`` -> ``(10, 2)``)."""
    inner = ct.pg_type.partition("(")[2].partition(")")[0]
    return tuple(int(a) for a in inner.split(",")) if inner else ()


def _float32_text(value: float) -> str:
    """The shortest text that reads back as the same 32-bit float (what PostgreSQL prints for real)."""
    bits = struct.pack("<f", value)
    for digits in range(6, 10):
        text = f"{value:.{digits}g}"
        if struct.pack("<f", float(text)) == bits:
            return repr(float(text))
    return repr(value)


def _time_text(value: dt.timedelta, fsp: int) -> str:
    """``[-]H:MM:SS[.f]``: MySQL's TIME spans -838:59:59 to 838:59:59, past a time of day."""
    micros = (value.days * 86400 + value.seconds) * 1_000_000 + value.microseconds
    sign = "-" if micros < 0 else ""
    seconds, micro = divmod(abs(micros), 1_000_000)
    text = f"{sign}{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
    return text + (f".{micro:06d}"[: fsp + 1] if fsp else "")


_EPOCH = dt.datetime(1970, 1, 1)


def to_text(value: Any, column: Column) -> str | None:
    """``value`` (from pymysql or mysql-replication) as the text ``cast_text`` expects for ``column``.

    ``None`` is SQL NULL. Zero dates (a string from pymysql, ``ZERO_DATE`` from the stream, the zero
    TIMESTAMP as the epoch from mysql-replication) become ``-infinity`` (module docstring).
    """
    if value is None:
        return None
    ct = column.type
    base = base_type(ct)
    if value is ZERO_DATE:
        return ZERO_DATE_TEXT
    if base in ("date", "datetime", "timestamp"):
        if isinstance(value, str):  # pymysql returns what is no valid date as the server's text
            return ZERO_DATE_TEXT
        if base == "timestamp" and value == _EPOCH:
            # TIMESTAMP starts at 1970-01-01 00:00:01 UTC; its stored 0 is the zero date, which
            # mysql-replication decodes as the epoch.
            return ZERO_DATE_TEXT
        if base == "date":
            return value.isoformat()  # type: ignore[no-any-return]
        text = value.replace(tzinfo=None).isoformat(sep=" ")
        return f"{text}+00" if base == "timestamp" else text  # type: ignore[no-any-return]
    if base in FIXED_BINARY_TYPES:
        return value if isinstance(value, str) else fixed_binary_text(base, bytes(value))
    if base == "bit":
        n = type_args(ct)[0]
        number = int.from_bytes(value, "big") if isinstance(value, bytes) else int(value, 2)
        return ("t" if number else "f") if n == 1 else format(number, f"0{n}b")
    if base == "year":
        # mysql-replication adds 1900 to the stored byte, so the zero year 0000 comes as 1900
        # (not a valid YEAR: the range is 1901..2155).
        return "0" if int(value) in (0, 1900) else str(int(value))
    if base == "float":
        return _float32_text(float(value))
    if base == "double":
        return repr(float(value))
    if base == "decimal":
        return f"{decimal.Decimal(value):.{type_args(ct)[1]}f}"
    if base == "time":
        return _time_text(value, (type_args(ct) or (0,))[0])
    if ct.kind is TypeKind.BINARY:
        data = value.encode() if isinstance(value, str) else bytes(value)
        if base == "geometry":
            data = data[4:]  # the stored form is a 4-byte SRID, then standard WKB
        elif base == "binary":
            data = data.ljust(type_args(ct)[0], b"\0")  # the binlog drops BINARY(n)'s trailing zero bytes
        return "\\x" + data.hex()
    if base == "set" and isinstance(value, set | frozenset):
        raise TypeError("a SET value must arrive as the server's text (binlog.set_text orders it)")
    if base == "json" and not isinstance(value, str | bytes):
        return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return str(value)


_NUMERIC_KINDS = frozenset({TypeKind.INT, TypeKind.LONG, TypeKind.DECIMAL, TypeKind.FLOAT, TypeKind.DOUBLE})


def added_column_fill(column: Column, default: str | None, extra: str) -> tuple[bool, str | None]:
    """``(known, text)``: what rows older than ``column`` hold once it is added, from its catalog
    ``COLUMN_DEFAULT`` (MariaDB 10.2.7+ spelling: ``NULL``, a quoted literal, a number, or an
    expression) and ``EXTRA``. ``known`` is False for expressions and generated columns."""
    base = base_type(column.type)
    if "GENERATED" in extra.upper():
        return False, None
    if default is None or default == "NULL":
        if column.nullable:
            return True, None
        # NOT NULL without a default: MySQL fills the type's implicit default.
        if base in ("date", "datetime"):
            return True, ZERO_DATE_TEXT
        if base in FIXED_BINARY_TYPES:
            return True, fixed_binary_text(base, b"")  # all zero bytes: 00000000-..., 0.0.0.0, ::
        if column.type.kind is TypeKind.STRING and base not in ("time", "bit"):
            return True, ""
        if column.type.kind is TypeKind.BINARY and base != "geometry":
            return True, to_text(b"", column)
        if column.type.kind in _NUMERIC_KINDS:
            return True, to_text(decimal.Decimal(0), column)
        return False, None
    if len(default) >= 2 and default[0] == default[-1] == "'":
        literal = default[1:-1].replace("''", "'")
        if base in FIXED_BINARY_TYPES:
            return False, None  # the server's spelling of the literal may differ from the user's
        if column.type.kind is TypeKind.STRING and base not in ("time", "bit"):
            return True, literal
        if base in ("date", "datetime", "timestamp"):
            if literal.startswith("0000") or "-00" in literal[:10]:
                return True, ZERO_DATE_TEXT
            return True, literal + ("+00" if base == "timestamp" else "")
        return False, None
    try:
        number = decimal.Decimal(default)
    except decimal.InvalidOperation:
        return False, None  # an expression: CURRENT_TIMESTAMP, UUID(), NEXTVAL(...)
    if column.type.kind in _NUMERIC_KINDS:
        return True, to_text(number, column)
    return False, None


def text_converter(column: Column) -> Callable[[Any], str | None]:
    """``to_text`` for one column, with the type dispatch done once (the copy and the stream call
    it for every value): integers, character strings, decimals, doubles and DATETIMEs take a short
    path; anything unusual for the type (a zero date's text, an int) still goes through ``to_text``."""
    base = base_type(column.type)
    if base in _INTEGERS:
        return lambda value: None if value is None else str(value)
    if base in ("char", "varchar", "enum", *_TEXTS):
        return lambda value: value if value is None or type(value) is str else to_text(value, column)
    if base == "decimal" and column.type.kind is TypeKind.DECIMAL:
        spec = f".{type_args(column.type)[1]}f"
        return lambda value: format(value, spec) if type(value) is decimal.Decimal else to_text(value, column)
    if base == "double":
        return lambda value: repr(value) if type(value) is float else to_text(value, column)
    if base == "datetime":
        return lambda value: value.isoformat(sep=" ") if type(value) is dt.datetime and value.tzinfo is None \
            else to_text(value, column)
    return lambda value: to_text(value, column)


# Types whose binlog values ``binlog_text`` must see even when not None: a SET arrives as a Python set,
# a UUID/INET all of whose bytes are zero as ''.
_BINLOG_SPECIAL = frozenset({"set", *FIXED_BINARY_TYPES})


def binlog_converters(columns: Sequence[Column]) -> tuple[list[str], list[Callable[[Any], str | None] | None],
                                                          list[Callable[[Any], str | None]]]:
    """For the stream, per column: its name, the converter a value that is not None can take directly
    (None: every value goes through ``binlog_text``), and its ``text_converter``."""
    convert = [text_converter(c) for c in columns]
    fast = [None if base_type(c.type) in _BINLOG_SPECIAL else f for c, f in zip(columns, convert, strict=True)]
    return [c.name for c in columns], fast, convert


# Why mysql-replication gave None for a value that is not NULL (its ``none_sources``).
_ZERO_DATE_SOURCES = frozenset({"out of date range", "out of datetime range", "out of datetime2 range"})


def binlog_text(value: Any, none_source: str | None, binlog_column: Any, column: Column,
                convert: Callable[[Any], str | None] | None = None) -> str | None:
    """``to_text`` of a value mysql-replication decoded from a row event.

    The library turns zero dates and the empty SET into None, telling why in ``none_source``: those
    become the zero date and ``''`` here, never NULL. A SET arrives as a Python set: its members are
    put back in definition order, as the server prints it. ``convert`` is the column's
    ``text_converter`` when the caller has it.
    """
    if value is None:
        if none_source in _ZERO_DATE_SOURCES:
            return ZERO_DATE_TEXT
        if none_source == "empty set":
            return ""
        if none_source in ("cols bitmap", "same with before values"):
            # The event left the column out (binlog_row_image MINIMAL/NOBLOB, or a partial JSON
            # update): its value is unknown, never NULL.
            raise SourceError(f"a binlog row event leaves out column {column.name}: run SET GLOBAL binlog_row_image ="
                              " 'FULL' (and binlog_row_value_options = '' on MySQL), add it to my.cnf, and run"
                              " `headrace resync` for the table")
        return None
    if isinstance(value, str) and base_type(column.type) in FIXED_BINARY_TYPES:
        value = value.encode()  # mysql-replication gives the empty image (all bytes zero) as ''
    if isinstance(value, set | frozenset):
        order = list(binlog_column.set_values or [])
        value = ",".join(sorted(value, key=order.index))
    return convert(value) if convert is not None else to_text(value, column)


def select_expression(column: Column) -> str:
    """The SELECT-list expression the copy reads ``column`` with (see ``copy.copy_chunk``).

    FLOAT is read as DOUBLE: the text protocol prints a FLOAT with 6 significant digits, losing bits
    the binlog keeps; the double holds the float exactly.
    """
    name = "`" + column.name.replace("`", "``") + "`"
    if base_type(column.type) == "float":
        return f"CAST({name} AS DOUBLE)"
    return name


def python_images(rows: list[dict[str, Any]], update: bool,
                  converters: tuple[list[str], list[Callable[[Any], str | None] | None], list[Callable[[Any], str | None]]],
                  columns: Sequence[Column], binlog_columns: Sequence[Any]) -> list[tuple[str | None, ...]]:
    """A row event's images (an UPDATE, ``update``: before, after, ...) as text, from mysql-replication's
    values, with the columns' ``binlog_converters``."""
    names, fast, convert = converters
    plan = list(zip(names, fast, convert, columns, binlog_columns, strict=True))

    def texts(values: dict[str, Any], none: dict[str, str]) -> tuple[str | None, ...]:
        # Most values take their column's converter directly; NULL-looking ones (zero dates, the
        # empty SET are None too) and the types binlog_text must see first go through it.
        return tuple(f(v) if f is not None and (v := values[n]) is not None
                     else binlog_text(values[n], none.get(n), lib, c, g) for n, f, g, c, lib in plan)

    if not update:
        return [texts(row["values"], row["none_sources"]) for row in rows]
    return [image for row in rows for image in (texts(row["before_values"], row["before_none_sources"]),
                                                texts(row["after_values"], row["after_none_sources"]))]
