"""Schema changes replicate in order with the data, on both targets; what cannot, stops one table loudly."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

from headrace.pipeline import Pipeline
from headrace.state.lifecycle import BACKOFF_BASE_SECONDS, TableState
from headrace.state.store import StateStore, TableRow
from tests.e2e.helpers import make_config, running, source_rows, target_rows, wait_until

SETUP = """
CREATE TABLE items (id int PRIMARY KEY, v int NOT NULL, n numeric(10,2), s varchar(20), r text, d text);
INSERT INTO items SELECT g, g, g / 4.0, 's' || g, 'r' || g, 'd' || g FROM generate_series(1, 40) g;
CREATE TABLE other (id int PRIMARY KEY, note text);
"""


def _same(pipeline: Pipeline, dsn: str, table: str, target_as: tuple[str, str] | None = None) -> bool:
    schema, expected = source_rows(dsn, table)
    try:
        actual = target_rows(pipeline, replace(schema, target_as=target_as))
    except Exception as exc:  # not there yet (still copying): polled again
        raise AssertionError(f"{table}: cannot read the target: {exc}") from exc
    assert actual == expected, f"{table}: target differs: {len(actual)} rows vs {len(expected)}"
    return True


def _table_row(pipeline: Pipeline, table: str) -> TableRow:
    state = StateStore(pipeline.state_dsn, pipeline.config.name)
    try:
        return next(r for r in state.tables() if r.qualified_name == table)
    finally:
        state.close()


class Updater(threading.Thread):
    """Keeps updating the same rows (and inserting new ones) while DDL runs in the test's thread."""

    def __init__(self, dsn: str) -> None:
        super().__init__(name="updater", daemon=True)
        self.dsn = dsn
        self.table = "items"
        self.stop = threading.Event()
        self.done = 0

    def run(self) -> None:
        next_id = 1000
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                try:
                    conn.execute(f"UPDATE {self.table} SET v = v + 1 WHERE id <= 5")
                    conn.execute(f"INSERT INTO {self.table} (id, v) VALUES (%s, %s)", (next_id, next_id))
                    next_id += 1
                    self.done += 1
                except psycopg.errors.UndefinedTable:
                    self.table = "items_renamed" if self.table == "items" else "items"
                self.stop.wait(0.02)


@pytest.mark.parametrize("target", ["iceberg", "ducklake"])
def test_alters_in_the_middle_of_updates_land_in_order(source_dsn: str, tmp_path: Path, spark: Any,
                                                        target: str) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute(SETUP)
    config = make_config(source_dsn, tmp_path, ["public.items", "public.other"], target)
    pipeline = Pipeline(config, spark=spark)
    updater = Updater(source_dsn)
    with running(pipeline):
        wait_until(lambda: _same(pipeline, source_dsn, "public.items"), 120, "initial copy")
        updater.start()
        alters = [
            "ALTER TABLE items ADD COLUMN c1 int",
            "ALTER TABLE items ADD COLUMN c2 text DEFAULT 'dflt'",
            "ALTER TABLE items ALTER COLUMN v TYPE bigint",
            "ALTER TABLE items ALTER COLUMN n TYPE numeric(14,2)",
            "ALTER TABLE items ALTER COLUMN s TYPE text",
            "ALTER TABLE items RENAME COLUMN r TO r2",
            "ALTER TABLE items DROP COLUMN d",
            "ALTER TABLE items RENAME TO items_renamed",
        ]
        state = StateStore(source_dsn, config.name)
        with psycopg.connect(source_dsn, autocommit=True) as conn:
            for alter in alters:
                events = sum(state.ddl_counts().values())
                conn.execute(alter)
                start = updater.done
                wait_until(lambda start=start: updater.done >= start + 3, 30, "updates after the ALTER")
                # One ALTER at a time reaches the target: capture reads the catalog for what a
                # RELATION message leaves out (attnum, the added column's value in older rows),
                # and a later table rewrite would erase that value there.
                wait_until(lambda events=events: sum(state.ddl_counts().values()) > events, 60,
                           f"the target follows: {alter}")
            conn.execute("UPDATE items_renamed SET c1 = id, c2 = 'new ' || id, r2 = 'renamed' WHERE id % 3 = 0"
                         " OR id = 40")
            conn.execute("INSERT INTO other VALUES (1, 'still streaming')")
        updater.stop.set()
        updater.join()
        wait_until(lambda: _same(pipeline, source_dsn, "public.items_renamed", ("public", "items")), 180,
                   "target equals source after the ALTERs (target keeps the table's old name)")
        wait_until(lambda: _same(pipeline, source_dsn, "public.other"), 60, "the other table streams")

        # The dropped column stays in the target (policy keep): rows keep the value they had, also
        # when updated later; rows inserted after the drop have NULL.
        kept = dict(target_columns(pipeline, "public", "items", "id", "d"))
        assert kept[40] == "d40" and kept[1000 + updater.done - 1] is None

    try:
        counts = state.ddl_counts()
        row = next(r for r in state.tables() if r.schema.name == "items_renamed")
    finally:
        state.close()
    assert counts == {"add_column": 2, "alter_column_type": 3, "rename_column": 1, "drop_column": 1,
                      "rename_table": 1}, counts
    assert row.schema.target_as == ("public", "items")
    assert row.state is TableState.STREAMING


def target_columns(pipeline: Pipeline, schema: str, table: str, *columns: str) -> list[tuple[Any, ...]]:
    """Columns of the target table as stored, including any the source no longer has."""
    target: Any = pipeline.target
    if pipeline.config.target.kind == "iceberg":
        return [tuple(r) for r in target.spark.table(f"{target.settings.catalog_name}.{schema}.{table}")
                .select(*columns).collect()]
    with target._lock:
        return target._con.execute(f"SELECT {', '.join(columns)} FROM hr_lake.{schema}.{table}").fetchall()


def pipeline_table(pipeline: Pipeline) -> Any:
    state = StateStore(pipeline.state_dsn, pipeline.config.name)
    try:
        return next(r.schema for r in state.tables() if r.schema.name.startswith("items"))
    finally:
        state.close()


@pytest.mark.parametrize("target", ["iceberg", "ducklake"])
def test_a_change_the_target_cannot_follow_errors_that_table_until_resync(
        source_dsn: str, tmp_path: Path, spark: Any, target: str) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute(SETUP)
    # DuckLake also follows renames and drops columns; Iceberg's Hadoop catalog cannot rename.
    policy = {"drop_column": "drop", "rename_table": "follow"} if target == "ducklake" else {}
    config = make_config(source_dsn, tmp_path, ["public.items", "public.other"], target, schema_changes=policy)
    pipeline = Pipeline(config, spark=spark)
    with running(pipeline), psycopg.connect(source_dsn, autocommit=True) as conn:
        wait_until(lambda: _same(pipeline, source_dsn, "public.items"), 120, "initial copy")
        if target == "ducklake":
            conn.execute("ALTER TABLE items DROP COLUMN d")
            conn.execute("ALTER TABLE items RENAME TO items2")
            conn.execute("UPDATE items2 SET v = -v WHERE id = 1")
            wait_until(lambda: _same(pipeline, source_dsn, "public.items2"), 120, "drop and rename followed")
            with pytest.raises(Exception, match="d"):
                target_columns(pipeline, "public", "items2", "d")  # dropped there too (policy drop)
            # A volatile default: PostgreSQL rewrote the rows with values the stream never carries.
            conn.execute("ALTER TABLE items2 ADD COLUMN added_at timestamptz DEFAULT clock_timestamp()")
            conn.execute("UPDATE items2 SET v = 0 WHERE id = 2")
            table, expect = "public.items2", "volatile default"
        else:
            conn.execute("ALTER TABLE items ALTER COLUMN v TYPE text USING 'v' || v")  # not a widening
            conn.execute("UPDATE items SET v = 'x' WHERE id = 2")
            table, expect = "public.items", "changed type from integer to text"
        conn.execute("INSERT INTO other VALUES (7, 'others go on')")

        def errored() -> bool:
            state = StateStore(source_dsn, config.name)
            try:
                row = next(r for r in state.tables() if r.qualified_name == table)
            finally:
                state.close()
            return row.state is TableState.ERRORED and expect in (row.error or "") and "resync" in (row.error or "")
        wait_until(errored, 120, f"{table} goes to ERRORED naming the change and the fix")
        wait_until(lambda: _same(pipeline, source_dsn, "public.other"), 60, "the other table streams")
        # A terminal error waits for the operator: no retry planned, none made over more loop passes
        # than a transient error's first backoff lasts, and status says the command.
        first = _table_row(pipeline, table)
        assert (first.error_kind, first.retry_at) == ("terminal", None), first
        assert first.error_fix is not None and f"headrace resync {table}" in first.error_fix
        passes = pipeline.loop_passes
        wait_until(lambda: pipeline.loop_passes >= passes + 3 * BACKOFF_BASE_SECONDS / 0.1, 120, "loop passes")
        later = _table_row(pipeline, table)
        assert (later.state, later.error_count, later.retry_at) == (TableState.ERRORED, first.error_count, None)
        assert pipeline.metrics.errors.labels(table, "terminal")._value.get() == 1

        done, _ = pipeline.operations.call(pipeline.operations.resync_table(table))
        assert done
        wait_until(lambda: _same(pipeline, source_dsn, table), 180, "resync copies the table in its new shape")
        conn.execute(f"UPDATE {table} SET n = 1 WHERE id = 3")
        wait_until(lambda: _same(pipeline, source_dsn, table), 60, "and streams again")
