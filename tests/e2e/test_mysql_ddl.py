"""End to end: schema changes read from a MariaDB binlog while a pipeline streams (Iceberg and DuckLake).

A column renamed keeps its values (the target column is renamed, not dropped and added), a column
widened (INT -> BIGINT) takes values only the wider type holds, a table renamed streams on into its
target table (``schema_changes.rename_table: keep``), and a tracked table dropped stops alone, in
ERRORED with the fix ``headrace resync``, while the other keeps streaming; a column renamed while
the run is stopped is followed after the restart (column ids continue from state), and a restart after
a RENAME TABLE continues with the config still naming the old table. The target is read back
and compared with the source row by row.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from headrace.core.names import quote_spark
from headrace.core.schema import TableSchema
from headrace.pipeline import Pipeline
from headrace.source.mysql.catalog import read_table_schema, table_id
from headrace.source.mysql.connect import connect
from headrace.state.lifecycle import TableState
from headrace.state.store import StateStore
from tests.e2e.helpers import _norm, make_config, running, wait_until
from tests.e2e.test_mysql import _run, shop, state_dsn, target  # noqa: F401 -- fixtures shared with test_mysql

ITEMS = "CREATE TABLE items (id BIGINT PRIMARY KEY, name VARCHAR(50) NOT NULL, qty INT)"
GONE = "CREATE TABLE gone (id INT PRIMARY KEY, v INT)"


def _state_row(dsn: str, oid: int) -> Any:
    """Table ``oid``'s state row (None until the run has set state up)."""
    state = StateStore(dsn, "t")
    try:
        return state.table(oid) if state.installed() else None
    finally:
        state.close()


def _state_of(dsn: str, oid: int) -> TableState | None:
    row = _state_row(dsn, oid)
    return row.state if row is not None else None


def _same(pipeline: Pipeline, dsn: str, root: str, database: str, table: str, oid: int) -> int:
    """The source table ``table`` equals its target table (found through state's schema for ``oid``)."""
    with contextlib.closing(connect(root)) as conn:
        source = read_table_schema(conn, database, table)
        with conn.cursor() as cur:
            cur.execute(f"SELECT {', '.join('`' + c + '`' for c in source.column_names)} FROM `{table}`")
            expected = sorted((tuple(_norm(v) for v in r) for r in cur.fetchall()), key=repr)
    row = _state_row(dsn, oid)
    schema: TableSchema = row.schema
    assert schema.column_names == source.column_names, f"target columns {schema.column_names}"
    try:
        df = pipeline.target.read_table(schema).select(*[quote_spark(c) for c in schema.column_names])
        actual = sorted((tuple(_norm(v) for v in r) for r in df.collect()), key=repr)
    except Exception as exc:  # state has the new shape, the target not yet (a copy under way)
        raise AssertionError(f"target not readable in the source's shape yet: {exc}") from exc
    assert actual == expected, f"source {expected[:5]}..., target {actual[:5]}..."
    return len(expected)


def test_mysql_ddl_streams_renames_widening_and_a_drop(
        mariadb_server: Any, shop: tuple[str, str], state_dsn: str, target: str, tmp_path: Path,  # noqa: F811
        spark: Any) -> None:
    database, root = shop
    _run(root, ITEMS, GONE, "INSERT INTO items VALUES (1, 'a', 1), (2, 'b', 2), (3, 'c', 3)",
         "INSERT INTO gone VALUES (1, 10), (2, 20)")
    config = make_config(mariadb_server.dsn_for(database), tmp_path, [f"{database}.items", f"{database}.gone"],
                         target, source={"state_dsn": state_dsn})
    items, gone = table_id(database, "items"), table_id(database, "gone")
    pipeline = Pipeline(config, spark=spark)

    def same(table: str, oid: int = items) -> int:
        return _same(pipeline, state_dsn, root, database, table, oid)

    with running(pipeline):
        wait_until(lambda: all(_state_of(state_dsn, o) == TableState.STREAMING for o in (items, gone)),
                   180, "both tables to stream")
        wait_until(lambda: same("items") == 3 and same("gone", gone) == 2, 60, "the copy", every=0.5)

        # RENAME COLUMN: the target column is renamed and keeps its values.
        _run(root, "ALTER TABLE items RENAME COLUMN name TO label", "INSERT INTO items VALUES (4, 'd', 4)",
             "UPDATE items SET label = 'B' WHERE id = 2")
        wait_until(lambda: same("items") == 4, 60, "RENAME COLUMN", every=0.5)

        # MODIFY widening: a value only BIGINT holds lands.
        _run(root, "ALTER TABLE items MODIFY qty BIGINT", "UPDATE items SET qty = 5000000000 WHERE id = 1")
        wait_until(lambda: same("items") == 4, 60, "MODIFY INT -> BIGINT", every=0.5)

    # Stopped, the column renamed again: after the restart the stream continues from state's names and
    # column ids (the target column renamed again, values kept).
    _run(root, "ALTER TABLE items RENAME COLUMN label TO title", "INSERT INTO items VALUES (5, 'e', 5)")
    pipeline = Pipeline(config, spark=spark)  # same() reads the restarted one
    with running(pipeline):
        wait_until(lambda: same("items") == 5, 120, "a column renamed while stopped", every=0.5)

        # RENAME TABLE (rename_table: keep): the renamed table streams on into the same target table.
        _run(root, "RENAME TABLE items TO articles", "INSERT INTO articles VALUES (8, 'h', 8)",
             "DELETE FROM articles WHERE id = 3")
        wait_until(lambda: same("articles") == 5, 60, "RENAME TABLE", every=0.5)
        assert _state_row(state_dsn, items).schema.target_table == "items"

    # Stopped after the RENAME TABLE: the config still names items, which no longer exists; the restart
    # finds the tracked table as articles (state's name for its id) and streams on into the same target.
    _run(root, "INSERT INTO articles VALUES (9, 'i', 9)", "UPDATE articles SET qty = 90 WHERE id = 1")
    pipeline = Pipeline(config, spark=spark)
    with running(pipeline):
        wait_until(lambda: same("articles") == 6, 120, "changes made while stopped after a RENAME TABLE", every=0.5)
        assert _state_row(state_dsn, items).schema.target_table == "items"
        assert _state_of(state_dsn, table_id(database, "articles")) is None  # not tracked as another table

        # DROP TABLE of a tracked table: it stops alone, with the fix; the other streams on.
        _run(root, "DROP TABLE gone")
        wait_until(lambda: _state_of(state_dsn, gone) == TableState.ERRORED, 60, "the dropped table errored")
        row = _state_row(state_dsn, gone)
        assert "dropped" in row.error and f"headrace resync {database}.gone" in row.error, row.error
        assert row.error_fix is not None and "headrace resync" in row.error_fix
        _run(root, "INSERT INTO articles VALUES (6, 'f', 6)", "UPDATE articles SET qty = 7 WHERE id = 6")
        wait_until(lambda: same("articles") == 7, 60, "the other table streaming after the drop", every=0.5)
        assert _state_of(state_dsn, items) == TableState.STREAMING
