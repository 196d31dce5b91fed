"""End to end: ``headrace verify`` of a pipeline reading MariaDB, into DuckLake.

Equal tables exit 0, also while a writer changes rows during the comparison; differences made on
the target behind the pipeline's back are named exactly, key and columns.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import yaml

from headrace import readers
from headrace.config import parse_config
from headrace.pipeline import Pipeline
from headrace.source.mysql.connect import connect
from headrace.verify.compare import Progress
from headrace.verify.run import VerifyOptions, report, verify
from tests.e2e.helpers import raw_config, running, wait_until
from tests.e2e.test_mysql import shop, state_dsn  # noqa: F401 (fixtures)

ROWS = 200


def _verify_cli(path: Path, *args: str) -> tuple[int, list[dict[str, Any]], str]:
    done = subprocess.run([sys.executable, "-m", "headrace.cli", "verify", "-c", str(path), "--json", *args],
                          capture_output=True, text=True, timeout=300)
    return done.returncode, [json.loads(line) for line in done.stdout.splitlines() if line.strip()], done.stderr


def _writer(root: str, stop: threading.Event) -> None:
    with contextlib.closing(connect(root)) as conn, conn.cursor() as cur:
        i = 0
        while not stop.wait(0.01):
            i += 1
            cur.execute("UPDATE items SET qty = qty + 1, f = f * 1.5 WHERE id = %s", (i * 7 % ROWS + 1,))
            if i % 10 == 0:
                cur.execute("DELETE FROM items WHERE id = %s", (i * 13 % ROWS + 1,))
                cur.execute("INSERT INTO items (id, name, qty) VALUES (%s, %s, %s)", (ROWS + i, f"w{i}", i))


def test_mysql_verify_equal_under_load_then_names_each_difference(
        mariadb_server: Any, shop: tuple[str, str], state_dsn: str, tmp_path: Path, spark: Any) -> None:  # noqa: F811
    database, root = shop
    with contextlib.closing(connect(root)) as conn, conn.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")  # a zero date, as old applications wrote them
        cur.execute("CREATE TABLE items (id BIGINT PRIMARY KEY, name VARCHAR(40) NOT NULL, qty INT, price DECIMAL(12,2),"
                    " f DOUBLE, r FLOAT, flag BIT(1), bits BIT(5), born DATE, seen DATETIME(6), at TIMESTAMP(3) NULL,"
                    " span TIME(2), yr YEAR, raw VARBINARY(16), note TEXT)")
        cur.execute("INSERT INTO items WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < %s)"
                    " SELECT n, CONCAT('n', n, ' é 漢'), MOD(n, 7), n * 1.25, n / 3, n / 7, MOD(n, 2), MOD(n, 32),"
                    " IF(n = 5, '0000-00-00', '2024-01-01' + INTERVAL n DAY),"
                    " '2024-01-01 00:00:00' + INTERVAL n * 1500 MICROSECOND, FROM_UNIXTIME(1700000000 + n),"
                    " SEC_TO_TIME(n * 3600.25 - 100000), 1990 + MOD(n, 50), UNHEX(MD5(n)), IF(MOD(n, 10) = 0, NULL, 'x')"
                    " FROM g", (ROWS,))
    raw = raw_config(mariadb_server.dsn_for(database), tmp_path, [f"{database}.items"], "ducklake-sqlite",
                     source={"state_dsn": state_dsn})
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw))
    config = parse_config(raw)
    pipeline = Pipeline(config, spark=spark)
    with running(pipeline):
        wait_until(lambda: _verify_cli(path, "--wait", "5")[0] == 0, 180, "the copy, verified equal")
        stop = threading.Event()
        writer = threading.Thread(target=_writer, args=(root, stop))
        writer.start()
        try:
            for _ in range(2):
                results = [report(c, 1.0) for c in verify(config, VerifyOptions(), Progress())]
                assert [(r["table"], r["status"], r["differences"]) for r in results] == [
                    (f"{database}.items", "equal", [])]
        finally:
            stop.set()
            writer.join()
        # the writer's last changes applied, so none lands on the rows changed below
        assert [report(c, 1.0)["status"] for c in verify(config, VerifyOptions(), Progress())] == ["equal"]
    con = readers.ducklake(config.target.settings)  # type: ignore[arg-type]
    try:
        t = f'lake."{database}".items'
        ids = [r[0] for r in con.execute(f"SELECT id FROM {t} WHERE note IS NULL ORDER BY id").fetchall()]
        changed, deleted, nulled, doubled = ids[:4]  # rows the writer may have changed, as they are now
        con.execute(f"UPDATE {t} SET qty = qty + 1000 WHERE id = {changed}")
        con.execute(f"DELETE FROM {t} WHERE id = {deleted}")
        con.execute(f"UPDATE {t} SET note = 'was null', r = 2.5 WHERE id = {nulled}")
        con.execute(f"INSERT INTO {t} SELECT * FROM {t} WHERE id = {doubled}")
    finally:
        con.close()
    with running(pipeline):
        code, tables, err = _verify_cli(path)
    assert code == 1, err
    (result,) = tables
    assert result["position"].count(":") == 1  # a binlog position
    found = {tuple(d["key"]): (d["kind"], d["columns"]) for d in result["differences"]}
    assert found == {(changed,): ("changed", ["qty"]), (deleted,): ("missing", []),
                     (nulled,): ("changed", ["r", "note"]), (doubled,): ("duplicated", [])}
