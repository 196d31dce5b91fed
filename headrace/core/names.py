"""Table and column names: the one place that parses, quotes and displays them.

PostgreSQL names may hold anything but NUL: capitals ("OrderItem"), spaces, dots, double quotes,
reserved words (order, select), any Unicode, up to 63 bytes. headrace never rebuilds a name from
unquoted text: a table is a ``TableName(schema, name)`` of exact names, looked up in the catalog by
those names (or by oid), and every statement quotes what it names.

Three spellings:

- the *display* form, ``str(TableName)``: PostgreSQL's own ``format('%I.%I', schema, name)``, which
  quotes a part only when SQL needs it, so ``public.orders`` stays ``public.orders`` and
  ``public."Order Items"`` is both what people read (logs, status, metrics labels, API answers) and
  valid SQL to paste;
- the config / API form, parsed by ``TableName.parse``: the same SQL syntax, so a display form
  always parses back to the same name. Quoted parts are exact, unquoted parts fold to lower case as
  in SQL, and a bare name means ``public.<name>``;
- the quoted forms each dialect needs: ``quote_ident`` (PostgreSQL and DuckDB: double quotes) and
  ``quote_spark`` (Spark SQL: backticks).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import yaml

MAX_NAME_BYTES = 63  # PostgreSQL's NAMEDATALEN - 1

# Keywords PostgreSQL's quote_ident quotes (pg_get_keywords() where catcode <> 'U', PostgreSQL 15):
# the display form matches format('%I') so it is valid SQL wherever it is pasted.
_KEYWORDS = frozenset("""
all analyse analyze and any array as asc asymmetric authorization between bigint binary bit boolean both
case cast char character check coalesce collate collation column concurrently constraint create cross
current_catalog current_date current_role current_schema current_time current_timestamp current_user dec
decimal default deferrable desc distinct do else end except exists extract false fetch float for foreign
freeze from full grant greatest group grouping having ilike in initially inner inout int integer intersect
interval into is isnull join lateral leading least left like limit localtime localtimestamp national
natural nchar none normalize not notnull null nullif numeric offset on only or order out outer overlaps
overlay placing position precision primary real references returning right row select session_user setof
similar smallint some substring symmetric table tablesample then time timestamp to trailing treat trim
true union unique user using values varchar variadic verbose when where window with xmlattributes
xmlconcat xmlelement xmlexists xmlforest xmlnamespaces xmlparse xmlpi xmlroot xmlserialize xmltable
""".split())  # noqa: SIM905 - the list as pg_get_keywords() prints it

_PLAIN = re.compile(r"[a-z_][a-z0-9_]*")
# What SQL accepts unquoted (before folding): a letter, underscore or non-ASCII character first,
# then also digits and dollar signs.
_UNQUOTED = re.compile(r"[A-Za-z_\u0080-\U0010ffff][A-Za-z0-9_$\u0080-\U0010ffff]*")


def quote_ident(name: str) -> str:
    """``name`` as a PostgreSQL or DuckDB identifier: double quotes, inner double quotes doubled."""
    return '"' + name.replace('"', '""') + '"'


def quote_spark(name: str) -> str:
    """``name`` as a Spark SQL identifier (and for ``F.col``): backticks, inner backticks doubled.

    Quoted, a dot or space in a column name is part of the name, not a struct field access.
    """
    return "`" + name.replace("`", "``") + "`"


def display_ident(name: str) -> str:
    """``name`` as PostgreSQL's ``quote_ident`` spells it: quoted only when SQL needs quotes."""
    if _PLAIN.fullmatch(name) and name not in _KEYWORDS:
        return name
    return quote_ident(name)


def path_segment(name: str) -> str:
    """``name`` as one directory name, for targets whose layout puts names in file paths.

    A ``/`` would nest directories and ``.`` / ``..`` would climb out of the namespace (Iceberg's
    Hadoop catalog put a table named ``..`` at the warehouse root). Those are percent-encoded, and
    ``%`` too so the mapping stays one-to-one; every other name is kept as it is.
    """
    if name in (".", ".."):
        return name.replace(".", "%2E")
    return name.replace("%", "%25").replace("/", "%2F")


class TableNameError(ValueError):
    """A table name in the config or an API call that does not parse; the message shows the fix."""


@dataclass(frozen=True, order=True, slots=True)
class TableName:
    """A table's exact schema and name, as the PostgreSQL catalog holds them."""

    schema: str
    name: str

    def __str__(self) -> str:
        return f"{display_ident(self.schema)}.{display_ident(self.name)}"

    @property
    def sql(self) -> str:
        """Always-quoted ``"schema"."name"`` for PostgreSQL or DuckDB statements."""
        return f"{quote_ident(self.schema)}.{quote_ident(self.name)}"

    @classmethod
    def parse(cls, text: str, default_schema: str = "public") -> TableName:
        """Parse ``schema.table`` or ``table`` in SQL syntax (``"Sales"."Order Items"``, ``orders``).

        Quoted parts are exact (``""`` is a double quote inside), unquoted parts fold ASCII capitals
        to lower case as PostgreSQL does, and a bare name is in ``default_schema``. Raises
        ``TableNameError`` saying what is wrong and how to spell the name.
        """
        parts = _split(text)
        if len(parts) == 1:
            return cls(default_schema, parts[0])
        if len(parts) == 2:
            return cls(parts[0], parts[1])
        raise TableNameError(
            f"table name {text!r} has {len(parts)} dot-separated parts; write schema.table, and quote a part"
            f' that holds a dot: {_suggest(text)}')


@dataclass(frozen=True, order=True, slots=True)
class ColumnName:
    """A column of a table, by exact names: ``public.grid.cells``, ``"Sales"."Order Items"."Weird Col"``."""

    table: TableName
    column: str

    def __str__(self) -> str:
        return f"{self.table}.{display_ident(self.column)}"

    @classmethod
    def parse(cls, text: str, default_schema: str = "public") -> ColumnName:
        """Parse ``schema.table.column`` or ``table.column`` in SQL syntax, as ``TableName.parse`` does.

        Quoted parts are exact, unquoted parts fold to lower case, and ``table.column`` is in
        ``default_schema``. Raises ``TableNameError`` saying how to spell it.
        """
        parts = _split(text, "column")
        if len(parts) == 3:
            return cls(TableName(parts[0], parts[1]), parts[2])
        if len(parts) == 2:
            return cls(TableName(default_schema, parts[0]), parts[1])
        raise TableNameError(
            f"column {text!r} has {len(parts)} dot-separated part(s); write schema.table.column (or"
            " table.column for schema public), and quote a part that holds a dot: "
            "'\"Sales\".\"Order Items\".\"Weird Col\"'")


def _split(text: str, what: str = "table name") -> list[str]:
    """The exact names in dotted SQL ``text``; TableNameError when it is not valid SQL name syntax."""
    parts: list[str] = []
    i, n = 0, len(text)
    if not text.strip():
        example = "schema.table.column, e.g. public.grid.cells" if what == "column" else "schema.table, e.g. public.orders"
        raise TableNameError(f"empty {what}: write {example}")
    while True:
        while i < n and text[i].isspace():
            i += 1
        if i < n and text[i] == '"':
            j, buf = i + 1, []
            while True:
                close = text.find('"', j)
                if close < 0:
                    raise TableNameError(
                        f"{what} {text!r} has an unclosed double quote: write {_suggest(text, what)}")
                buf.append(text[j:close])
                if close + 1 < n and text[close + 1] == '"':  # "" inside quotes is one double quote
                    buf.append('"')
                    j = close + 2
                    continue
                i = close + 1
                break
            part = "".join(buf)
            if not part:
                raise TableNameError(f'{what} {text!r} has an empty quoted part ""')
        else:
            j = i
            while j < n and text[j] != "." and text[j] != '"':
                j += 1
            raw = text[i:j].strip()
            if not _UNQUOTED.fullmatch(raw):
                problem = "an empty part" if not raw else f"{raw!r}, which SQL cannot read unquoted"
                raise TableNameError(
                    f"{what} {text!r} has {problem}: quote a name that holds spaces, dots, quotes or other"
                    f" signs, and keep its exact case inside the quotes: {_suggest(text, what)}")
            part = "".join(c.lower() if "A" <= c <= "Z" else c for c in raw)
            i = j
        if len(part.encode()) > MAX_NAME_BYTES:
            raise TableNameError(
                f"name {part!r} in {text!r} is {len(part.encode())} bytes: PostgreSQL names are at most"
                f" {MAX_NAME_BYTES} bytes")
        parts.append(part)
        while i < n and text[i].isspace():
            i += 1
        if i >= n:
            return parts
        if text[i] != ".":
            raise TableNameError(
                f"{what} {text!r} has {text[i:]!r} after a quoted name: write {_suggest(text, what)}")
        i += 1


def _suggest(text: str, what: str = "table name") -> str:
    """A likely intended spelling: the last dot splits schema from table, each part quoted exactly."""
    if what != "table name":
        return """'"Schema"."Table"."Column"' (each part that is not plain lower case in double quotes)"""
    raw = text.strip().replace('"', "")
    schema, dot, name = raw.rpartition(".")
    if not dot:
        return f"'public.{display_ident(raw)}'"
    return f"'{display_ident(schema.strip())}.{display_ident(name.strip())}'"


def columns_as_text_item(column: ColumnName) -> str:
    """The YAML list item that keeps ``column`` as text: ``- public.grid.cells`` (quoted where YAML needs it)."""
    return str(yaml.safe_dump([str(column)], allow_unicode=True, width=1 << 20)).strip()
