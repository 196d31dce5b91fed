"""Can a source table be replicated? One assessment, shared by the API and `headrace check`.

For each table: its key (primary key or replica identity index), replica identity, columns whose
types headrace keeps as text, privileges (SELECT, and ownership to add it to the publication),
and every problem as a sentence that names the table and the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from headrace.config import PipelineConfig, redacted_dsn
from headrace.core.names import TableName
from headrace.core.schema import TypeKind
from headrace.outage import recorded_source_problems
from headrace.source.postgres.catalog import (
    columns_as_text_problems,
    find_relation,
    list_tables,
    problems_of_table,
    published_oids,
    read_table_schema,
    server_problems,
    table_keys,
)
from headrace.source.postgres.replication import GENERATED_COLUMNS_VERSION
from headrace.source.postgres.types import TypeCatalog
from headrace.source.postgres.wal_guard import keep_size_advice

Conn = psycopg.Connection[Any]

REPLICA_IDENTITY = {"d": "default", "n": "nothing", "f": "full", "i": "index"}
_PLAIN_TEXT = ("text", "character varying", "character", "name", "citext", "bpchar", "varchar")

_CANDIDATES = """
SELECT n.nspname, c.relname
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND n.nspname NOT IN ('pg_catalog', 'information_schema', '_headrace') AND n.nspname NOT LIKE 'pg_toast%'
  AND n.nspname NOT LIKE 'pg_temp%'
ORDER BY 1
"""


def assess_table(conn: Conn, table: str | TableName, published: set[int], types: TypeCatalog | None = None
                 ) -> dict[str, Any]:
    """What replicating ``table`` would meet; ``ready`` is True when nothing stands in the way.

    ``types`` is the pipeline's (columns it keeps as text are listed as such).
    """
    problems = problems_of_table(conn, table, published)
    row = find_relation(conn, table)
    if row is None:
        return {"table": str(table), "oid": None, "exists": False, "ready": False, "problems": problems}
    oid, schema_name, name, kind, replident, owner = row
    out: dict[str, Any] = {"table": str(TableName(schema_name, name)), "oid": int(oid), "exists": True}
    if kind not in ("r", "p"):
        return {**out, "ready": False, "problems": problems}
    primary, _ = table_keys(conn, oid)
    schema = read_table_schema(conn, TableName(schema_name, name), types)
    as_text = [
        {"column": c.name, "pg_type": c.type.pg_type}
        for c in schema.columns
        if c.type.kind is TypeKind.STRING and not c.type.pg_type.startswith(_PLAIN_TEXT)
    ]
    privileges = conn.execute(
        "SELECT has_table_privilege(%s::oid, 'SELECT'), pg_has_role(%s::oid, 'USAGE')", (oid, owner)
    ).fetchone()
    can_select, is_owner = privileges if privileges else (False, False)
    # Left out of copy and stream alike (catalog._COLUMNS): stored ones before PostgreSQL 18, virtual always.
    not_replicated = [r[0] for r in conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped"
        " AND attgenerated <> '' AND (attgenerated = 'v' OR current_setting('server_version_num')::int < %s)"
        " ORDER BY attnum", (oid, GENERATED_COLUMNS_VERSION)).fetchall()]
    # Declared with dimensions (int[][]): a multi-dimensional value would stop the table (a list holds one).
    multi_dimensional = [r[0] for r in conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped"
        " AND attndims > 1 ORDER BY attnum", (oid,)).fetchall()
        if schema.column(r[0]).type.kind is TypeKind.LIST]  # not those kept as text
    return {
        **out,
        "primary_key": list(primary),
        "replica_identity": REPLICA_IDENTITY.get(replident, replident),
        "key": list(schema.key),
        "columns": len(schema.columns),
        "kept_as_text": as_text,  # no loss: their PostgreSQL text form is stored as a string
        "generated_not_replicated": not_replicated,
        "multi_dimensional_arrays": multi_dimensional,
        "unsupported_columns": [c["column"] for c in as_text if c["pg_type"].startswith("unknown type")],
        "can_select": bool(can_select),
        "can_publish": bool(is_owner) or int(oid) in published,
        "ready": not problems,
        "problems": problems,
    }


def assess(conn: Conn, tables: Sequence[str | TableName], publication: str, types: TypeCatalog | None = None
           ) -> dict[str, Any]:
    """The server's readiness and each table's assessment; ``problems`` lists all of them."""
    server = server_problems(conn)
    published = published_oids(conn, publication)
    assessed = [assess_table(conn, t, published, types) for t in tables]
    return {
        "server_problems": server,
        "tables": assessed,
        "problems": server + [p for t in assessed for p in t["problems"]],
    }


def assess_config(config: PipelineConfig, extra_tables: list[str] | None = None) -> dict[str, Any]:
    """``assess`` for the config's tables (plus ``extra_tables``), connecting to its source."""
    dsn = config.source.resolved_dsn()
    tables = list(config.source.tables)
    try:
        with psycopg.connect(dsn, connect_timeout=10, autocommit=True) as conn:
            discovered: list[str] = []
            if config.source.discovers:
                discovered = list(list_tables(conn, config.source.schemas or None).values())
            tables += [t for t in discovered + list(extra_tables or []) if t not in tables]
            columns = config.source.text_columns
            result = assess(conn, tables, config.publication_name, TypeCatalog(conn, columns))
            # Entries of source.columns_as_text that name no column: a typo would keep nothing as text.
            listed = columns_as_text_problems(conn, sorted(columns))
            result["problems"] = listed + result["problems"]
            # The source the pipeline was set up on, and its slot, still there (a failover can lose it).
            recorded = recorded_source_problems(config, conn)
            result["server_problems"] += recorded
            result["problems"] = recorded + result["problems"]
            result["wal"] = keep_size_advice(conn, config.source.max_retained_wal)
            if discovered:
                # Discovered tables that cannot be replicated are skipped (and noted), not fatal.
                result["refused"] = [t for t in result["tables"] if t["table"] in discovered and t["problems"]]
                refused = {p for t in result["refused"] for p in t["problems"]}
                result["problems"] = [p for p in result["problems"] if p not in refused]
            return result
    except psycopg.OperationalError as exc:
        problem = f"cannot connect to the source {redacted_dsn(dsn)}: {str(exc).strip()}"
        return {"server_problems": [problem], "tables": [], "problems": [problem]}


def candidates(conn: Conn, publication: str, tracked: set[str]) -> list[dict[str, Any]]:
    """Every ordinary table of the source database, assessed, with whether it is replicated now."""
    published = published_oids(conn, publication)
    out = []
    for schema_name, name in conn.execute(_CANDIDATES).fetchall():
        item = assess_table(conn, TableName(schema_name, name), published)
        item["tracked"] = item["table"] in tracked
        out.append(item)
    return out


def format_assessment(pipeline: str, assessment: dict[str, Any]) -> str:
    """The assessment for people: every problem, or a line per table when all is well."""
    problems = assessment["problems"]
    if problems:
        lines = [f"{len(problems)} problem(s) with pipeline {pipeline}:"]
        lines += [f"  - {p}" for p in problems]
        ready = sum(1 for t in assessment["tables"] if t["ready"])
        if ready:
            lines.append(f"{ready} other table(s) ready")
        return "\n".join(lines + _wal_lines(assessment))
    lines = [f"pipeline {pipeline}: config and source OK ({len(assessment['tables'])} tables)"]
    for t in assessment["tables"]:
        note = f"key ({', '.join(t['key'])}), replica identity {t['replica_identity']}, {t['columns']} columns"
        if t["kept_as_text"]:
            note += "; kept as text: " + ", ".join(f"{c['column']} ({c['pg_type']})" for c in t["kept_as_text"])
        if t.get("generated_not_replicated"):
            note += ("; generated columns not replicated (pgoutput sends stored ones from PostgreSQL 18 on,"
                     " virtual ones never; compute them in the target): " + ", ".join(t["generated_not_replicated"]))
        if t.get("multi_dimensional_arrays"):
            note += ("; declared multi-dimensional (a multi-dimensional value stops the table: lists hold one"
                     " dimension; list them in source.columns_as_text to keep them as text): "
                     + ", ".join(t["multi_dimensional_arrays"]))
        lines.append(f"  {t['table']}: {note}")
    for t in assessment.get("refused", []):
        lines.append(f"  {t['table']}: will be skipped: {'; '.join(t['problems'])}")
    return "\n".join(lines + _wal_lines(assessment))


def _wal_lines(assessment: dict[str, Any]) -> list[str]:
    wal = assessment.get("wal")
    return [f"source max_slot_wal_keep_size: {wal['advice']}"] if wal else []
