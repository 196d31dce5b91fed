"""Table maintenance on both targets: compaction after many small batches, and beside a running apply."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pytest
import yaml

from headrace import cli
from headrace.config import PipelineConfig, parse_config
from headrace.control.status import format_status, pipeline_status
from headrace.pipeline import Pipeline
from headrace.run.maintenance import maintain_table
from headrace.source.postgres.throwaway import ThrowawayPostgres
from headrace.state.maintenance import MaintenanceStore
from headrace.state.store import StateStore, TableRow
from headrace.targets.registry import open_target
from tests.e2e.helpers import (
    Target,
    assert_same,
    capture_while,
    make_config,
    raw_config,
    running,
    source_rows,
    target_rows,
    wait_until,
)
from tests.e2e.test_catalogs import jdbc_target
from tests.e2e.test_pipeline import run_caught_up
from tests.targets.test_faulty import change, faulty, row, running_faulty, tables

TARGETS = ["iceberg", "ducklake"]
KEEP_LAST = 2
BATCHES = 15  # small batches before the pass: each one a commit with its own files
# Snapshots expire as soon as they are not among the newest KEEP_LAST: every pass can be checked.
MAINTENANCE = {"retention_hours": 0, "keep_last": KEEP_LAST}


def _raw(dsn: str, tmp: Path, target: Target, **maintenance: object) -> dict[str, Any]:
    # One staged file per apply batch: every flush becomes its own batch, commit and snapshot.
    return raw_config(dsn, tmp, ["public.churn"], target=target, apply={"max_batch_files": 1},
                      maintenance={**MAINTENANCE, **maintenance})


def _config(dsn: str, tmp: Path, target: str, **maintenance: object) -> PipelineConfig:
    return parse_config(_raw(dsn, tmp, target, **maintenance))


def _tables(dsn: str, config: PipelineConfig) -> list[TableRow]:
    state = StateStore(dsn, config.name)
    try:
        return state.tables()
    except psycopg.errors.UndefinedTable:  # the run has not installed its state tables yet
        return []
    finally:
        state.close()


def _create(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS churn; CREATE TABLE churn (id int PRIMARY KEY, v int, pad text);"
                     "INSERT INTO churn SELECT g, 0, repeat('p', 100) FROM generate_series(1, 300) g")


# Iceberg through its JDBC catalog here (the production catalog; the Hadoop catalog is maintained by
# the run's schedule in the test below), DuckLake on its DuckDB-file catalog: with data inlining off
# (every small batch its own files, as batches over ``inline_rows`` are) and at the default (the small
# batches' rows in the catalog, written out by the pass).
@pytest.mark.parametrize("target_kind", ["iceberg-jdbc", "ducklake", "ducklake-inlined"])
def test_maintain_command_after_small_batches_compacts_and_expires(
        source_dsn: str, tmp_path: Path, target_kind: str, spark: Any, capsys: pytest.CaptureFixture[str],
        pg_server: ThrowawayPostgres) -> None:
    _create(source_dsn)
    target: Target = jdbc_target(pg_server, tmp_path) if target_kind == "iceberg-jdbc" else "ducklake"
    if isinstance(target, dict):  # merge-on-read (as a large table is): the delete files a pass applies away
        target["iceberg"]["copy_on_write_below_rows"] = 0
    raw = _raw(source_dsn, tmp_path, target, enabled=False)
    inlined = target_kind == "ducklake-inlined"
    if target_kind == "ducklake":
        raw["target"]["ducklake"]["inline_rows"] = 0
    config = parse_config(raw)
    run_caught_up(Pipeline(config))
    updates = [f"UPDATE churn SET v = v + 1 WHERE id % 30 = {i}; DELETE FROM churn WHERE id = {i + 1};"
               f" INSERT INTO churn VALUES ({1000 + i}, {i}, 'new')" for i in range(BATCHES)]
    capture_while(config, source_dsn, updates, pause=0.35)  # > flush_seconds: one staged file each
    pipeline = Pipeline(config)
    run_caught_up(pipeline)  # closes its target: the lake is free for the command below
    (row,) = _tables(source_dsn, config)
    target = open_target(config.target.kind, spark, config.target.settings, config.name)
    before = target.table_files(row.schema)
    target.close()
    assert before is not None and before.snapshots > KEEP_LAST
    if inlined:  # the copy is one Parquet file (a copy never inlines); every batch's rows and deletes are in the catalog
        assert (before.data_files, before.delete_files) == (1, 0)
        assert _inlined_rows(tmp_path, "churn") > 0
    else:
        assert before.delete_files > 0
    config_file = tmp_path / "pipeline.yaml"
    # The same Spark catalog name as the pipeline's: the command runs in this process, and Spark caches
    # Iceberg tables per catalog; another name would leave the pipeline's catalog reading a snapshot
    # this test's zero retention expires.
    config_file.write_text(yaml.safe_dump(raw))

    assert cli.main(["maintain", "-c", str(config_file), "public.churn"]) == 0

    assert "public.churn: data_files=" in capsys.readouterr().out
    shown = next(t for t in pipeline_status(config)["tables"] if t["table"] == "public.churn")["maintenance"]
    assert shown["last_run_at"] and shown["last_error"] is None
    assert shown["delete_files"] == 0
    assert shown["data_files"] < before.data_files or shown["data_files"] == 1, (before, shown)
    if inlined:  # the pass wrote the inlined rows out: no row left in the catalog's inlined tables
        assert _inlined_rows(tmp_path, "churn") == 0
    assert shown["snapshots"] <= KEEP_LAST, (before, shown)
    assert "maintained=20" in format_status(pipeline_status(config))
    assert_same(pipeline, source_dsn, "public.churn")
    pipeline.target.close()


def _inlined_rows(tmp: Path, table: str) -> int:
    """Live rows of ``table`` in the lake's inlined data tables (its DuckDB-file catalog, read directly)."""
    con = duckdb.connect(str(tmp / "lake" / "meta.ducklake"), read_only=True)
    try:
        (table_id,) = con.execute("SELECT table_id FROM ducklake_table WHERE table_name = ? AND end_snapshot IS NULL",
                                  [table]).fetchone() or (None,)
        names = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE regexp_matches(table_name,"
                                           " ?)", [f"^ducklake_inlined_data_{table_id}_[0-9]+$"]).fetchall()]
        return sum(int(con.execute(f'SELECT count(*) FROM "{n}" WHERE end_snapshot IS NULL').fetchone()[0])  # type: ignore[index]
                   for n in names)
    finally:
        con.close()


@pytest.mark.parametrize("target", TARGETS)
def test_maintenance_beside_apply_loses_nothing(source_dsn: str, tmp_path: Path, target: str) -> None:
    _create(source_dsn)
    # The run's own schedule maintains after every batch; a second thread maintains at the same
    # time, so its commits race the apply's (Iceberg: optimistic commits; DuckLake: the lock).
    config = _config(source_dsn, tmp_path, target, every_minutes=0.001, after_batches=1)
    pipeline = Pipeline(config)
    writes_done = threading.Event()
    passes: list[object] = []

    def maintain_meanwhile() -> None:
        store = MaintenanceStore(source_dsn, config.name)
        try:
            while not writes_done.is_set():
                rows = [r for r in _tables(source_dsn, config) if r.state.applies_changes]
                for row in rows:
                    passes.append(maintain_table(pipeline.target, store, row, config.maintenance.policy()))
                writes_done.wait(0.2)
        finally:
            store.close()

    with running(pipeline):
        wait_until(lambda: any(r.state.applies_changes for r in _tables(source_dsn, config)),
                   120, "the table was not copied")
        maintainer = threading.Thread(target=maintain_meanwhile, name="maintainer")
        maintainer.start()
        try:
            with psycopg.connect(source_dsn, autocommit=True) as conn:
                for i in range(20):
                    conn.execute(f"UPDATE churn SET v = v + 1 WHERE id % 20 = {i}")
                    conn.execute(f"DELETE FROM churn WHERE id = {200 + i}")
                    conn.execute(f"INSERT INTO churn VALUES ({2000 + i}, {i}, 'x')")
                    writes_done.wait(0.3)
            wait_until(lambda: assert_same(pipeline, source_dsn, "public.churn"), 180, "target != source")
        finally:
            writes_done.set()
            maintainer.join(120)
        assert passes, "the maintainer never ran"
        assert_same(pipeline, source_dsn, "public.churn")
        exposed = pipeline.metrics.exposition().decode()
        for metric in ("headrace_maintenance_last_run_timestamp_seconds", "headrace_target_data_files",
                       "headrace_target_delete_files", "headrace_target_snapshots", "headrace_target_bytes"):
            assert f'{metric}{{table="public.churn"}}' in exposed, metric


def test_a_long_pass_leaves_the_other_tables_applying(source_dsn: str, tmp_path: Path, spark: Any) -> None:
    # The pass over public.slow is held inside the target's maintain call until the test releases
    # it: while it is held, public.fast's changes must reach the target, and public.slow's wait.
    tables(source_dsn, "slow", "fast")
    config = make_config(source_dsn, tmp_path, ["public.slow", "public.fast"],
                         faulty(tmp_path, {"fail_on": "maintain", "table": "public.slow", "error": "hold"}),
                         maintenance={**MAINTENANCE, "every_minutes": 0.001, "after_batches": 1})
    with running_faulty(config, spark) as (pipeline, state, target):
        change(source_dsn, "slow")  # one batch makes public.slow due
        wait_until(lambda: ("maintain", "public.slow") in target.injected, 120, "public.slow's pass never began")
        with psycopg.connect(source_dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO fast VALUES (500, 'during the pass'); INSERT INTO slow VALUES (500, 'waits')")
        wait_until(lambda: assert_same(pipeline, source_dsn, "public.fast") == 21, 120,
                   "public.fast did not apply during public.slow's pass")
        assert pipeline.maintenance.busy(row(state, "public.slow").oid), "the pass ended early"
        schema, _ = source_rows(source_dsn, "public.slow")
        assert len(target_rows(pipeline, schema)) == 21, "public.slow applied during its own pass"
        target.release()
        wait_until(lambda: assert_same(pipeline, source_dsn, "public.slow") == 22, 120,
                   "public.slow did not apply after its pass")
