"""OpenLineage datasets of a replicated table: the source table in, the target table out.

Names follow OpenLineage's naming conventions where they have one: PostgreSQL tables are
``postgres://host:port`` / ``database.schema.table``, MySQL/MariaDB tables ``mysql://host:port`` /
``database.table`` (the source kind comes from the DSN's scheme, as ``config.source_kind`` reads it;
credentials never go into a name); an Iceberg table is its location under the
warehouse (``file`` / ``/path/to/warehouse/namespace/table`` for a local warehouse, as Spark's own
OpenLineage integration names it). DuckLake has no convention yet: ``ducklake://<data path>`` /
``schema.table``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from openlineage.client.generated import column_lineage_dataset as cl
from openlineage.client.generated import schema_dataset as sd
from psycopg.conninfo import conninfo_to_dict

from headrace.config import PipelineConfig, source_kind
from headrace.core.schema import ColumnType, TableSchema

_KEPT = re.compile(r"^column (.+) dropped \(kept in the target")
_RENAMED = re.compile(r"^column (.+) renamed to (.+)$")


@dataclass(frozen=True)
class DatasetName:
    """An OpenLineage dataset's identity."""

    namespace: str
    name: str


def source_dataset(dsn: str, table: TableSchema) -> DatasetName:
    """The source table: ``postgres://host:port`` and ``database.schema.table`` for PostgreSQL,
    ``mysql://host:port`` and ``database.table`` for MySQL/MariaDB (whose schemas are databases)."""
    if source_kind(dsn) == "mysql":
        from headrace.source.mysql.connect import parse_dsn  # pymysql only when the source is MySQL

        parsed = parse_dsn(dsn)
        host = f"[{parsed.host}]" if ":" in parsed.host else parsed.host  # an IPv6 literal
        return DatasetName(f"mysql://{host}:{parsed.port}", f"{table.schema}.{table.name}")
    info = conninfo_to_dict(dsn)
    host = str(info.get("host") or "localhost").split(",")[0]
    port = str(info.get("port") or "5432").split(",")[0]
    database = info.get("dbname") or info.get("user") or "postgres"
    return DatasetName(f"postgres://{host}:{port}", f"{database}.{table.schema}.{table.name}")


def target_dataset(config: PipelineConfig, table: TableSchema) -> DatasetName:
    """The target table, named by where it lives."""
    if config.target.kind == "iceberg":
        settings = config.target.settings
        namespace = settings.namespace or table.target_schema
        url = urlparse(settings.warehouse)
        if url.scheme and url.scheme != "file":
            return DatasetName(f"{url.scheme}://{url.netloc}", f"{url.path.rstrip('/')}/{namespace}/{table.target_table}")
        path = os.path.abspath(url.path if url.scheme else settings.warehouse)
        return DatasetName("file", f"{path}/{namespace}/{table.target_table}")
    lake = config.target.section("ducklake")
    assert lake is not None
    data_path = lake.data_path if "://" in lake.data_path else os.path.abspath(lake.data_path)
    return DatasetName(f"ducklake://{data_path.removeprefix('file://')}",
                       f"{lake.schema_ or table.target_schema}.{table.target_table}")


@dataclass(frozen=True)
class ColumnHistory:
    """What the table's schema-change events say about its target columns."""

    renamed_from: dict[str, str]  # current column -> the name it had before its last rename
    kept: list[str]  # dropped in the source, kept in the target


def column_history(ddl: list[dict[str, Any]]) -> ColumnHistory:
    """``ColumnHistory`` from the table's ``_headrace.ddl_events`` rows, oldest first."""
    renamed: dict[str, str] = {}
    kept: list[str] = []
    for e in ddl:
        if e["kind"] == "drop_column" and (m := _KEPT.match(e["detail"])):
            kept.append(m.group(1))
        elif e["kind"] == "rename_column" and (m := _RENAMED.match(e["detail"])):
            old, new = m.group(1), m.group(2)
            renamed[new] = renamed.pop(old, old)
            kept = [new if k == old else k for k in kept]
    return ColumnHistory(renamed, kept)


def column_type_name(ct: ColumnType, target_kind: str | None = None) -> str:
    """A column's type as a dataset holds it: the source's own spelling (``ColumnType.pg_type`` is
    PostgreSQL's for a PostgreSQL table and MySQL's, e.g. ``bigint unsigned``, for a MySQL one), or with
    ``target_kind`` the type the target table has (Iceberg's as Spark spells it, DuckDB's for DuckLake)."""
    if target_kind == "iceberg":
        from headrace.core.spark_types import spark_type

        return str(spark_type(ct).simpleString())
    if target_kind == "ducklake":
        from headrace.targets.ducklake.types import duck_type

        return duck_type(ct)
    return ct.pg_type


def schema_facet(table: TableSchema, kept: list[str] = (), target: bool = False,  # type: ignore[assignment]
                 target_kind: str | None = None) -> sd.SchemaDatasetFacet:
    """The columns with their types (``column_type_name``: the source's spelling, the target's with
    ``target_kind``), and the target's kept dropped columns with ``target``."""
    fields = [sd.SchemaDatasetFacetFields(name=c.name, type=column_type_name(c.type, target_kind), ordinal_position=i)
              for i, c in enumerate(table.columns, 1)]
    if target:
        fields += [sd.SchemaDatasetFacetFields(name=k, description="dropped in the source, kept in the target",
                                               ordinal_position=len(fields) + i) for i, k in enumerate(kept, 1)]
    return sd.SchemaDatasetFacet(fields=fields)


def column_lineage_facet(source: DatasetName, table: TableSchema,
                         history: ColumnHistory) -> cl.ColumnLineageDatasetFacet:
    """Each target column from the source column it holds: identity, under its current name."""
    fields: dict[str, cl.Fields] = {}
    for col in table.columns:
        old = history.renamed_from.get(col.name)
        what = f"copied as is (source column renamed from {old})" if old else "copied as is"
        fields[col.name] = cl.Fields(inputFields=[cl.InputField(
            source.namespace, source.name, col.name,
            transformations=[cl.Transformation(type="DIRECT", subtype="IDENTITY", description=what)])])
    for name in history.kept:
        fields[name] = cl.Fields(inputFields=[cl.InputField(
            source.namespace, source.name, name,
            transformations=[cl.Transformation(type="DIRECT", subtype="IDENTITY", description=(
                "dropped in the source: rows written before the drop keep its values, later rows NULL"))])])
    return cl.ColumnLineageDatasetFacet(fields=fields)
