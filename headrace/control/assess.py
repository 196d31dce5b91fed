"""``headrace check`` and the API's assessments: the config's tables, every source table, and the text.

The per-table assessment itself is ``source.postgres.assess`` (adding a table uses it too).
"""

from __future__ import annotations

from typing import Any

import psycopg

from headrace.config import PipelineConfig, redacted_dsn
from headrace.core.errors import HeadraceError, SourceError
from headrace.core.names import TableName
from headrace.outage_signs import recorded_source_problems
from headrace.source import open_source, source_kind
from headrace.source.postgres.assess import assess, assess_table
from headrace.source.postgres.catalog import columns_as_text_problems, published_oids
from headrace.source.postgres.tables import list_tables
from headrace.source.postgres.types import TypeCatalog
from headrace.source.postgres.wal_guard import keep_size_advice

Conn = psycopg.Connection[Any]

_CANDIDATES = """
SELECT n.nspname, c.relname
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND n.nspname NOT IN ('pg_catalog', 'information_schema', '_headrace') AND n.nspname NOT LIKE 'pg_toast%'
  AND n.nspname NOT LIKE 'pg_temp%'
ORDER BY 1
"""


def assess_config(config: PipelineConfig, extra_tables: list[str] | None = None) -> dict[str, Any]:
    """``assess`` for the config's tables (plus ``extra_tables``), connecting to its source; and the
    object store, when a location is on one (a probe object written and deleted)."""
    result = _assess_source(config, extra_tables)
    store = storage_problems(config) + catalog_problems(config)
    if store:
        result["server_problems"] = store + result.get("server_problems", [])
        result["problems"] = store + result["problems"]
    return result


def storage_problems(config: PipelineConfig) -> list[str]:
    """What stops the pipeline from using its ``s3://`` locations (``headrace.storage.probe``), and the
    S3A jars Spark would lack."""
    from headrace.storage.probe import location_problems
    from headrace.storage.spark_conf import require_s3a

    if not config.uses_object_store:
        return []
    settings = {"iceberg": "target.iceberg.warehouse", "ducklake": "target.ducklake.data_path"}
    target_setting = settings.get(config.target.kind, f"target.{config.target.kind}")
    located = [("staging.path", config.staging.path)]
    located += [(target_setting, loc) for loc in config.target.plugin.locations(config.target.settings)]
    problems = location_problems(located)
    try:
        require_s3a(config.spark.conf)
    except HeadraceError as exc:
        problems.append(str(exc))
    return problems


def catalog_problems(config: PipelineConfig) -> list[str]:
    """An Iceberg REST catalog that does not answer or refuses the credentials (``rest_check``)."""
    settings = config.target.section("iceberg")
    if settings is None or settings.catalog.type != "rest":
        return []
    from headrace.targets.iceberg.rest_check import rest_catalog_problems

    return rest_catalog_problems(settings)


def _assess_source(config: PipelineConfig, extra_tables: list[str] | None = None) -> dict[str, Any]:
    dsn = config.source.resolved_dsn()
    if source_kind(dsn) != "postgresql":
        return _assess_through_source(config, extra_tables)
    tables = list(config.source.tables)
    try:
        with psycopg.connect(dsn, connect_timeout=10, autocommit=True) as conn:
            discovered: list[str] = []
            if config.source.discovers:
                discovered = list(list_tables(conn, config.source.schemas or None).values())
            tables += [t for t in discovered + list(extra_tables or []) if t not in tables]
            columns = config.source.text_columns
            result = assess(conn, tables, config.publication_name, TypeCatalog(conn, columns))
            # A hot standby as the source: where the state and the publication go instead.
            standby = open_source(config, dsn).standby_problems(conn, tables)  # type: ignore[attr-defined]
            result["server_problems"] += standby
            result["problems"] = standby + result["problems"]
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


def _assess_through_source(config: PipelineConfig, extra_tables: list[str] | None) -> dict[str, Any]:
    """``assess_config`` for a source other than PostgreSQL, through its ``Source``: the server's
    problems (its own check), each table's assessment, and the server the state was set up on."""
    from headrace.state.store import StateStore

    source = open_source(config)
    server = source.problems()
    try:
        with source.connect() as conn:
            tables: list[str | TableName] = list(config.source.table_names)
            if config.source.discovers:
                tables += [TableName.parse(t) for t in source.list_tables(conn, config.source.schemas or None).values()]
            tables += [TableName.parse(t) for t in extra_tables or []]
            result = source.assess(conn, list(dict.fromkeys(tables)))
            state = StateStore(config.source.resolved_state_dsn(), config.name)
            try:
                if state.installed():
                    source.check_same_source(conn, state)
            except SourceError as exc:
                server.append(str(exc))
            finally:
                state.close()
    except HeadraceError as exc:
        server.append(str(exc))
        result = {"tables": [], "problems": []}
    # The source's own check (``problems``) and its assessment both name the server's and the tables'
    # problems: each once, in order.
    result["server_problems"] = list(dict.fromkeys(server + result.get("server_problems", [])))
    result["problems"] = list(dict.fromkeys(server + result["problems"]))
    return result


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
