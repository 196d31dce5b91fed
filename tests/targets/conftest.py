"""The contract suite's targets: one ``target`` fixture per registered target (the registry's names),
plus DuckLake on a SQLite catalog, and the row shape (``headrace.core.interfaces.Target``) built as
Spark DataFrames.

``TARGET_KINDS`` follows the target registry: a target added as a folder with a ``plugin.py`` runs the
whole contract once ``settings_for`` knows how to give it a place to write (the test fails until then).
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from headrace.core.interfaces import Target
from headrace.core.names import quote_spark
from headrace.core.schema import TableSchema
from headrace.core.spark_types import spark_type
from headrace.targets import registry

# Every registered target (faulty: wrapping a DuckLake, with no fault armed: it must keep the
# contract it delegates), and DuckLake on a SQLite catalog besides its DuckDB-file catalog.
TARGET_KINDS = [*registry.names(), "ducklake-sqlite"]
TS = dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=dt.timezone.utc)
_catalogs = itertools.count()


def _raw_settings(kind: str, tmp_path: Path) -> dict[str, Any]:
    """The ``target:`` section (as written in YAML) of a kind of ``TARGET_KINDS`` under ``tmp_path``."""
    if kind == "iceberg":
        # A catalog name per target: Spark caches a catalog by name, with the warehouse it first saw.
        return {"iceberg": {"warehouse": str(tmp_path / "wh"), "catalog_name": f"hr_test_{next(_catalogs)}"}}
    if kind in ("ducklake", "ducklake-sqlite"):
        catalog = f"sqlite:{tmp_path / 'meta.sqlite'}" if kind == "ducklake-sqlite" else str(tmp_path / "meta.ducklake")
        return {"ducklake": {"catalog": catalog, "data_path": str(tmp_path / "data")}}
    if kind == "faulty":
        return {"faulty": {"inner": _raw_settings("ducklake", tmp_path)}}
    raise AssertionError(f"target {kind!r} is registered but the contract suite has no settings for it: "
                         "add them to settings_for in tests/targets/conftest.py")


def settings_for(kind: str, tmp_path: Path) -> tuple[str, Any]:
    """(target name, its validated config section) for a kind of ``TARGET_KINDS``, under ``tmp_path``."""
    [(name, raw)] = _raw_settings(kind, tmp_path).items()
    return name, registry.get(name).settings_model.model_validate(raw)


@pytest.fixture(params=TARGET_KINDS)
def target(request: pytest.FixtureRequest, spark: SparkSession, tmp_path: Path) -> Iterator[Target]:
    """A fresh target of each kind, closed afterwards."""
    name, settings = settings_for(str(request.param), tmp_path)
    opened = registry.open_target(name, spark, settings, "p")
    try:
        yield opened
    finally:
        opened.close()


def row_shape(table: TableSchema, batch: bool) -> T.StructType:
    """The Spark schema of ``table``'s snapshot rows, or of its change batches with ``batch``."""
    fields = [T.StructField(c.name, spark_type(c.type)) for c in table.columns]
    fields += [T.StructField("_hr_lsn", T.LongType()), T.StructField("_hr_seq", T.LongType()),
               T.StructField("_hr_commit_ts", T.TimestampType())]
    if batch:
        fields += [T.StructField("_hr_op", T.StringType()), T.StructField("_hr_unchanged", T.StringType())]
    return T.StructType(fields)


def snapshot_df(spark: SparkSession, table: TableSchema, rows: list[tuple[Any, ...]], lsn: int = 100) -> DataFrame:
    """Initial-copy rows (the source columns' values), all at position (``lsn``, 0)."""
    return spark.createDataFrame([(*r, lsn, 0, TS) for r in rows], row_shape(table, batch=False))


def batch_df(spark: SparkSession, table: TableSchema, rows: list[tuple[Any, ...]]) -> DataFrame:
    """A change batch; each row is (op, lsn, seq, unchanged TOAST columns or None, *values)."""
    data = [(*values, lsn, seq, TS, op, unchanged) for op, lsn, seq, unchanged, *values in rows]
    return spark.createDataFrame(data, row_shape(table, batch=True))


def rows_of(target: Target, table: TableSchema) -> dict[Any, tuple[Any, ...]]:
    """The target's rows by their first column: the source columns, then (_hr_lsn, _hr_seq)."""
    columns = [quote_spark(c) for c in table.column_names] + ["_hr_lsn", "_hr_seq"]
    return {r[0]: tuple(r) for r in target.read_table(table).select(*columns).collect()}


def assert_cursor(target: Target, table: TableSchema, offset: int | None) -> None:
    """The target committed ``offset`` with its data, or keeps no cursor (``stores_cursor``)."""
    assert target.read_cursor(table) == (offset if target.stores_cursor else None)
