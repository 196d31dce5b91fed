"""``headrace init``: a first, commented pipeline file for a PostgreSQL database.

It looks at the database the way ``headrace check`` does (the same assessment, ``source.postgres.assess``)
and writes what it found: the tables it can replicate, those it cannot with the reason and the fix
(no key and no REPLICA IDENTITY FULL, privileges, names the chosen target cannot hold), the values a
sample of each table holds that the target cannot (listed under ``source.columns_as_text``, or
named next to ``values.infinity``), and the settings left to decide. The DSN goes in as ``dsn_env``:
a password never lands in the file.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import yaml

from headrace.config import parse_config, redacted_dsn
from headrace.core.errors import SourceError
from headrace.core.names import ColumnName, TableName, columns_as_text_item, display_ident, quote_ident
from headrace.core.schema import Column, TableSchema, TypeKind
from headrace.source.postgres.assess import assess
from headrace.source.postgres.catalog import read_table_schema
from headrace.source.postgres.tables import list_tables
from headrace.source.postgres.types import TypeCatalog

Conn = psycopg.Connection[Any]

TARGETS = ("iceberg", "ducklake")
SAMPLE_ROWS = 100_000  # rows of each table whose values are looked at (the first ones a scan returns)
_DATETIMES = (TypeKind.DATE, TypeKind.TIMESTAMP, TypeKind.TIMESTAMPTZ)
_TIMESTAMPS = (TypeKind.TIMESTAMP, TypeKind.TIMESTAMPTZ)
# Spark and DuckDB hold timestamps up to here; PostgreSQL goes to 294276 AD (docs/types.md).
_LAST_TIMESTAMP = "294247-01-10"


@dataclass
class FoundTable:
    """One source table, as the file will name it."""

    name: str  # display form: public."Order Items"
    refused: list[str] = field(default_factory=list)  # why it cannot be replicated, each with its fix
    notes: list[str] = field(default_factory=list)  # what a reader should know (columns kept as text, ...)
    as_text: list[tuple[ColumnName, str]] = field(default_factory=list)  # columns_as_text entries, and why
    infinite: list[str] = field(default_factory=list)  # columns with infinite dates/timestamps
    too_late: list[str] = field(default_factory=list)  # columns with timestamps past 294247 AD


@dataclass
class Survey:
    """What ``headrace init`` found in a database."""

    database: str
    target: str
    server_problems: list[str]
    tables: list[FoundTable]
    sample_rows: int


def pipeline_name(database: str) -> str:
    """A valid pipeline name (``[a-z][a-z0-9_]{0,40}``) from a database name."""
    name = re.sub(r"[^a-z0-9_]+", "_", database.lower()).strip("_") or "pipeline"
    if not name[0].isalpha():
        name = f"p_{name}"
    return name[:41].rstrip("_") or "pipeline"


def _value_checks(column: Column, target: str) -> dict[str, str]:
    """reason -> SQL that is true for a value of ``column`` the target cannot hold as its type."""
    col, kind, element = quote_ident(column.name), column.type.kind, column.type.element
    checks: dict[str, str] = {}
    if kind is TypeKind.DECIMAL:
        checks["nan"] = f"{col}::text IN ('NaN', 'Infinity', '-Infinity')"
    if kind is TypeKind.LIST:
        checks["dimensions"] = f"(array_ndims({col}) > 1 OR array_lower({col}, 1) <> 1)"
    kinds = [(kind, col)] + ([(element.kind, "e")] if kind is TypeKind.LIST and element else [])
    for each, expr in kinds:
        infinity = f"{expr} IN ('infinity', '-infinity')" if each in _DATETIMES and target == "iceberg" else ""
        late = f"({expr} > '{_LAST_TIMESTAMP}' AND {expr} <> 'infinity')" if each in _TIMESTAMPS else ""
        for reason, test in (("infinity", infinity), ("late", late)):
            if test:
                checks[reason] = test if expr == col else f"EXISTS (SELECT 1 FROM unnest({col}) e WHERE {test})"
    return checks


def _sample_values(conn: Conn, schema: TableSchema, target: str, rows: int) -> dict[str, list[str]]:
    """reason -> the columns of which some value in the table's first ``rows`` rows has it."""
    checks = [(c.name, reason, sql) for c in schema.columns for reason, sql in _value_checks(c, target).items()]
    if not checks or rows <= 0:
        return {}
    columns = ", ".join(dict.fromkeys(quote_ident(name) for name, _, _ in checks))
    table = schema.table_name.sql
    row = conn.execute(f"SELECT {', '.join(f'coalesce(bool_or({sql}), false)' for _, _, sql in checks)}"
                       f" FROM (SELECT {columns} FROM {table} LIMIT {int(rows)}) s").fetchone()
    found: dict[str, list[str]] = {}
    for (name, reason, _), hit in zip(checks, row or (), strict=False):
        if hit:
            found.setdefault(reason, []).append(name)
    return found


def _folded(schema: TableSchema) -> tuple[str, str]:
    """The table's name as DuckDB matches it: case-insensitively."""
    return schema.schema.lower(), schema.name.lower()


def _ducklake_refusals(schema: TableSchema, twins: dict[tuple[str, str], list[str]]) -> list[str]:
    """Why a DuckLake cannot hold the table's names (DuckDB matches names case-insensitively)."""
    name = schema.qualified_name
    out = []
    seen: dict[str, str] = {}
    for column in schema.column_names:
        twin = seen.setdefault(column.lower(), column)
        if twin != column:
            out.append(f"a DuckLake cannot hold table {name}: its columns {display_ident(twin)} and"
                       f" {display_ident(column)} differ only in case (DuckDB names are case-insensitive);"
                       f" rename one in the source, or replicate the table to Iceberg")
    others = [t for t in twins.get(_folded(schema), []) if t != name]
    if others:
        out.append(f"a DuckLake cannot hold table {name} beside {', '.join(others)}: their names differ only"
                   " in case (DuckDB names are case-insensitive); replicate one of them, or rename one in the source")
    return out


def survey(conn: Conn, target: str, schemas: list[str] | None = None, sample_rows: int = SAMPLE_ROWS) -> Survey:
    """Every table of ``schemas`` (all non-system schemas when None), assessed for ``target``."""
    if target not in TARGETS:
        raise ValueError(f"target must be one of {', '.join(TARGETS)}, not {target!r}")
    names = list(list_tables(conn, schemas or None).values())
    types = TypeCatalog(conn)
    assessment = assess(conn, names, "headrace_init", types)
    schemas_of = {t["table"]: read_table_schema(conn, TableName.parse(t["table"]), types)
                  for t in assessment["tables"] if t["exists"]}
    twins: dict[tuple[str, str], list[str]] = {}
    for name, schema in schemas_of.items():
        twins.setdefault(_folded(schema), []).append(name)
    found = []
    for item in assessment["tables"]:
        table = FoundTable(item["table"], refused=list(item["problems"]))
        known = schemas_of.get(item["table"])
        if known is not None:
            if target == "ducklake":
                table.refused += _ducklake_refusals(known, twins)
            _note_columns(table, item)
            if not table.refused:
                _note_values(table, known, _sample_values(conn, known, target, sample_rows))
        found.append(table)
    return Survey(str(conn.info.dbname), target, list(assessment["server_problems"]), found, sample_rows)


def _note_columns(table: FoundTable, item: dict[str, Any]) -> None:
    """What the assessment says of the table's columns, as notes."""
    if item.get("kept_as_text"):
        table.notes.append("kept as text (PostgreSQL's text form, no loss): "
                           + ", ".join(f"{c['column']} ({c['pg_type']})" for c in item["kept_as_text"]))
    if item.get("unsupported_columns"):
        table.notes.append("types headrace does not know, kept as text: " + ", ".join(item["unsupported_columns"]))
    if item.get("generated_not_replicated"):
        table.notes.append("generated columns not replicated (pgoutput does not send them before PostgreSQL"
                           " 18; compute them in the target): " + ", ".join(item["generated_not_replicated"]))
    if item.get("multi_dimensional_arrays"):
        table.notes.append("declared multi-dimensional; a multi-dimensional value would stop the table: "
                           + ", ".join(item["multi_dimensional_arrays"]))


def _note_values(table: FoundTable, schema: TableSchema, found: dict[str, list[str]]) -> None:
    """What the sample found: columns to keep as text (in column order), columns for ``values.infinity``."""
    why = {"nan": "NaN or Infinity in a numeric(p,s) column",
           "dimensions": "a multi-dimensional array, or one not starting at 1"}
    for column in schema.column_names:
        reasons = [text for reason, text in why.items() if column in found.get(reason, [])]
        if reasons:
            table.as_text.append((ColumnName(schema.table_name, column), reasons[0]))
    table.infinite = found.get("infinity", [])
    table.too_late = found.get("late", [])


def _scalar(text: str) -> str:
    """``text`` as a YAML scalar on one line, quoted only where YAML needs it."""
    if any(ord(c) < 32 for c in text):  # a newline in a name: a double-quoted scalar escapes it
        return json.dumps(text, ensure_ascii=False)
    return str(yaml.safe_dump(text, allow_unicode=True, width=1 << 20)).removesuffix("\n...\n").strip()


def _comment(text: str, indent: str = "", mark: str = "# ") -> list[str]:
    """``text`` as YAML comment lines of at most ~100 characters, each ``indent`` + ``mark`` + words."""
    lines, line = [], ""
    for word in text.split():
        if line and len(indent) + len(mark) + len(line) + len(word) >= 100:
            lines.append(f"{indent}{mark}{line}")
            line = ""
        line = f"{line} {word}" if line else word
    return lines + ([f"{indent}{mark}{line}"] if line else [])


_COMMENT_AT = 30  # the column where a setting's comment starts


def _setting(line: str, comment: str) -> list[str]:
    """``line`` with ``comment`` beside it (aligned), or above it when both do not fit in 100 characters."""
    if len(line.ljust(_COMMENT_AT)) + len(comment) + 2 <= 100:
        return [f"{line.ljust(_COMMENT_AT)}# {comment}"]
    indent = line[:len(line) - len(line.lstrip())]
    return _comment(comment, indent) + [line]


def render(found: Survey, name: str, dsn_env: str, folder: str) -> str:
    """The pipeline file for ``found``: YAML with comments, valid for ``headrace check``."""
    ready = [t for t in found.tables if not t.refused]
    refused = [t for t in found.tables if t.refused]
    out = [f"# headrace pipeline for database {found.database}, written by `headrace init`.",
           "# Check it: headrace check -c <this file>; then start it: headrace run -c <this file>.",
           "# Every key is described in the configuration reference (docs); DECIDE marks what is yours to choose.", ""]
    if found.server_problems:
        out.append("# The server is not ready yet; fix these before `headrace run`:")
        for problem in found.server_problems:
            out += _comment(problem, "", "#   ")
        out.append("")
    out += _setting(f"name: {name}", f"names the replication slot and the publication (headrace_{name})")
    out += ["source:"]
    out += _setting(f"  dsn_env: {dsn_env}", "the variable holding the DSN: no password in this file")
    out += _setting("  # schemas: [...]", "instead of tables: every table of these schemas, and later ones")
    if ready:
        out.append("  tables:")
        for table in ready:
            out.append(f"    - {_scalar(table.name)}")
            for note in table.notes:
                out += _comment(note, "      ")
    else:
        out += _setting("  tables: []", "no table can be replicated yet: see below")
    if refused:
        out.append("    # Not replicated, each with what stands in the way (fix it, then uncomment the line):")
        for table in refused:
            out.append(f"    # - {_scalar(table.name)}")
            for reason in table.refused:
                out += _comment(reason, "    ", "#       ")
    as_text = [(column, why) for t in ready for column, why in t.as_text]
    if as_text:
        out += [f"  # Values in the first {found.sample_rows:,} rows of these columns cannot be held by their",
                "  # type: they are kept as PostgreSQL's exact text instead. Remove a line to keep the type (fix",
                "  # the values in the source first: a value like these stops the table).",
                "  columns_as_text:"]
        for column, why in as_text:
            out += _setting(f"    {columns_as_text_item(column)}", why)
    out += _target_lines(found.target, folder)
    out += ["staging:"]
    out += _setting(f"  path: {_scalar(folder + '/staging')}", "DECIDE: staged change files (a folder Spark's"
                    " executors can read too)")
    out += ["values:"] + _infinity_lines(ready)
    out += _setting("schema_changes:", "DECIDE: what a DDL on the source does (the defaults)")
    out += _setting("  drop_column: keep", "keep | drop")
    out += _setting("  drop_table: keep", "keep | drop")
    out += _setting("  recreated_table: resync", "resync | refuse")
    out += ["spark:"]
    out += _setting("  master: local[*]", "DECIDE: or spark://host:7077, yarn, k8s://... (a cluster)")
    out += ["api:"]
    out += _setting("  listen: 127.0.0.1:8765", "status page, REST API, /metrics; off loopback set token_env")
    return "\n".join(out) + "\n"


def _infinity_lines(ready: list[FoundTable]) -> list[str]:
    """``values.infinity``: clamp, saying where, when the sample held values the target cannot hold."""
    infinite = [f"{t.name}.{c}" for t in ready for c in t.infinite]
    too_late = [f"{t.name}.{c}" for t in ready for c in t.too_late]
    if not infinite and not too_late:
        return _setting("  infinity: stop", "or clamp: infinite or out-of-range dates a target cannot hold")
    kinds = [k for k, seen in (("infinite dates or timestamps", infinite), ("timestamps after 294247 AD", too_late))
             if seen]
    columns = ", ".join(dict.fromkeys(infinite + too_late))
    return _comment(f"DECIDE: the sample holds {' and '.join(kinds)} ({columns}), which the target cannot hold."
                    " stop: the table stops with the value in its error; clamp: -infinity becomes 0001-01-01,"
                    " infinity and later 9999-12-31 23:59:59.999999 (counted in headrace_values_changed_total)",
                    "  ") + ["  infinity: clamp"]


def _target_lines(target: str, folder: str) -> list[str]:
    if target == "iceberg":
        return ["target:", "  iceberg:",
                *_setting(f"    warehouse: {_scalar(folder + '/warehouse')}", "DECIDE: where data and metadata go"),
                *_comment("a JDBC catalog in PostgreSQL instead of the Hadoop one on the warehouse path: other"
                          " engines find the tables by name, and renames can be followed", "    "),
                "    # catalog: {type: jdbc, uri_env: LAKECAT_DSN}"]
    return ["target:", "  ducklake:",
            *_comment("DECIDE: the catalog: a DuckDB file (one process at a time), or catalog_env naming a"
                      " variable that holds postgres:<libpq conninfo> or sqlite:<path> (other readers beside it)",
                      "    "),
            f"    catalog: {_scalar(folder + '/lake.ducklake')}",
            *_setting(f"    data_path: {_scalar(folder + '/lake-data')}", "DECIDE: where the Parquet files go")]


@dataclass(frozen=True)
class Written:
    """A pipeline file's text, what it was made from, and the variable it reads the DSN from."""

    text: str
    survey: Survey
    dsn_env: str


def write_pipeline_file(dsn: str, target: str, schemas: list[str] | None, dsn_env: str | None = None,
                        name: str | None = None, folder: str | None = None,
                        sample_rows: int = SAMPLE_ROWS) -> Written:
    """The pipeline file for the database ``dsn`` names. ``folder`` is where the paths left to decide
    point by default (the output file's folder; the working folder when None)."""
    try:
        with psycopg.connect(dsn, connect_timeout=10, autocommit=True) as conn:
            found = survey(conn, target, schemas, sample_rows)
    except psycopg.OperationalError as exc:
        raise SourceError(f"cannot connect to {redacted_dsn(dsn)}: {str(exc).strip()}") from None
    name = name or pipeline_name(found.database)
    dsn_env = dsn_env or f"{name.upper()}_DSN"
    text = render(found, name, dsn_env, str(Path(folder or ".").resolve()))
    parse_config(yaml.safe_load(text), "the written file")  # what init writes is always a valid file
    return Written(text, found, dsn_env)
