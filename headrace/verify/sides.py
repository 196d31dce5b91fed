"""The two sides of a comparison, each computing its own checksums: the source in a snapshot at a
known position (``verify.postgres``, ``verify.mysql``), and the lake through DuckDB at one pinned
snapshot (DuckLake version, Iceberg metadata file). Only per-range aggregates leave each side, and
the rows of ranges found to differ.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import duckdb

from headrace.core.names import quote_ident
from headrace.core.rows import HR_LSN
from headrace.core.schema import Column, TableSchema
from headrace.verify import canon
from headrace.verify.canon import HASH_BITS, Dialect

Checksums = dict[int, tuple[int, int]]  # range number -> (rows, sum of row hashes)


@dataclass(frozen=True)
class RowImage:
    """One row of a range that differs: its identity (key text), row hash and column texts;
    ``tag`` is the source tuple's version (``tableoid:ctid:xmin``) or the target row's ``_hr_lsn``."""

    ident: str
    ident_hash: int
    row_hash: int
    values: tuple[str | None, ...]
    tag: Any


KeyTexts = tuple[str | None, ...]  # a key's columns as compared texts


@dataclass(frozen=True)
class Ranges:
    """Which rows a query covers: those whose identity hash's first ``bits`` bits are in ``among``
    (every row when ``among`` is None), and with ``sample`` below 1 a fixed share of identities.
    ``keys``: the keys of those rows, when known, so a side with an index on them looks them up."""

    bits: int
    among: tuple[int, ...] | None = None
    sample: float = 1.0
    keys: tuple[KeyTexts, ...] | None = None


def added(parts: list[Checksums]) -> Checksums:
    """The checksums of a table from those of its parts (counts and sums add)."""
    out: Checksums = {}
    for part in parts:
        for r, (n, total) in part.items():
            have = out.get(r, (0, 0))
            out[r] = (have[0] + n, have[1] + total)
    return out


def _layers(table: TableSchema, dialect: Dialect, source: str, extras: list[str]) -> str:
    """A FROM item of ``source`` (a table with its WHERE) with, per row, ``_v_ident`` (the identity's
    text), ``_v_kh`` and ``_v_rh`` (identity and row hashes, ``canon``), ``_v_c<i>`` (the compared
    texts) and ``_v_x<j>`` (``extras``). Each step is its own query level, in PostgreSQL fenced by
    ``OFFSET 0`` so it does not fold them and convert a value once per use; columns a query does
    not read are left out of every level by both engines."""
    n = len(table.columns)
    names = table.column_names
    if canon.has_integer_key(table):  # the key's value, mixed: no MD5 of it
        extras = [*extras, canon.key_hash(quote_ident(table.key[0]), dialect)]
    xs = [f"_v_x{j}" for j in range(len(extras))]
    raw = [f"{canon.raw_text(c, dialect)} AS _v_r{i}" for i, c in enumerate(table.columns)]
    plain = [canon.plain_double(c, dialect) for c in table.columns]
    raw += [f"{p} AS _v_f{i}" for i, p in enumerate(plain) if p is not None]
    raw += [f"{e} AS {x}" for e, x in zip(extras, xs, strict=True)]
    parts = [canon.middle_parts(c, dialect, f"_v_r{i}", f"_v_f{i}" if plain[i] else None)
             for i, c in enumerate(table.columns)]
    middle = [f"{sql} AS _v_{name}{i}" for i, ps in enumerate(parts) for name, sql in ps]
    final = [f"{canon.final_text(c, dialect, {name: f'_v_{name}{i}' for name, _ in ps})} AS _v_c{i}"
             for i, (c, ps) in enumerate(zip(table.columns, parts, strict=True))]
    identity = canon.identity_columns(table)
    ident = canon.joined(identity, [f"_v_c{names.index(c.name)}" for c in identity], dialect)
    cs = [f"_v_c{i}" for i in range(n)]
    fence = " OFFSET 0" if dialect == "postgres" else ""  # DuckDB computes each once anyway, in parallel
    if all(canon.passes_on(ps) for ps in parts):
        # nothing to take apart (PostgreSQL's texts are the compared ones): no level passing them on
        texts = [f"{canon.raw_text(c, dialect)} AS _v_c{i}" for i, c in enumerate(table.columns)]
        texts += [f"{e} AS {x}" for e, x in zip(extras, xs, strict=True)]
        columns = f"(SELECT {', '.join(texts)} FROM {source}{fence}) c"
    else:
        columns = (f"(SELECT {', '.join(final + xs)} FROM (SELECT {', '.join(middle + xs)} FROM"
                   f" (SELECT {', '.join(raw)} FROM {source}{fence}) r{fence}) m{fence}) c")
    row_hash = canon.hash60(canon.joined(table.columns, cs, dialect), dialect)
    inner = ", ".join(cs + xs)
    if canon.has_integer_key(table):
        ident_hash, xs = xs[-1], xs[:-1]
    elif not table.key:
        ident_hash = "_v_rh"  # a keyless row's identity is the whole row: one MD5 for both
    else:
        ident_hash = canon.hash60("_v_ident", dialect)
    return (f"(SELECT _v_ident, {ident_hash} AS _v_kh, _v_rh, {', '.join(cs + xs)} FROM"
            f" (SELECT {ident} AS _v_ident, {row_hash} AS _v_rh, {inner} FROM {columns}{fence}) j)")


def _among(expr: str, values: tuple[int, ...], dialect: Dialect) -> str:
    """SQL: ``expr`` is one of ``values`` (a literal list, inlined: no placeholders, so ``%`` in the
    SQL stays itself)."""
    items = ", ".join(str(int(v)) for v in values)
    if dialect == "duckdb":
        return f"list_contains([{items}]::BIGINT[], {expr})"
    if dialect == "postgres":
        return f"{expr} = ANY(ARRAY[{items}]::bigint[])"
    return f"{expr} IN ({items})"


def _filters(ranges: Ranges, dialect: Dialect) -> str:
    where = ["true"]
    if ranges.sample < 1.0:
        where.append(f"_v_kh % 1000000 < {int(ranges.sample * 1_000_000)}")
    if ranges.among is not None:
        shift = HASH_BITS - ranges.bits
        where.append(_among(f"(_v_kh >> {shift})", ranges.among, dialect))
    return " AND ".join(where)


class Side(ABC):
    """What a comparison asks of each side."""

    dialect: Dialect

    @abstractmethod
    def relation(self, table: TableSchema) -> str:
        """The FROM item that reads ``table`` at this side's point."""

    @abstractmethod
    def extra_columns(self) -> list[str]:
        """The columns that give each row's ``RowImage.tag``."""

    @abstractmethod
    def fetch(self, query: str) -> list[tuple[Any, ...]]:
        """Run ``query`` at this side's point."""

    def key_filter(self, table: TableSchema, ranges: Ranges) -> str:
        """A WHERE clause on the table itself that finds ``ranges.keys`` by index ("": none)."""
        return ""

    def checksums(self, table: TableSchema, ranges: Ranges, bits: int) -> Checksums:
        """Rows and hash sums per range of ``bits`` bits, over the rows ``ranges`` covers."""
        return self.checksums_of(self.relation(table), table, ranges, bits, self.fetch)

    def checksums_of(self, relation: str, table: TableSchema, ranges: Ranges, bits: int,
                     fetch: Callable[[str], list[tuple[Any, ...]]]) -> Checksums:
        """``checksums`` of the rows of ``relation`` (the table, or a part of it), read by ``fetch``."""
        where = _filters(ranges, self.dialect)
        rows = _layers(table, self.dialect, relation, [])
        query = f"SELECT _v_kh >> {HASH_BITS - bits} AS r, count(*), sum(_v_rh) FROM {rows} v WHERE {where} GROUP BY 1"
        return {int(r): (int(n), int(s)) for r, n, s in fetch(query)}

    def rows(self, table: TableSchema, ranges: Ranges) -> list[RowImage]:
        """The rows ``ranges`` covers, with their column texts."""
        where = _filters(ranges, self.dialect)
        cols = ", ".join(f"_v_c{i}" for i in range(len(table.columns)))
        extra = self.extra_columns()
        rows = _layers(table, self.dialect, self.relation(table) + self.key_filter(table, ranges), extra)
        tags = "".join(f"_v_x{i}, " for i in range(len(extra)))
        query = f"SELECT _v_ident, _v_kh, _v_rh, {tags}{cols} FROM {rows} v WHERE {where}"
        out = []
        n = len(extra)
        for r in self.fetch(query):
            tag = r[3] if n == 1 else ":".join(str(x) for x in r[3:3 + n]) if n else str(r[2])  # no tag: the row hash
            out.append(RowImage(r[0], int(r[1]), int(r[2]), tuple(r[3 + n:]), tag))
        return out


class SourceSide(Side):
    """The source in one snapshot at a known position (``fetch``, ``rows``, ``checksums``), or as it
    is now (``versions``)."""

    @abstractmethod
    def versions(self, table: TableSchema, ranges: Ranges) -> dict[str, set[str]]:
        """Identity text -> the versions holding it now (a fresh read outside the snapshot) of the
        identities ``ranges`` names, comparable with the ``RowImage.tag`` of the snapshot's rows: the
        same set only when nothing changed them since."""

    def versions_of(self, table: TableSchema, ranges: Ranges, version: str) -> dict[str, set[str]]:
        """``versions`` with ``version`` the SQL of a row's version."""
        rows = _layers(table, self.dialect, self.relation(table) + self.key_filter(table, ranges), [version])
        query = f"SELECT _v_ident, _v_x0 FROM {rows} v WHERE {_filters(ranges, self.dialect)}"
        now: dict[str, set[str]] = {}
        for ident_text, tag in self.fetch(query):
            now.setdefault(ident_text, set()).add(str(tag))
        return now

    def keys_in(self, table: TableSchema, ranges: Ranges, literal: Callable[[Column, str], str | None]) -> str:
        """`` WHERE (key) IN (...)`` finding ``ranges.keys`` by index, each key's values spelled by
        ``literal`` ("" when a value has no literal: the rows are found by hash alone)."""
        if not ranges.keys or not table.key:
            return ""
        columns = [table.column(k) for k in table.key]
        rows = []
        for key in ranges.keys:
            values = [literal(c, text) if text is not None else None for c, text in zip(columns, key, strict=True)]
            if any(v is None for v in values):
                return ""
            rows.append(f"({', '.join(v for v in values if v is not None)})")
        return f" WHERE ({', '.join(quote_ident(k) for k in table.key)}) IN ({', '.join(rows)})"


class LakeSide(Side):
    """The target through DuckDB: ``relations`` maps a table's oid to its pinned FROM item."""

    dialect: Dialect = "duckdb"

    def __init__(self, con: duckdb.DuckDBPyConnection, relations: dict[int, str]) -> None:
        self.con = con
        self.relations = relations

    def relation(self, table: TableSchema) -> str:
        return self.relations[table.oid]

    def extra_columns(self) -> list[str]:
        return [HR_LSN]

    def fetch(self, query: str) -> list[tuple[Any, ...]]:
        return self.con.execute(query).fetchall()
