"""``apply.consistency: transaction`` through an Iceberg REST catalog: a cut's batches in one
multi-table commit.

The REST protocol's ``POST /v1/{prefix}/transactions/commit`` takes, for several tables, each one's
requirements (the snapshot its change was made from) and updates (the new snapshot), and the catalog
applies all of them or none. Batches applied on the driver (``driver_apply``, ``driver_delta``) commit
through Iceberg's Java API; inside a cut each commits into a ``Transaction`` of its table instead
(nothing visible yet), and when the cut ends Iceberg's ``RESTCatalog.commitTransaction`` sends them
all as that one request. A batch that goes to Spark's MERGE (or a keyless table's delta) commits on
its own: that cut is then not whole, and readers read it through the consistent-cut table
(``state.cuts``), which names every table's snapshot at every cut either way.
"""

from __future__ import annotations

import logging
from typing import Any

from pyspark.sql import SparkSession

from headrace.logs import event
from headrace.targets.iceberg.catalog import spark_catalog_conf
from headrace.targets.iceberg.config import IcebergConfig

log = logging.getLogger("headrace.targets.iceberg")


class StagedCut:
    """The batches of one cut applied on this thread: each table's ``Transaction`` (py4j), and the
    tables whose batch committed alone (a MERGE)."""

    def __init__(self) -> None:
        self.transactions: dict[str, tuple[Any, Any]] = {}  # Spark name -> (TableIdentifier, Transaction)
        self.alone: list[str] = []

    def stage(self, name: str, identifier: Any, table: Any) -> Any:
        """A view of ``table`` whose commits go into the cut's transaction of it, not to the catalog."""
        transaction = table.newTransaction()
        self.transactions[name] = (identifier, transaction)
        return transaction.table()

    def unstage(self, name: str) -> None:
        """``name``'s batch left the driver before writing anything: it commits alone (``alone``)."""
        self.transactions.pop(name, None)
        self.alone.append(name)


def rest_catalog(spark: SparkSession, settings: IcebergConfig) -> Any:
    """A client of the configured REST catalog (Iceberg's ``RESTCatalog``, py4j) with the settings
    Spark's catalog has, for the multi-table commit, which Spark's catalog does not offer."""
    jvm: Any = spark.sparkContext._jvm
    prefix = f"spark.sql.catalog.{settings.catalog_name}."
    properties = jvm.java.util.HashMap()
    for key, value in spark_catalog_conf(settings).items():
        if key.startswith(prefix) and key != f"{prefix}type":
            properties.put(key.removeprefix(prefix), value)
    catalog = jvm.org.apache.iceberg.rest.RESTCatalog()
    catalog.setConf(spark.sparkContext._jsc.hadoopConfiguration())
    catalog.initialize(f"{settings.catalog_name}-cuts", properties)
    return catalog


def commit(spark: SparkSession, catalog: Any, staged: StagedCut) -> list[str]:
    """Commit every staged transaction that changed its table in one multi-table commit; the Spark
    names of the tables it changed. A failed requirement (another commit to one of the tables since:
    a compaction) fails it whole (``CommitFailedException``), and the cut is applied again."""
    jvm: Any = spark.sparkContext._jvm
    commits = jvm.java.util.ArrayList()
    changed = []
    for name, (identifier, transaction) in staged.transactions.items():
        table_commit = jvm.org.apache.iceberg.catalog.TableCommit.create(
            identifier, transaction.startMetadata(), transaction.currentMetadata())
        if not table_commit.updates().isEmpty():  # a replayed batch commits nothing
            commits.add(table_commit)
            changed.append(name)
    if changed:
        catalog.commitTransaction(commits)
        event(log, "iceberg.cut_commit", logging.DEBUG, tables=len(changed), alone=len(staged.alone))
    return changed
