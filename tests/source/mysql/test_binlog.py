"""The binlog as core.changes events: row changes, transactions, DDL, rotation, restart, and the copy's
positions against it."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import pyarrow as pa

from headrace.core.changes import Begin, Commit, Delete, Event, Insert, Relation, Truncate, Update
from headrace.source.mysql.binlog import BinlogStream
from headrace.source.mysql.catalog import read_table_schema, table_id
from headrace.source.mysql.connect import connect
from headrace.source.mysql.copy import copy_chunk, plan_chunks, snapshot_position

SERVER_ID = 4242


def _read_commits(stream: BinlogStream, commits: int) -> list[Event]:
    """Events until ``commits`` Commits arrived (a generous deadline only guards against a hang)."""
    events: list[Event] = []
    deadline = time.monotonic() + 60
    while sum(isinstance(e, Commit) for e in events) < commits:
        assert time.monotonic() < deadline, f"only {events}"
        events += [e for _pos, e in stream.read(1000, 0.5)]
    return events


def _short(event: Event) -> Event:
    """``event`` with long values replaced by their length (keeps assertion diffs small)."""
    if isinstance(event, Insert):
        return Insert(event.relation_oid, tuple(f"<{len(v)}>" if isinstance(v, str) and len(v) > 100 else v
                                                for v in event.new))
    return event


def _transactions(events: list[Event]) -> list[list[Event]]:
    out: list[list[Event]] = []
    for e in events:
        if isinstance(e, Begin):
            out.append([])
        out[-1].append(e)
    return out


def test_binlog_events_from_changes_ddl_rotation_and_restart(mariadb_server: Any, mysql_db: tuple[str, str]) -> None:
    database, dsn = mysql_db
    root = connect(mariadb_server.root_dsn + database)
    big = "x" * (1 << 20)
    with contextlib.closing(root), root.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY, v LONGTEXT, n INT NULL)")
        cur.execute("CREATE TABLE k (a INT, b VARCHAR(5))")
        cur.execute("CREATE TABLE other (id INT PRIMARY KEY)")
        start = snapshot_position(root)
        tid, kid = table_id(database, "t"), table_id(database, "k")
        cur.execute("INSERT INTO t VALUES (1, 'one', NULL)")                        # 1
        cur.execute("UPDATE t SET v = 'uno', n = 5 WHERE id = 1")                   # 2
        cur.execute("UPDATE t SET id = 2 WHERE id = 1")                             # 3 key change
        cur.execute("INSERT INTO other VALUES (1)")                                 # untracked: no transaction
        root.begin()                                                                # 4 several statements
        cur.execute("INSERT INTO t VALUES (3, %s, 3), (4, 'four', NULL)", (big,))
        cur.execute("INSERT INTO k VALUES (1, 'a'), (1, 'a')")
        root.commit()
        root.begin()
        cur.execute("INSERT INTO t VALUES (99, 'rolled back', 0)")
        root.rollback()                                                             # absent
        cur.execute("DELETE FROM t WHERE id = 4")                                   # 5
        cur.execute("UPDATE k SET b = 'b' WHERE a = 1 LIMIT 1")                     # 6 keyless
        cur.execute("ALTER TABLE t ADD COLUMN added VARCHAR(3) DEFAULT 'd'")
        cur.execute("FLUSH BINARY LOGS")
        cur.execute("INSERT INTO t VALUES (5, 'five', 5, 'new')")                   # 7 new shape, next file
        cur.execute("TRUNCATE TABLE k")                                             # 8
        cur.execute("DELETE FROM k")                                                # (nothing to delete)

    stream = BinlogStream(dsn, SERVER_ID, start, {(database, "t"), (database, "k")})
    events = _read_commits(stream, 8)
    stream.close()
    txns = _transactions(events)
    assert len(txns) == 8 and all(isinstance(t[0], Begin) and isinstance(t[-1], Commit) for t in txns)
    assert txns[3][1].new[1] == big  # type: ignore[union-attr]
    changes = [[_short(e) for e in t if not isinstance(e, Begin | Commit | Relation)] for t in txns]
    assert changes[0] == [Insert(tid, ("1", "one", None))]
    assert changes[1] == [Update(tid, ("1", "uno", "5"))]
    assert changes[2] == [Update(tid, ("2", "uno", "5"), (("1", None, None)), "K")]
    assert changes[3] == [Insert(tid, ("3", f"<{len(big)}>", "3")), Insert(tid, ("4", "four", None)),
                          Insert(kid, ("1", "a")), Insert(kid, ("1", "a"))]
    assert changes[4] == [Delete(tid, ("4", None, None), "K")]
    assert changes[5] == [Update(kid, ("1", "b"), ("1", "a"), "O")]
    assert changes[6] == [Insert(tid, ("5", "five", "5", "new"))]
    assert changes[7] == [Truncate((kid,))]
    relations = [(i, e) for i, t in enumerate(txns) for e in t if isinstance(e, Relation)]
    assert [(i, r.oid, len(r.columns)) for i, r in relations] == [(0, tid, 3), (3, kid, 2), (6, tid, 4)]
    assert relations[0][1].replica_identity == "d" and relations[1][1].replica_identity == "f"

    # Positions: a transaction starts where the previous one ended or later; the new file sorts after.
    begins = [t[0] for t in txns]
    commits = [t[-1] for t in txns]
    assert all(isinstance(b, Begin) and isinstance(c, Commit) and b.final_lsn == c.commit_lsn < c.end_lsn
               for b, c in zip(begins, commits, strict=True))
    assert all(commits[i].end_lsn <= begins[i + 1].final_lsn for i in range(7))  # type: ignore[union-attr]
    assert begins[6].final_lsn >> 32 == (begins[5].final_lsn >> 32) + 1  # type: ignore[union-attr]
    # The stream's shape is the TABLE_MAP's: the catalog's now.
    with contextlib.closing(connect(dsn)) as conn:
        assert stream.schema(tid) == read_table_schema(conn, database, "t")
    # Rows older than the added column hold its default in MariaDB: the new shape says so.
    assert stream.schema(tid).column("added").missing == "d" and stream.schema(tid).column("n").missing is None

    # A restart from a saved end position yields the following transactions once and only once.
    again = BinlogStream(dsn, SERVER_ID, commits[3].end_lsn, {(database, "t"), (database, "k")})  # type: ignore[union-attr]
    resumed = _read_commits(again, 4)
    assert again.read(100, 0.3) == []
    again.close()
    assert [_short(e) for e in resumed if not isinstance(e, Relation)] == \
        [_short(e) for t in txns[4:] for e in t if not isinstance(e, Relation)]


def test_each_chunk_plus_binlog_after_its_position_gives_the_final_rows(mariadb_server: Any,
                                                                          mysql_db: tuple[str, str]) -> None:
    database, dsn = mysql_db
    root = connect(mariadb_server.root_dsn + database)
    with contextlib.closing(root), root.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20))")
        cur.executemany("INSERT INTO t VALUES (%s, %s)", [(i, f"v{i}") for i in range(1, 31)])
        start = snapshot_position(root)
        conn = connect(dsn)
        schema = read_table_schema(conn, database, "t")
        chunks = plan_chunks(conn, schema, 10)
        copied: list[list[dict[str, Any]]] = []
        writes = [
            ["INSERT INTO t VALUES (0, 'low')", "UPDATE t SET v = 'a' WHERE id IN (5, 15, 25)"],
            ["DELETE FROM t WHERE id IN (6, 16)", "UPDATE t SET id = 1005 WHERE id = 7",
             "INSERT INTO t VALUES (6, 'again')"],
            ["UPDATE t SET id = -28 WHERE id = 28", "INSERT INTO t VALUES (500, 'past')"],
        ]
        for chunk, statements in zip(chunks, writes, strict=True):
            iterator = copy_chunk(dsn, schema, *chunk, batch_rows=7)
            first = next(iterator)  # the chunk's snapshot is taken; the writes come after it
            for sql in statements:
                cur.execute(sql)
            copied.append(pa.Table.from_batches([first, *iterator]).to_pylist())
        cur.execute("UPDATE t SET v = 'last' WHERE id IN (-28, 1005)")
        cur.execute("SELECT id, v FROM t")
        final = {str(i): v for i, v in cur.fetchall()}
        conn.close()

    stream = BinlogStream(dsn, SERVER_ID + 1, start, {(database, "t")})
    events = _read_commits(stream, 8)
    stream.close()
    positioned: list[tuple[int, Event]] = []
    txn_start = 0
    for e in events:
        if isinstance(e, Begin):
            txn_start = e.final_lsn
        elif isinstance(e, Insert | Update | Delete):
            positioned.append((txn_start, e))

    for (low, high), rows in zip(chunks, copied, strict=True):
        position = rows[0]["_pos"]
        def in_range(key: str | None, low: int = low, high: int = high) -> bool:
            return key is not None and low <= int(key) < high

        state = {r["c0"]: r["c1"] for r in rows}
        for pos, change in positioned:
            if pos < position:
                continue  # in the chunk's snapshot already
            if isinstance(change, Update) and change.old is not None and in_range(change.old[0]):
                state.pop(change.old[0], None)
            if isinstance(change, Delete) and in_range(change.old[0]):
                state.pop(change.old[0], None)
            if isinstance(change, Insert | Update) and in_range(change.new[0]):
                state[change.new[0]] = change.new[1]  # type: ignore[assignment]
        assert state == {k: v for k, v in final.items() if in_range(k)}, (low, high)
    assert start <= copied[0][0]["_pos"] < copied[1][0]["_pos"] < copied[2][0]["_pos"]


def test_newest_schemas_are_rebuilt_only_when_the_tracked_set_changes(
        mariadb_server: Any, mysql_db: tuple[str, str]) -> None:
    """A TABLE_MAP costs a lookup, not a copy of every table's schema: the map is built again only when
    capture hands over another dict of tracked tables (``CaptureLoop.track`` replaces it)."""
    from headrace.source.mysql.newest import NewestSchemas

    database, dsn = mysql_db
    with contextlib.closing(connect(mariadb_server.root_dsn + database)) as root, root.cursor() as cur:
        cur.execute("CREATE TABLE a (id INT PRIMARY KEY)")
        cur.execute("CREATE TABLE b (id INT PRIMARY KEY)")
        tracked = {table_id(database, "a"): read_table_schema(root, database, "a")}
        start = snapshot_position(root)
        for i in range(20):
            cur.execute(f"INSERT INTO a VALUES ({i})")
            cur.execute(f"INSERT INTO b VALUES ({i})")
    newest = NewestSchemas(lambda: tracked, {})
    maps: set[int] = set()  # the maps handed out, by identity

    def lookup() -> dict[int, Any]:
        got = newest()
        maps.add(id(got))
        return got

    stream = BinlogStream(dsn, SERVER_ID + 7, start, lambda d, t: table_id(d, t) in lookup(), known=lookup)
    try:
        events = _read_commits(stream, 20)
        assert sum(isinstance(e, Insert) for e in events) == 20 and len(maps) == 1  # 40 TABLE_MAPs, one map
        with contextlib.closing(connect(mariadb_server.root_dsn + database)) as root, root.cursor() as cur:
            tracked = {**tracked, table_id(database, "b"): read_table_schema(root, database, "b")}  # b tracked now
            cur.execute("INSERT INTO b VALUES (100)")
        (insert,) = [e for e in _read_commits(stream, 1) if isinstance(e, Insert)]
        assert insert.relation_oid == table_id(database, "b") and len(maps) == 2
    finally:
        stream.close()


def test_a_truncate_read_before_the_tables_first_table_map_follows_its_relation(
        mariadb_server: Any, mysql_db: tuple[str, str]) -> None:
    """Capture stages changes only of tables whose Relation it has seen: a TRUNCATE the stream reads
    before any TABLE_MAP of the table (the first event after a restart) comes after state's shape of it."""
    database, dsn = mysql_db
    with contextlib.closing(connect(mariadb_server.root_dsn + database)) as root, root.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY, v INT)")
        known = {table_id(database, "t"): read_table_schema(root, database, "t")}
        start = snapshot_position(root)
        cur.execute("TRUNCATE TABLE t")
    stream = BinlogStream(dsn, SERVER_ID + 8, start, {(database, "t")}, known=known)
    try:
        events = _read_commits(stream, 1)
    finally:
        stream.close()
    tid = table_id(database, "t")
    assert [type(e) for e in events] == [Begin, Relation, Truncate, Commit]
    assert events[1].oid == tid and events[2] == Truncate((tid,))  # type: ignore[attr-defined]
