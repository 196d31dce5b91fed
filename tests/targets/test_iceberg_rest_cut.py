"""``IcebergTarget.cut`` through a REST catalog (``targets/iceberg/cut_commit``): batches applied on the
driver inside the block are invisible until it ends, then visible in every table at once (one
``transactions/commit`` to the test server); a batch that goes to Spark's MERGE commits on its own and
the block says the cut was not whole. Read back by pyiceberg's RestCatalog, not ours."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import pytest
from pyspark.sql import SparkSession

from headrace.storage.spark_conf import apply_hadoop_conf
from headrace.targets.ducklake.files import to_arrow
from headrace.targets.iceberg.config import IcebergConfig
from headrace.targets.iceberg.target import IcebergTarget
from tests.e2e.test_object_storage import _dbs, pyiceberg_s3
from tests.objectstore import MotoServer
from tests.targets.conftest import batch_df, snapshot_df
from tests.targets.test_contract import SNAPSHOT, TABLE


def test_a_cut_commits_its_driver_batches_at_once_and_says_when_a_merge_committed_alone(
        spark: SparkSession, s3_server: MotoServer, s3_bucket: str, rest_catalog: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from pyiceberg.catalog.rest import RestCatalog

    from tests.restcatalog import TOKEN

    monkeypatch.setenv("LAKE_TOKEN", TOKEN)
    apply_hadoop_conf(spark)  # Spark's writes (the copies, the MERGE) reach the moto server (s3_bucket's settings)
    namespace = f"cut{os.getpid()}_{next(_dbs)}"
    settings = IcebergConfig.model_validate(
        {"warehouse": rest_catalog.warehouse, "catalog_name": f"hrcut{next(_dbs)}", "namespace": namespace,
         "catalog": {"type": "rest", "uri": rest_catalog.uri, "token_env": "LAKE_TOKEN"}})
    target = IcebergTarget(spark, settings, pipeline="p")
    assert target.commits_across_tables
    twin = replace(TABLE, oid=TABLE.oid + 1, name="orders_twin")
    reader = RestCatalog("reader", uri=rest_catalog.uri, token=TOKEN, **pyiceberg_s3(s3_server))

    def value(table: Any, key: int) -> tuple[Any, ...]:
        rows = reader.load_table((namespace, table.name)).scan(row_filter=f"id = {key}").to_arrow().to_pylist()
        assert len(rows) == 1, rows
        return rows[0]["odd name, `quoted`"], rows[0]["_hr_lsn"]

    def current() -> list[int | None]:
        snapshots = [reader.load_table((namespace, t.name)).current_snapshot() for t in (TABLE, twin)]
        return [None if s is None else s.snapshot_id for s in snapshots]

    try:
        for table in (TABLE, twin):
            target.write_snapshot_arrow(table, to_arrow(snapshot_df(spark, table, SNAPSHOT)))  # no Spark job
        before = current()
        rows = [("U", 200, 0, None, 1, "one", None, None, "d1"), ("I", 200, 1, None, 9, "nine", None, None, "d9")]
        with target.cut([TABLE, twin], {TABLE.oid, twin.oid}) as commit:
            for table in (TABLE, twin):
                target.apply_arrow_batch(table, to_arrow(batch_df(spark, table, rows)), None, 1)
            assert current() == before  # staged: nothing visible yet
        assert commit.whole
        after = current()
        assert all(a != b for a, b in zip(after, before, strict=True))  # both tables, in one commit
        assert value(TABLE, 9) == value(twin, 9) == ("nine", 200)
        assert target.snapshot_at(TABLE)[1] == after[0]  # Spark's cached table follows the commit
        rows = [("U", 300, 0, None, 9, "nine again", None, None, "d9")]
        with target.cut([TABLE, twin], {TABLE.oid, twin.oid}) as commit:
            target.apply_arrow_batch(TABLE, to_arrow(batch_df(spark, TABLE, rows)), None, 2)
            target.apply_batch(twin, batch_df(spark, twin, rows), None, 2)  # Spark's MERGE: commits alone
        assert not commit.whole
        assert value(TABLE, 9) == value(twin, 9) == ("nine again", 300)
    finally:
        target.close()


def test_a_cut_refused_for_a_conflicting_commit_changes_no_table_and_applies_again_whole(
        spark: SparkSession, s3_server: MotoServer, s3_bucket: str, rest_catalog: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Another writer commits to one table of a cut while its batches are staged: the multi-table commit
    is refused (409, the snapshot it was made from is not the table's any more), neither table shows
    any of the cut, and the same batches applied again in a new cut land whole, once."""
    from py4j.protocol import Py4JJavaError
    from pyiceberg.catalog.rest import RestCatalog

    from headrace.materialize.error_boundary import classify
    from headrace.targets.iceberg.catalog import JavaCatalog
    from headrace.targets.iceberg.cut_commit import rest_catalog as java_rest_catalog
    from tests.restcatalog import TOKEN

    monkeypatch.setenv("LAKE_TOKEN", TOKEN)
    apply_hadoop_conf(spark)
    namespace = f"cutx{os.getpid()}_{next(_dbs)}"
    settings = IcebergConfig.model_validate(
        {"warehouse": rest_catalog.warehouse, "catalog_name": f"hrcutx{next(_dbs)}", "namespace": namespace,
         "catalog": {"type": "rest", "uri": rest_catalog.uri, "token_env": "LAKE_TOKEN"}})
    target = IcebergTarget(spark, settings, pipeline="p")
    twin = replace(TABLE, oid=TABLE.oid + 1, name="orders_twin")
    reader = RestCatalog("reader", uri=rest_catalog.uri, token=TOKEN, **pyiceberg_s3(s3_server))
    other = java_rest_catalog(spark, settings)  # another writer, through the catalog

    def state(table: Any) -> tuple[int, int]:
        """The table's current snapshot id and row count (its summary: no data file read)."""
        snapshot = reader.load_table((namespace, table.name)).current_snapshot()
        assert snapshot is not None
        return snapshot.snapshot_id, int(snapshot.summary["total-records"] or 0)

    def value(table: Any, key: int) -> tuple[Any, ...]:
        rows = reader.load_table((namespace, table.name)).scan(row_filter=f"id = {key}").to_arrow().to_pylist()
        assert len(rows) == 1, rows
        return rows[0]["odd name, `quoted`"], rows[0]["_hr_lsn"]

    try:
        for table in (TABLE, twin):
            target.write_snapshot_arrow(table, to_arrow(snapshot_df(spark, table, SNAPSHOT)))
        before = [state(TABLE), state(twin)]
        rows = [("U", 200, 0, None, 1, "one", None, None, "d1"), ("I", 200, 1, None, 9, "nine", None, None, "d9")]
        identifier = JavaCatalog(spark, settings.catalog_name).identifier(namespace, TABLE.name)
        with pytest.raises(Py4JJavaError) as refused, target.cut([TABLE, twin], {TABLE.oid, twin.oid}):
            for table in (TABLE, twin):
                target.apply_arrow_batch(table, to_arrow(batch_df(spark, table, rows)), None, 1)
            other.loadTable(identifier).newAppend().commit()  # a snapshot of no files: main moved on
        failure = classify(refused.value, TABLE.qualified_name)
        assert failure.kind == "transient", failure  # applied again by the run (run.cuts.CutRetries)
        assert "CommitFailedException" in failure.message and "\n" not in failure.message, failure.message
        refused_at = [state(TABLE), state(twin)]
        assert refused_at[1] == before[1]  # the twin shows none of the cut
        assert refused_at[0][1] == before[0][1]  # the table only the other writer's snapshot of no rows
        with target.cut([TABLE, twin], {TABLE.oid, twin.oid}) as commit:  # the run applies the cut again
            for table in (TABLE, twin):
                target.apply_arrow_batch(table, to_arrow(batch_df(spark, table, rows)), None, 1)
        assert commit.whole
        assert [n for _, n in (state(TABLE), state(twin))] == [n + 1 for _, n in before]  # the insert, once
        assert value(TABLE, 9) == value(twin, 9) == ("nine", 200)
    finally:
        other.close()
        target.close()
