"""``apply.consistency: transaction`` through an Iceberg REST catalog: a cut's batches in one
multi-table commit.

The REST protocol's ``POST /v1/{prefix}/transactions/commit`` takes, for several tables, each one's
requirements (the snapshot its change was made from) and updates (the new snapshot), and the catalog
applies all of them or none. Batches applied on the driver (``driver_apply``, ``driver_delta``) commit
through Iceberg's Java API; inside a cut each commits into a ``Transaction`` of its table instead
(nothing visible yet), and when the cut ends Iceberg's ``RESTCatalog.commitTransaction`` sends them
all as that one request. A batch that goes to Spark's MERGE (or a keyless table's delta) commits on
its own: that cut is then not whole, and readers read it through the consistent-cut table
(``state.cuts``), which names every table's snapshot at every cut either way. (pyiceberg 0.12 has no
multi-table commit: its ``Transaction`` sends one table's ``CommitTableRequest``; Iceberg's Java client,
which the driver lane commits through, has ``commitTransaction``.)
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pyspark.sql import SparkSession

from headrace.core.interfaces import CutCommit
from headrace.logs import event
from headrace.targets.iceberg.catalog import JavaCatalog, java_table, session_catalog_conf
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



def rest_catalog(spark: SparkSession, settings: IcebergConfig) -> Any:
    """A client of the configured REST catalog (Iceberg's ``RESTCatalog``, py4j) with the settings
    Spark's catalog has, for the multi-table commit, which Spark's catalog does not offer."""
    jvm: Any = spark.sparkContext._jvm
    prefix = f"spark.sql.catalog.{settings.catalog_name}."
    properties = jvm.java.util.HashMap()
    for key, value in session_catalog_conf(spark, settings).items():
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


class CutCommits:
    """One target's cuts: the cut each thread applies (``staged``), and the REST client that commits them."""

    def __init__(self, spark: SparkSession, settings: IcebergConfig) -> None:
        self.spark = spark
        self.settings = settings
        self._local = threading.local()
        self._client: Any = None  # ``rest_catalog``, made at the first cut that commits
        self._java: JavaCatalog | None = None  # for table identifiers
        self._lock = threading.Lock()

    def staged(self) -> StagedCut | None:
        """The cut this thread applies (``cut``), if any."""
        return getattr(self._local, "staged", None)

    def stage(self, name: str, namespace: str, table_name: str, table: Any) -> Any:
        """In a cut: a view of ``table`` (Spark name ``name``) whose commits go into the cut's transaction
        of it; None outside a cut (commits go to the table)."""
        if (staged := self.staged()) is None:
            return None
        with self._lock:
            self._java = self._java or JavaCatalog(self.spark, self.settings.catalog_name)
        return staged.stage(name, self._java.identifier(namespace, table_name), table)

    def alone(self, name: str) -> None:
        """In a cut: the batch of ``name`` commits on its own (Spark's MERGE), not in the cut's commit."""
        if (staged := self.staged()) is not None:
            staged.transactions.pop(name, None)  # staged before it left the driver: nothing in it
            staged.alone.append(name)

    @contextmanager
    def cut(self) -> Iterator[CutCommit]:
        """The block's driver batches staged, then committed together (``commit``) when it ends."""
        staged, outcome = StagedCut(), CutCommit()
        self._local.staged = staged
        try:
            yield outcome
        finally:
            self._local.staged = None
        outcome.whole = not staged.alone
        if staged.transactions:
            with self._lock:
                self._client = self._client or rest_catalog(self.spark, self.settings)
            for name in commit(self.spark, self._client, staged):
                java_table(self.spark, name).refresh()  # Spark's cached table learns of the commit

    def close(self) -> None:
        """Close the REST client, if one was made."""
        if self._client is not None:
            self._client.close()
            self._client = None
