"""Tables that come and go: discovery by schema, refused tables, drops, drop + re-create, and status.

One pipeline run per target: DuckLake keeps a dropped table's target (the default), Iceberg drops it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from headrace.config import PipelineConfig
from headrace.control.status import format_status, pipeline_status
from headrace.core.errors import ConfigError
from headrace.pipeline import Pipeline
from headrace.state.store import StateStore
from tests.e2e.helpers import assert_same, make_config, source_rows, target_rows


@contextmanager
def running(pipeline: Pipeline) -> Iterator[Callable[[], None]]:
    """The pipeline running in a thread; yields a check that re-raises its failure."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            pipeline.run(stop=stop)
        except BaseException as exc:  # surfaced by the check and at exit
            errors.append(exc)

    thread = threading.Thread(target=run, name="pipeline", daemon=True)
    thread.start()

    def check() -> None:
        if errors:
            raise errors[0]
        assert thread.is_alive(), "the pipeline stopped"

    try:
        yield check
    finally:
        stop.set()
        thread.join(120)
    assert not thread.is_alive(), "the pipeline did not stop"
    if errors:
        raise errors[0]


def wait_for(what: str, predicate: Callable[[], bool], check: Callable[[], None], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        check()
        if predicate():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def caught_up(config: PipelineConfig, dsn: str) -> Callable[[], bool]:
    """Everything committed so far is captured and every tracked table streams with nothing pending."""
    with psycopg.connect(dsn) as conn:
        lsn = conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()[0]  # type: ignore[index]

    def done() -> bool:
        state = StateStore(dsn, config.name)
        try:
            if not state.installed() or state.meta() is None:
                return False  # the pipeline is still setting up
            pending = state.log_index.pending_changes()
            return state.captured_lsn() >= lsn and all(
                r.state.value == "STREAMING" and not pending.get(r.oid) for r in state.tables())
        finally:
            state.close()
    return done


def tracked(config: PipelineConfig, dsn: str) -> dict[str, int]:
    state = StateStore(dsn, config.name)
    try:
        return {r.qualified_name: r.oid for r in state.tables()}
    finally:
        state.close()


def test_source_names_tables_exactly_one_way(tmp_path: Path) -> None:
    dsn = "postgresql://x@127.0.0.1/x"
    assert make_config(dsn, tmp_path, [], source={"schemas": ["public"]}).source.discovers
    assert make_config(dsn, tmp_path, [], source={"all_tables": True}).source.discovers
    assert not make_config(dsn, tmp_path, ["a"]).source.discovers
    with pytest.raises(ConfigError, match="exactly one way.*got tables and schemas"):
        make_config(dsn, tmp_path, ["a"], source={"schemas": ["public"]})
    with pytest.raises(ConfigError, match="exactly one way.*got none"):
        make_config(dsn, tmp_path, [])


@pytest.mark.parametrize("target,drop_policy,reshape", [("ducklake", "keep", False), ("iceberg", "drop", True)])
def test_tables_come_and_go(source_dsn: str, tmp_path: Path, spark: Any, target: str, drop_policy: str,
                            reshape: bool) -> None:
    def sql(statement: str) -> None:
        with psycopg.connect(source_dsn, autocommit=True) as conn:
            conn.execute(statement)

    sql("""
        CREATE TABLE stays (id int PRIMARY KEY, v int);
        CREATE TABLE doomed (id int PRIMARY KEY, v int);
        CREATE TABLE reborn (id int PRIMARY KEY, v int);
        CREATE TABLE keyless (a int, b text);
        CREATE SCHEMA other; CREATE TABLE other.ignored (id int PRIMARY KEY);
        INSERT INTO stays SELECT g, g FROM generate_series(1, 10) g;
        INSERT INTO doomed SELECT g, g FROM generate_series(1, 10) g;
        INSERT INTO reborn SELECT g, g FROM generate_series(1, 10) g;
    """)
    config = make_config(source_dsn, tmp_path, [], target, source={"schemas": ["public"], "discovery_seconds": 0.5},
                         schema_changes={"drop_table": drop_policy}, api={"listen": "127.0.0.1:0"})
    pipeline = Pipeline(config, spark=spark)
    with running(pipeline) as check:
        wait_for("the initial copies", caught_up(config, source_dsn), check)
        first = tracked(config, source_dsn)
        assert set(first) == {"public.stays", "public.doomed", "public.reborn"}  # keyless refused, other skipped

        # A new table whose first changes commit before headrace can notice it; a dropped table
        # with changes just before its drop; a table dropped and created again (same name).
        sql("CREATE TABLE fresh (id int PRIMARY KEY, v text);"
            "INSERT INTO fresh SELECT g, 'early' FROM generate_series(1, 5) g")
        sql("UPDATE doomed SET v = v + 100 WHERE id <= 5; DELETE FROM doomed WHERE id = 10")
        sql("UPDATE stays SET v = -v WHERE id <= 3")
        sql("UPDATE reborn SET v = 999")  # the old table's last changes: must not land on the new copy
        sql("DROP TABLE doomed")
        sql("DROP TABLE reborn;" + ("CREATE TABLE reborn (id int PRIMARY KEY, label text, v bigint);"
                                    "INSERT INTO reborn VALUES (1, 'one', 1), (2, 'two', 2)" if reshape else
                                    "CREATE TABLE reborn (id int PRIMARY KEY, v int);"
                                    "INSERT INTO reborn VALUES (1, 1), (2, 2)"))
        sql("INSERT INTO fresh VALUES (6, 'racing')")
        wait_for("create, drop and recreate to be handled",
                 lambda: set(tracked(config, source_dsn)) == {"public.stays", "public.fresh", "public.reborn"}
                 and tracked(config, source_dsn)["public.reborn"] != first["public.reborn"], check)
        # Changes once the new tables stream.
        sql("INSERT INTO fresh VALUES (7, 'late'); UPDATE fresh SET v = 'changed' WHERE id = 1;"
            "INSERT INTO reborn (id, v) VALUES (3, 3); UPDATE reborn SET v = 20 WHERE id = 2")
        wait_for("everything applied", caught_up(config, source_dsn), check)

        status = pipeline_status(config)
        assert status["ddl"]["counts"] == {"create_table": 1, "drop_table": 1, "recreate_table": 1}
        kinds = {(e["table"], e["kind"]) for e in status["ddl"]["recent"]}
        assert kinds == {("public.fresh", "create_table"), ("public.doomed", "drop_table"),
                         ("public.reborn", "recreate_table")}
        (refused,) = status["refused_tables"]
        assert refused["table"] == "public.keyless" and "no primary key" in refused["reason"]
        text = format_status(status)
        assert "refused public.keyless" in text and "drop_table=1" in text and "recreate_table" in text
        metrics = pipeline.metrics.exposition().decode()
        for kind in ("create_table", "drop_table", "recreate_table"):
            assert f'headrace_ddl_events_total{{kind="{kind}"}} 1.0' in metrics

    assert assert_same(pipeline, source_dsn, "public.stays") == 10
    assert assert_same(pipeline, source_dsn, "public.fresh") == 7
    assert assert_same(pipeline, source_dsn, "public.reborn") == 3
    # The dropped table: its last changes were applied before it left; the target is kept or dropped.
    doomed_schema, _ = source_rows(source_dsn, "public.stays")  # same shape as doomed was
    with psycopg.connect(source_dsn) as conn:
        doomed_state = conn.execute("SELECT count(*) FROM _headrace.tables WHERE table_name = 'doomed'").fetchone()
    assert doomed_state == (0,)
    from dataclasses import replace

    doomed = replace(doomed_schema, oid=first["public.doomed"], name="doomed")
    if drop_policy == "keep":
        expected = sorted([(i, i + 100) for i in range(1, 6)] + [(i, i) for i in range(6, 10)], key=repr)
        assert target_rows(pipeline, doomed) == expected
    else:
        with pytest.raises(Exception):  # noqa: B017 - each target says "no such table" its own way
            target_rows(pipeline, doomed)
    pipeline.target.close()


def test_recreated_table_resyncs_at_start_up(source_dsn: str, tmp_path: Path) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, v int)")
    config = make_config(source_dsn, tmp_path, ["public.items"], target="ducklake")
    Pipeline(config).setup().close()
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE items; CREATE TABLE items (id int PRIMARY KEY, v int)")
        new_oid = conn.execute("SELECT 'items'::regclass::oid::int8").fetchone()[0]  # type: ignore[index]
    state = Pipeline(config).setup()  # the default policy, resync: no refusal
    try:
        (row,) = state.tables()
        assert (row.oid, row.state.value) == (new_oid, "PENDING")
        assert state.ddl_counts() == {"recreate_table": 1}
    finally:
        state.close()


def test_all_tables_publishes_what_it_can(source_dsn: str, tmp_path: Path) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("""
            CREATE TABLE a (id int PRIMARY KEY);
            CREATE SCHEMA other; CREATE TABLE other.b (id int PRIMARY KEY);
            CREATE TABLE nokey (x int);
            CREATE TABLE p (id int, k int, PRIMARY KEY (id, k)) PARTITION BY RANGE (k);
            CREATE TABLE p1 PARTITION OF p FOR VALUES FROM (0) TO (10);
        """)
    config = make_config(source_dsn, tmp_path, [], "ducklake", source={"all_tables": True})
    state = Pipeline(config).setup()
    try:
        assert {r.qualified_name for r in state.tables()} == {"public.a", "other.b", "public.p"}
        (refused,) = state.refused_tables()
        assert refused["table"] == "public.nokey" and "REPLICA IDENTITY" in refused["reason"]
    finally:
        state.close()
    with psycopg.connect(source_dsn) as conn:
        published = {r[0] for r in conn.execute(
            "SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = %s",
            (config.publication_name,)).fetchall()}
        via_root = conn.execute("SELECT pubviaroot FROM pg_publication WHERE pubname = %s",
                                (config.publication_name,)).fetchone()
    # Only what headrace replicates: publishing nokey would make its UPDATEs and DELETEs fail.
    assert published == {"public.a", "other.b", "public.p"} and via_root == (True,)
