"""A MariaDB copy gives way to a DDL waiting for its metadata lock (issue 35), as the PostgreSQL copy
does (``test_copy_gives_way``): the ALTER goes through within the bound and the copy converges."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from headrace.pipeline import Pipeline
from headrace.source.mysql.connect import connect
from tests.e2e.helpers import make_config, running, wait_until
from tests.e2e.test_copy_gives_way import hold_first_read
from tests.e2e.test_mysql import CREATE, _run, _same, shop, state_dsn

__all__ = ["shop", "state_dsn"]  # fixtures shared with test_mysql


def test_mysql_copy_gives_way_to_an_alter_and_converges(
        mariadb_server: Any, shop: tuple[str, str], state_dsn: str, tmp_path: Path, spark: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    database, root = shop
    _run(root, CREATE, "INSERT INTO items (id, name, qty) SELECT seq, CONCAT('n', seq), seq FROM seq_1_to_300")
    hold_first_read(monkeypatch)
    give_way = 3.0
    config = make_config(mariadb_server.dsn_for(database), tmp_path, [f"{database}.items"], "ducklake",
                         source={"state_dsn": state_dsn}, snapshot={"give_way_after_seconds": give_way})
    pipeline = Pipeline(config, spark=spark)
    done: dict[str, Any] = {}

    def alter() -> None:
        with contextlib.closing(connect(root)) as conn, conn.cursor() as cur:
            cur.execute("SET SESSION lock_wait_timeout = 60")
            started = time.monotonic()
            try:
                cur.execute("ALTER TABLE items ADD COLUMN extra_2 INT NOT NULL DEFAULT 2")
                done["seconds"] = time.monotonic() - started
                cur.execute("INSERT INTO items (id, name, qty) VALUES (1000, 'after the alter', 1)")
            except Exception as exc:
                done["error"] = exc

    with running(pipeline):
        def copy_sleeping() -> bool:
            with contextlib.closing(connect(root)) as conn, conn.cursor() as cur:
                cur.execute("SELECT count(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE %s"
                            " AND ID <> CONNECTION_ID()", ("%headrace copy%SLEEP%",))
                return bool(cur.fetchone()[0])

        wait_until(copy_sleeping, 90, "the copy's read holding its metadata lock on items")
        statement = threading.Thread(target=alter)
        statement.start()
        seen: list[Any] = []
        wait_until(lambda: seen.extend(pipeline.copy_lock_waiters()) or seen, 3 + give_way,
                   "the waiting ALTER reported by the copy's watch")
        assert seen[0].table == f"{database}.items" and "ALTER TABLE items" in seen[0].statement
        statement.join(30)
        assert "error" not in done, done
        assert done["seconds"] < give_way + 4, done
        wait_until(lambda: _same(pipeline, root, database), 120, "the copied table equal to the source")
