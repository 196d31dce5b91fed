"""Helpers for end-to-end tests: build a pipeline config, run it, compare target with source."""

from __future__ import annotations

import datetime as dt
import decimal
import itertools
import struct
from pathlib import Path
from typing import Any

import psycopg

from headrace.config import PipelineConfig, parse_config
from headrace.core.schema import TableSchema, TypeKind
from headrace.source.postgres.catalog import read_table_schema

_catalogs = itertools.count()

TEXT_KINDS = {TypeKind.STRING, TypeKind.UUID, TypeKind.JSON, TypeKind.INTERVAL, TypeKind.TIME}


def make_config(dsn: str, tmp: Path, tables: list[str], target: str = "iceberg", **overrides: Any) -> PipelineConfig:
    """A pipeline writing under ``tmp``; each config gets its own Spark catalog name."""
    if target == "iceberg":
        target_cfg: dict[str, Any] = {"iceberg": {"warehouse": str(tmp / "warehouse"),
                                                  "catalog_name": f"hr{next(_catalogs)}"}}
    else:
        target_cfg = {"ducklake": {"catalog": str(tmp / "lake" / "meta.ducklake"),
                                   "data_path": str(tmp / "lake" / "data")}}
    raw: dict[str, Any] = {
        "name": "t",
        "source": {"dsn": dsn, "tables": tables},
        "target": target_cfg,
        "staging": {"path": str(tmp / "staging"), "flush_seconds": 0.3, "heartbeat_seconds": 1.0},
        "apply": {"idle_sleep_seconds": 0.1},
    }
    for key, value in overrides.items():
        raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value
    return parse_config(raw)


def _norm(value: Any) -> Any:
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.timezone.utc).replace(tzinfo=None)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, list):
        return [_norm(v) for v in value]
    if isinstance(value, float) and value != value:
        return "NaN"
    if isinstance(value, decimal.Decimal):
        return value.normalize() if value.is_finite() else str(value)
    return value


def source_rows(dsn: str, table: str) -> tuple[TableSchema, list[tuple[Any, ...]]]:
    """The source table's rows, sorted, with text-kept kinds read as PostgreSQL text."""
    with psycopg.connect(dsn) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        schema = read_table_schema(conn, table)
        exprs = []
        for col in schema.columns:
            quoted = '"' + col.name.replace('"', '""') + '"'
            kind = col.type.kind
            elem = col.type.element.kind if col.type.element else None
            if kind in TEXT_KINDS:
                # format() calls the output function, so char(n) keeps its padding (::text drops it)
                exprs.append(f"CASE WHEN {quoted} IS NOT NULL THEN format('%s', {quoted}) END")
            elif kind is TypeKind.LIST and elem in TEXT_KINDS:
                exprs.append(f"{quoted}::text[]")
            else:
                exprs.append(quoted)
        rows = conn.execute(f"SELECT {', '.join(exprs)} FROM {table}").fetchall()
    floats = {i for i, c in enumerate(schema.columns) if c.type.kind is TypeKind.FLOAT}
    out = [tuple(_norm(_float32(v) if i in floats and isinstance(v, float) else v) for i, v in enumerate(r))
           for r in rows]
    return schema, sorted(out, key=repr)


def _float32(value: float) -> float:
    """``real`` values as the float32 they are (psycopg widens the decimal text to a double)."""
    return float(struct.unpack("f", struct.pack("f", value))[0])


def target_rows(pipeline: Any, schema: TableSchema) -> list[tuple[Any, ...]]:
    """The target table's source columns, sorted and normalised like ``source_rows``."""
    df = pipeline.target.read_table(schema).select(*[f"`{c}`" for c in schema.column_names])
    out = []
    for row in df.collect():
        values = []
        for col, value in zip(schema.columns, row, strict=True):
            if col.type.kind is TypeKind.FLOAT and isinstance(value, float):
                value = _float32(value)
            if col.type.kind in TEXT_KINDS and value is not None and not isinstance(value, str):
                value = str(value)
            values.append(_norm(value))
        out.append(tuple(values))
    return sorted(out, key=repr)


def assert_same(pipeline: Any, dsn: str, table: str) -> int:
    """Assert target == source row by row; return the row count."""
    schema, expected = source_rows(dsn, table)
    actual = target_rows(pipeline, schema)
    if actual != expected:
        missing = [r for r in expected if r not in actual][:5]
        extra = [r for r in actual if r not in expected][:5]
        raise AssertionError(f"{table}: {len(expected)} source rows, {len(actual)} target rows;\n"
                             f"missing in target: {missing}\nunexpected in target: {extra}")
    return len(expected)
