"""What only IcebergTarget has: its table names and its catalog bound to one warehouse.

What every target does (snapshot, changes, TOAST, replays, truncates, composite keys, keyless
tables) is in test_contract.py.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from headrace.core.errors import ConfigError
from headrace.targets.iceberg.config import IcebergConfig
from headrace.targets.iceberg.target import IcebergTarget
from tests.targets.test_contract import TABLE

_catalogs = itertools.count()


@pytest.fixture
def target(spark: SparkSession, tmp_path: Path) -> IcebergTarget:
    """An Iceberg target (in place of the contract suite's, parametrised over kinds)."""
    # A catalog per test: Spark caches a catalog by name, with the warehouse it first saw.
    settings = IcebergConfig(warehouse=str(tmp_path / "wh"), catalog_name=f"hr_ice_{next(_catalogs)}")
    return IcebergTarget(spark, settings, pipeline="p")


def test_table_names_are_quoted_in_the_catalog(spark: SparkSession, target: IcebergTarget) -> None:
    name = target.ensure_table(TABLE)
    assert name == "`" + target.settings.catalog_name + "`.`public`.`orders`" == target.table_name(TABLE)
    target.drop_table(TABLE)
    assert not spark.catalog.tableExists(name)


def test_catalog_name_cannot_switch_warehouse(
    spark: SparkSession, target: IcebergTarget, tmp_path: Path
) -> None:
    other = IcebergConfig(warehouse=str(tmp_path / "other"), catalog_name=target.settings.catalog_name)
    with pytest.raises(ConfigError, match="catalog_name"):
        IcebergTarget(spark, other, pipeline="p")
    IcebergTarget(spark, target.settings, pipeline="p")  # the same warehouse again is fine
