"""History modes from a MariaDB source on DuckLake, end to end: scd2 (``history: mode: scd2``), and a
changelog and a soft_delete table (each its one mode, under its own name) in one pipeline.

The binlog's row images are whole (no TOAST), its commit times whole seconds; the staged log and the
history tables are the ones PostgreSQL feeds. The copy's rows become the first open versions; updates,
a delete, a key change and a re-insert follow; DuckDB reads the table back: its current versions equal
the source, every key has the versions its changes opened, in order; the changelog holds every
change once, in order (a key change a ``D`` and an ``I``, the TRUNCATE a ``T``) and replays to the
source; soft_delete keeps every deleted row with its deletion time.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from headrace.history.queries import CHANGELOG_AS_OF
from headrace.pipeline import Pipeline
from headrace.source.mysql.connect import connect
from tests.e2e.helpers import make_config
from tests.e2e.test_mysql import shop, state_dsn  # noqa: F401  (fixtures)
from tests.e2e.test_pipeline import run_caught_up
from tests.history.test_history_e2e import _lake


def _run(root: str, *statements: str) -> list[tuple[Any, ...]]:
    with contextlib.closing(connect(root)) as conn, conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)
        return [tuple(r) for r in cur.fetchall()] if cur.description else []


def test_a_mariadb_table_in_mode_scd2(mariadb_server: Any, shop: tuple[str, str], state_dsn: str,  # noqa: F811
                                      tmp_path: Path) -> None:
    database, root = shop
    _run(root, "CREATE TABLE acct (id INT PRIMARY KEY, name VARCHAR(40), bal INT)",
         "INSERT INTO acct VALUES (1, 'a1', 10), (2, 'a2', 20), (3, 'a3', 30)")
    config = make_config(mariadb_server.dsn_for(database), tmp_path, [f"{database}.acct"], "ducklake-sqlite",
                         source={"state_dsn": state_dsn}, history={"mode": "scd2"})
    pipeline = Pipeline(config)
    run_caught_up(pipeline)
    _run(root, "UPDATE acct SET bal = bal + 1 WHERE id IN (1, 2)", "UPDATE acct SET name = 'one' WHERE id = 1",
         "DELETE FROM acct WHERE id = 2", "UPDATE acct SET id = 30 WHERE id = 3", "INSERT INTO acct VALUES (2, 'b2', 5)")
    run_caught_up(pipeline)
    source = set(_run(root, "SELECT id, name, bal FROM acct"))
    con = _lake(tmp_path)
    try:
        table = f'hr_lake."{database}".acct'
        current = {tuple(r) for r in con.execute(f"SELECT id, name, bal FROM {table} WHERE _hr_current").fetchall()}
        assert current == source == {(1, "one", 11), (2, "b2", 5), (30, "a3", 30)}
        lives = con.execute(f"SELECT id, list(bal ORDER BY _hr_lsn, _hr_seq), count(_hr_valid_to)"
                            f" FROM {table} GROUP BY id ORDER BY id").fetchall()
        # key 1: the copy's version, two updates; 2: copy, update, closed by the delete, re-inserted;
        # 3: closed by its key change to 30
        assert [tuple(r) for r in lives] == [(1, [10, 11, 11], 2), (2, [20, 21, 5], 2), (3, [30], 1), (30, [30], 0)]
    finally:
        con.close()


def test_mariadb_tables_as_their_changelog_and_soft_delete(mariadb_server: Any, shop: tuple[str, str],  # noqa: F811
                                                           state_dsn: str, tmp_path: Path) -> None:  # noqa: F811
    database, root = shop
    modes = {"cl": "changelog", "sd": "soft_delete"}
    for t in modes:
        _run(root, f"CREATE TABLE {t} (id INT PRIMARY KEY, name VARCHAR(40), bal INT)",
             f"INSERT INTO {t} VALUES (1, 'a1', 10), (2, 'a2', 20), (3, 'a3', 30)")
    config = make_config(mariadb_server.dsn_for(database), tmp_path, [f"{database}.{t}" for t in modes],
                         "ducklake-sqlite", source={"state_dsn": state_dsn},
                         history={"tables": {f"{database}.{t}": [mode] for t, mode in modes.items()}})
    pipeline = Pipeline(config)
    run_caught_up(pipeline)
    sources = []
    for work in (["UPDATE {t} SET bal = bal + 1 WHERE id IN (1, 2)", "UPDATE {t} SET name = 'one' WHERE id = 1",
                  "DELETE FROM {t} WHERE id = 2", "UPDATE {t} SET id = 30 WHERE id = 3",
                  "INSERT INTO {t} VALUES (2, 'b2', 5)"],
                 ["TRUNCATE TABLE {t}", "INSERT INTO {t} VALUES (7, 'seven', 70)"]):
        for t in modes:
            _run(root, *[w.format(t=t) for w in work])
        run_caught_up(pipeline)
        sources.append({t: set(_run(root, f"SELECT id, name, bal FROM {t}")) for t in modes})
    con = _lake(tmp_path)
    try:
        cl, sd = f'hr_lake."{database}".cl', f'hr_lake."{database}".sd'
        ops = con.execute(f"SELECT _hr_op, id FROM {cl} WHERE _hr_commit_ts IS NOT NULL"
                          " ORDER BY _hr_lsn, _hr_seq, _hr_op <> 'D'").fetchall()
        assert [tuple(r) for r in ops] == [("U", 1), ("U", 2), ("U", 1), ("D", 2), ("D", 3), ("I", 30), ("I", 2),
                                           ("T", None), ("I", 7)]
        assert con.execute(f"SELECT count(*) FROM {cl} WHERE _hr_commit_ts IS NULL AND _hr_op = 'I'").fetchall() == [(3,)]
        replay = CHANGELOG_AS_OF.format(table=cl, columns="id, name, bal", key="id")
        assert {tuple(r) for r in con.execute(replay, ["infinity"]).fetchall()} == sources[-1]["cl"] == {(7, "seven", 70)}
        live = {tuple(r) for r in con.execute(f"SELECT id, name, bal FROM {sd} WHERE _hr_deleted_at IS NULL").fetchall()}
        assert live == sources[-1]["sd"]
        gone = con.execute(f"SELECT id, name, bal FROM {sd} WHERE _hr_deleted_at IS NOT NULL ORDER BY id").fetchall()
        # 3 deleted by its key change; 1, 2 (re-inserted) and 30 by the TRUNCATE, each with its last values
        assert [tuple(r) for r in gone] == [(1, "one", 11), (2, "b2", 5), (3, "a3", 30), (30, "a3", 30)]
    finally:
        con.close()
