"""End to end: MariaDB tables that come, go and get renamed while a pipeline runs (DuckLake).

With ``schemas: [db]`` a table created while running is found by the catalog watch, copied and
streamed, with rows written before, during and after its copy; a table created and dropped at once
and a table of a database not watched are ignored; a tracked table dropped and created again is
copied again in place (``recreated_table: resync``). With ``refuse`` the recreated table waits in
ERRORED until ``headrace resync``, then streams. A restart right after a RENAME TABLE with no row
change in between finds the table under its new name, and a TRUNCATE read first after a restart
reaches the mirror. Each table is compared with the source row by row.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from headrace.pipeline import Pipeline
from headrace.source.mysql.catalog import table_id
from headrace.state.lifecycle import TableState
from tests.e2e.helpers import make_config, running, wait_until
from tests.e2e.test_mysql import _run, shop, state_dsn  # noqa: F401 -- fixtures shared with test_mysql
from tests.e2e.test_mysql_ddl import _same, _state_of, _state_row


def _writer(root: str, table: str, stop: threading.Event, done: list[int]) -> None:
    """Inserts, updates and deletes in ``table``, one change per transaction, until ``stop``."""
    i = 0
    while not stop.wait(0.02) and i < 2000:
        i += 1
        statements = [f"INSERT INTO {table} VALUES ({100 + i}, {i})", f"UPDATE {table} SET v = v + 1 WHERE id = 1"]
        if i % 4 == 0:
            statements.append(f"DELETE FROM {table} WHERE id = {100 + i // 2}")
        _run(root, *statements)
    done.append(i)


def test_mysql_tables_created_and_recreated_while_running(
        mariadb_server: Any, shop: tuple[str, str], state_dsn: str, tmp_path: Path, spark: Any) -> None:  # noqa: F811
    database, root = shop
    other = f"{database}_other"
    mariadb_server.create_database(other)
    try:
        _run(root, "CREATE TABLE items (id INT PRIMARY KEY, v INT)", "INSERT INTO items VALUES (1, 1), (2, 2)")
        config = make_config(mariadb_server.dsn_for(database), tmp_path, [], "ducklake",
                             source={"state_dsn": state_dsn, "schemas": [database], "discovery_seconds": 1.0})
        pipeline = Pipeline(config, spark=spark)
        items, fresh = table_id(database, "items"), table_id(database, "fresh")

        def same(table: str, oid: int) -> int:
            return _same(pipeline, state_dsn, root, database, table, oid)

        with running(pipeline):
            wait_until(lambda: _state_of(state_dsn, items) == TableState.STREAMING, 180, "items to stream")

            # A new table, written from its CREATE on, through its copy and after it.
            _run(root, "CREATE TABLE fresh (id INT PRIMARY KEY, v INT)", "INSERT INTO fresh VALUES (1, 0), (2, 0)")
            stop, done = threading.Event(), []
            writer = threading.Thread(target=_writer, args=(root, "fresh", stop, done))
            writer.start()
            try:
                wait_until(lambda: _state_of(state_dsn, fresh) == TableState.STREAMING, 120, "fresh to stream")
                stop.wait(1.0)  # a little more after the copy
            finally:
                stop.set()
                writer.join()
            assert done and done[0] > 10, done
            wait_until(lambda: same("fresh", fresh) > 2, 60, "fresh equal to the source", every=0.5)

            # Created and dropped at once, or in a database not watched: never tracked.
            _run(root, "CREATE TABLE blip (id INT PRIMARY KEY)", "INSERT INTO blip VALUES (1)", "DROP TABLE blip")
            _run(mariadb_server.root_dsn + other, "CREATE TABLE elsewhere (id INT PRIMARY KEY)",
                 "INSERT INTO elsewhere VALUES (1)")

            # A tracked table dropped and created again (another shape): copied again in place, then streamed.
            _run(root, "DROP TABLE items", "CREATE TABLE items (id INT PRIMARY KEY, v INT, note VARCHAR(20))",
                 "INSERT INTO items VALUES (7, 7, 'new'), (8, 8, NULL)")
            wait_until(lambda: same("items", items) == 2, 120, "the recreated items copied", every=0.5)
            _run(root, "INSERT INTO items VALUES (9, 9, 'after')", "UPDATE items SET note = 'x' WHERE id = 8",
                 "INSERT INTO fresh VALUES (99999, 1)")
            wait_until(lambda: same("items", items) == 3, 60, "the recreated items streaming", every=0.5)
            wait_until(lambda: same("fresh", fresh) > 2, 60, "fresh streaming on", every=0.5)
            assert _state_of(state_dsn, items) == TableState.STREAMING
            assert _state_of(state_dsn, table_id(database, "blip")) is None
            assert _state_of(state_dsn, table_id(other, "elsewhere")) is None
    finally:
        mariadb_server.drop_database(other)


def test_mysql_create_table_in_the_binlog_wakes_the_catalog_watch(
        mariadb_server: Any, shop: tuple[str, str], state_dsn: str, tmp_path: Path, spark: Any) -> None:  # noqa: F811
    """The next timed poll is 10 minutes away: the CREATE TABLE read in the binlog has the new table
    tracked, copied and streamed within seconds."""
    database, root = shop
    _run(root, "CREATE TABLE items (id INT PRIMARY KEY, v INT)", "INSERT INTO items VALUES (1, 1)")
    config = make_config(mariadb_server.dsn_for(database), tmp_path, [], "ducklake",
                         source={"state_dsn": state_dsn, "schemas": [database], "discovery_seconds": 600.0})
    pipeline = Pipeline(config, spark=spark)
    items, fresh = table_id(database, "items"), table_id(database, "fresh")
    with running(pipeline):
        wait_until(lambda: _state_of(state_dsn, items) == TableState.STREAMING, 180, "items to stream")
        _run(root, "CREATE TABLE fresh (id INT PRIMARY KEY, v INT)", "INSERT INTO fresh VALUES (1, 0), (2, 0)")
        wait_until(lambda: _state_of(state_dsn, fresh) == TableState.STREAMING, 60, "fresh to stream")
        _run(root, "INSERT INTO fresh VALUES (3, 3)", "UPDATE fresh SET v = 9 WHERE id = 1")
        wait_until(lambda: _same(pipeline, state_dsn, root, database, "fresh", fresh) == 3, 60,
                   "fresh equal to the source", every=0.5)


def test_mysql_resync_of_a_recreated_table_and_a_restart_after_rename(
        mariadb_server: Any, shop: tuple[str, str], state_dsn: str, tmp_path: Path, spark: Any) -> None:  # noqa: F811
    database, root = shop
    _run(root, "CREATE TABLE items (id INT PRIMARY KEY, v INT)", "INSERT INTO items VALUES (1, 1), (2, 2)",
         "CREATE TABLE gone (id INT PRIMARY KEY, v INT)", "INSERT INTO gone VALUES (1, 10)")
    config = make_config(mariadb_server.dsn_for(database), tmp_path, [f"{database}.items", f"{database}.gone"],
                         "ducklake", source={"state_dsn": state_dsn, "discovery_seconds": 1.0},
                         schema_changes={"recreated_table": "refuse"})
    items, gone = table_id(database, "items"), table_id(database, "gone")
    pipeline = Pipeline(config, spark=spark)

    def same(table: str, oid: int) -> int:
        return _same(pipeline, state_dsn, root, database, table, oid)

    with running(pipeline):
        wait_until(lambda: all(_state_of(state_dsn, o) == TableState.STREAMING for o in (items, gone)),
                   180, "both tables to stream")

        # Dropped and created again, recreated_table: refuse: ERRORED with the fix, until the resync.
        _run(root, "DROP TABLE gone", "CREATE TABLE gone (id INT PRIMARY KEY, v INT)", "INSERT INTO gone VALUES (5, 50)")
        wait_until(lambda: _state_of(state_dsn, gone) == TableState.ERRORED, 60, "the recreated table errored")
        row = _state_row(state_dsn, gone)
        assert f"headrace resync {database}.gone" in row.error, row.error
        _run(root, "INSERT INTO gone VALUES (6, 60)")
        pipeline.operations.call(pipeline.operations.resync_table(f"{database}.gone"))
        wait_until(lambda: same("gone", gone) == 2, 120, "the resync copying the new table", every=0.5)
        _run(root, "INSERT INTO gone VALUES (7, 70)", "UPDATE gone SET v = 0 WHERE id = 5")
        wait_until(lambda: same("gone", gone) == 3, 60, "the new table streaming", every=0.5)
        assert _state_of(state_dsn, gone) == TableState.STREAMING

        # RENAME TABLE and no row change before the stop.
        _run(root, "RENAME TABLE items TO articles")
        wait_until(lambda: pipeline.capture is not None
                   and pipeline.capture.captured_lsn >= _binlog_end(pipeline), 60, "the rename captured")

    # The restart finds items as articles (state learnt the name when capture passed the statement).
    _run(root, "INSERT INTO articles VALUES (3, 3)", "UPDATE articles SET v = 20 WHERE id = 2")
    pipeline = Pipeline(config, spark=spark)
    with running(pipeline):
        wait_until(lambda: same("articles", items) == 3, 120, "articles after the restart", every=0.5)
        assert _state_row(state_dsn, items).schema.target_table == "items"
        assert _state_of(state_dsn, table_id(database, "articles")) is None


def _binlog_end(pipeline: Pipeline) -> int:
    with pipeline.source.connect() as conn:
        return pipeline.source.current_position(conn)


def test_mysql_truncate_read_first_after_a_restart_reaches_the_mirror(
        mariadb_server: Any, shop: tuple[str, str], state_dsn: str, tmp_path: Path) -> None:  # noqa: F811
    """A TRUNCATE that is the table's first binlog event after the pipeline starts again (no TABLE_MAP of
    it read yet) empties the mirror before the insert after it. DuckLake on a SQLite catalog, read back
    by DuckDB."""
    from headrace.targets.ducklake import extension
    from headrace.targets.ducklake.config import DuckLakeConfig
    from tests.e2e.test_pipeline import run_caught_up

    database, root = shop
    _run(root, "CREATE TABLE tr (id INT PRIMARY KEY, v INT)", "INSERT INTO tr VALUES (1, 1), (2, 2)")
    config = make_config(mariadb_server.dsn_for(database), tmp_path, [f"{database}.tr"], "ducklake-sqlite",
                         source={"state_dsn": state_dsn})
    pipeline = Pipeline(config)
    run_caught_up(pipeline)  # copied, then stopped
    _run(root, "TRUNCATE TABLE tr", "INSERT INTO tr VALUES (3, 3)")
    run_caught_up(pipeline)  # capture starts again at the TRUNCATE
    con = extension.connect(DuckLakeConfig(catalog=f"sqlite:{tmp_path / 'lake' / 'meta.sqlite'}",
                                           data_path=str(tmp_path / "lake" / "data")))
    try:
        assert con.execute(f'SELECT id, v FROM hr_lake."{database}".tr ORDER BY id').fetchall() == [(3, 3)]
    finally:
        con.close()
