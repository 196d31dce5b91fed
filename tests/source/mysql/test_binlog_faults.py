"""The binlog stream's failures: a position the server no longer has is refused with the fix; a server
that goes away is a transient error, and the stream resumes from the last Commit after it is back; a row
image without every column is refused."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import pytest

from headrace.core.changes import Commit, Insert
from headrace.core.errors import SourceError, TransientError
from headrace.source.mysql.binlog import BinlogStream
from headrace.source.mysql.catalog import table_id
from headrace.source.mysql.connect import connect
from headrace.source.mysql.copy import snapshot_position
from headrace.source.mysql.position import to_int
from headrace.source.mysql.throwaway import ThrowawayMariaDB


def test_purged_position_refused_and_crash_is_transient(tmp_path: Any) -> None:
    with ThrowawayMariaDB(str(tmp_path)) as server:
        dsn = server.create_database("shop")
        with contextlib.closing(connect(server.root_dsn + "shop")) as root, root.cursor() as cur:
            cur.execute("CREATE TABLE t (id INT PRIMARY KEY)")
            start = snapshot_position(root)
            cur.execute("INSERT INTO t VALUES (1)")

        gone = BinlogStream(dsn, 11, to_int("binlog.000999", 4), {("shop", "t")})
        with pytest.raises(SourceError, match="is no longer on the server.*binlog_expire_logs_seconds"):
            gone.read(10, 5)
        gone.close()

        stream = BinlogStream(dsn, 12, start, {("shop", "t")})
        events = []
        while not any(isinstance(e, Commit) for e in events):
            events += [e for _pos, e in stream.read(100, 1.0)]
        saved = next(e for e in events if isinstance(e, Commit)).end_lsn
        server.crash()
        with pytest.raises(TransientError, match="binlog connection failed"):
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                stream.read(100, 1.0)
        stream.close()

        server.start_server()
        with contextlib.closing(connect(server.root_dsn + "shop")) as root, root.cursor() as cur:
            cur.execute("INSERT INTO t VALUES (2)")
        resumed = BinlogStream(dsn, 12, saved, {("shop", "t")})
        inserts: list[Insert] = []
        while not inserts:
            inserts += [e for _pos, e in resumed.read(100, 1.0) if isinstance(e, Insert)]
        resumed.close()
        assert inserts == [Insert(table_id("shop", "t"), ("2",))]

        # A row image without every column (binlog_row_image=MINIMAL) is refused, never read as NULLs.
        with contextlib.closing(connect(server.root_dsn + "shop")) as root, root.cursor() as cur:
            cur.execute("ALTER TABLE t ADD COLUMN v INT")
            cur.execute("SET SESSION binlog_row_image = 'MINIMAL'")
            minimal = snapshot_position(root)
            cur.execute("UPDATE t SET v = 1 WHERE id = 2")
        partial = BinlogStream(dsn, 13, minimal, {("shop", "t")})
        with pytest.raises(SourceError, match="leaves out column v.*binlog_row_image = 'FULL'"):
            partial.read(100, 5.0)
        partial.close()
