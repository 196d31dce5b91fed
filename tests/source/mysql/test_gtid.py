"""GTID positions: MariaDB's and MySQL's spellings, the server epoch in positions, and a stream that
continues on a replica from the GTID state of a position read on its primary."""

from __future__ import annotations

import contextlib
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from pymysqlreplication.event import GtidEvent

from headrace.core.changes import Commit, Insert
from headrace.source.mysql.binlog import BinlogStream
from headrace.source.mysql.connect import connect
from headrace.source.mysql.copy import snapshot_position
from headrace.source.mysql.gtid import GtidTracker, MariaDbGtidPosition, MySqlGtidSet, Resume, mysql_gtid
from headrace.source.mysql.position import epoch_of, format_position, from_int, to_int
from headrace.source.mysql.server import failover_problem, server_identity, stream_start
from headrace.source.mysql.throwaway import ThrowawayMariaDB

UUID_A = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
UUID_B = "a1b2c3d4-0000-1111-2222-333344445555"


def test_mariadb_positions_parse_advance_and_compare() -> None:
    position = MariaDbGtidPosition("0-1-100, 1-2-7")
    assert str(position) == "0-1-100,1-2-7" and str(MariaDbGtidPosition("")) == ""
    position.advance(0, 3, 101)  # a transaction of another server in domain 0
    assert str(position) == "0-3-101,1-2-7"
    assert position.behind("0-1-150,0-3-101,1-2-9") == []
    assert position.behind("0-1-150,1-2-9") == ["0-3-101"]  # server 3's transactions not logged there
    assert position.behind("0-3-100,1-2-7") == ["0-3-101"]  # behind by one
    with pytest.raises(ValueError, match="not a MariaDB GTID"):
        MariaDbGtidPosition("0-1")


def test_mysql_gtid_sets_parse_add_merge_and_contain() -> None:
    executed = MySqlGtidSet(f"{UUID_A}:1-5:7,\n{UUID_B.upper()}:3")
    assert str(executed) == f"{UUID_A}:1-5:7,{UUID_B}:3"
    executed.add(UUID_A, 6)  # fills the gap: one interval
    executed.add(UUID_B, 4)
    assert str(executed) == f"{UUID_A}:1-7,{UUID_B}:3-4"
    assert executed.contains(MySqlGtidSet(f"{UUID_A}:2-6"))
    assert not executed.contains(MySqlGtidSet(f"{UUID_A}:2-8"))
    assert not executed.contains(MySqlGtidSet(f"{UUID_B}:1"))
    for bad in ("nope:1-2", f"{UUID_A}", f"{UUID_A}:x-2"):
        with pytest.raises(ValueError, match="MySQL GTID set|sequence"):
            MySqlGtidSet(bad)


def test_a_mysql_gtid_event_advances_the_executed_set() -> None:
    """MySQL's GtidEvent as mysql-replication spells it (its ``gtid`` property over the UUID's 16 bytes)
    opens a transaction whose commit adds it to the set the tokens carry."""
    event = SimpleNamespace(sid=uuid.UUID(UUID_A).bytes, gno=8)
    event.gtid = GtidEvent.gtid.fget(event)  # the library's own spelling
    assert mysql_gtid(event) == (UUID_A, 8)
    tracker = GtidTracker(f"{UUID_A}:1-7", UUID_B, 1)
    tracker.begin(*mysql_gtid(event))
    tracker.commit()
    resume = Resume.from_token(tracker.token)
    assert resume is not None and resume.gtid == f"{UUID_A}:1-8" and resume.flavor == "mysql"
    assert (resume.server, resume.epoch) == (UUID_B, 1)
    assert GtidTracker(None, UUID_B, 0).token is None  # read by file and offset: no state, no token


def test_resume_tokens_and_epochs_in_positions() -> None:
    resume = Resume("0-1-9", "mariadb:server_uid=x,server_id=1,gtid_domain_id=0", 2, "mariadb")
    assert Resume.from_token(resume.to_token()) == resume and Resume.from_token(None) is None
    first = to_int("binlog.000999", 2**32 - 1)
    second = to_int("binlog.000001", 4, epoch=1)  # the replica's files start over
    assert first < second and epoch_of(second) == 1 and epoch_of(first) == 0
    assert from_int(second, "binlog") == ("binlog.000001", 4)
    assert format_position(second) == "1/000001:4" and format_position(first) == "000999:4294967295"


def _insert(root: str, *ids: int) -> None:
    with contextlib.closing(connect(root)) as conn, conn.cursor() as cur:
        for i in ids:
            cur.execute("INSERT INTO t (id) VALUES (%s)", (i,))


def _commits(stream: BinlogStream, count: int) -> list[tuple[list[int], Commit]]:
    """The next ``count`` transactions: their inserted ids and their Commit."""
    out: list[tuple[list[int], Commit]] = []
    ids: list[int] = []
    deadline = time.monotonic() + 60
    while len(out) < count:
        assert time.monotonic() < deadline, f"only {out}"
        for _pos, event in stream.read(100, 0.5):
            if isinstance(event, Insert):
                ids.append(int(event.new[0] or 0))
            elif isinstance(event, Commit):
                out.append((ids, event))
                ids = []
    return out


def test_a_stream_continues_on_a_replica_from_a_gtid_position(tmp_path: Path) -> None:
    """Positions read on the primary carry its GTID state; a stream opened on the replica from the
    state of the second transaction yields exactly the ones after it, in epoch 1, with the replica's
    tokens. A replica that stopped before a position is refused with the GTID it lacks."""
    with ThrowawayMariaDB(str(tmp_path)) as primary, ThrowawayMariaDB(
            str(tmp_path), settings={"server_id": "2", "log_slave_updates": "ON"}) as replica:
        replica.replicate_from(primary)
        primary.create_database("d")
        root = primary.root_dsn + "d"
        with contextlib.closing(connect(root)) as conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE t (id INT PRIMARY KEY)")
            start = snapshot_position(conn)
        _insert(root, 1, 2, 3)
        stream = BinlogStream(primary.dsn_for("d"), 4242, start, {("d", "t")})
        read = _commits(stream, 3)
        stream.close()
        assert [ids for ids, _ in read] == [[1], [2], [3]]
        second = Resume.from_token(read[1][1].token)
        assert second is not None and second.epoch == 0 and second.server.startswith("mariadb:")
        _insert(root, 4, 5)

        deadline = time.monotonic() + 60
        while not replica.caught_up_with(primary):
            assert time.monotonic() < deadline, "the replica never caught up"
            time.sleep(0.1)
        with contextlib.closing(connect(replica.dsn)) as conn:
            begin = stream_start(conn, replica.dsn, "p", second.server, read[1][1].end_lsn, read[1][1].token)
            assert begin.gtid == second.gtid and begin.epoch == 1
            replica_identity = server_identity(conn)
        moved = BinlogStream(replica.dsn_for("d"), 4242, begin.position, {("d", "t")}, epoch=begin.epoch,
                             gtid_start=begin.gtid)
        after = _commits(moved, 3)
        moved.close()
        assert [ids for ids, _ in after] == [[3], [4], [5]]
        assert all(epoch_of(c.end_lsn) == 1 and c.end_lsn > read[-1][1].end_lsn for _, c in after)
        last = Resume.from_token(after[-1][1].token)
        assert last is not None and last.server == replica_identity and last.epoch == 1

        with contextlib.closing(connect(replica.root_dsn)) as conn, conn.cursor() as cur:
            cur.execute("STOP SLAVE")
        _insert(root, 6)
        newest = Resume(f"0-1-{int(second.gtid.rsplit('-', 1)[1]) + 4}", second.server, 0, "mariadb")
        with contextlib.closing(connect(replica.dsn)) as conn:
            problem = failover_problem(conn, newest, replica_identity)
        assert problem is not None and f"does not hold GTID {newest.gtid}" in problem
        with contextlib.closing(connect(primary.dsn)) as conn:  # another server with the same server_id
            same_id = failover_problem(conn, Resume(second.gtid, replica_identity.replace("server_id=2", "server_id=1")
                                                    .replace("server_uid=", "server_uid=x"), 0, "mariadb"),
                                       server_identity(conn))
        assert same_id is not None and "not a replica" in same_id
