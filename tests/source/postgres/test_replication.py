"""Publication, slot, exported snapshot, heartbeat and the replication stream on a real server."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest

from headrace.core.changes import Begin, Commit, Event, Insert, Message, Relation, Update
from headrace.core.errors import SourceError, TransientError
from headrace.core.position import parse_lsn
from headrace.source.postgres import pgoutput
from headrace.source.postgres.replication import (
    ExportedSnapshot,
    ReplicationStream,
    emit_heartbeat,
    ensure_publication,
    ensure_slot,
)
from tests.e2e.helpers import wait_until


@pytest.fixture
def conn(source_dsn: str) -> Iterator[psycopg.Connection]:
    # synchronous_commit=on: the walsender only sends flushed WAL, and the test server runs with
    # synchronous_commit=off, which would delay each change by up to wal_writer_delay.
    with psycopg.connect(source_dsn, autocommit=True, options="-c synchronous_commit=on") as c:
        c.execute("CREATE TABLE t (id int PRIMARY KEY, ts timestamptz, iv interval, f float8, v text)")
        c.execute("CREATE TABLE u (id int PRIMARY KEY)")
        yield c


def published(conn: psycopg.Connection, name: str) -> set[str]:
    rows = conn.execute("SELECT tablename FROM pg_publication_tables WHERE pubname = %s", (name,))
    return {r[0] for r in rows}


def read_until(stream: ReplicationStream, done: type, timeout: float = 10.0) -> list[tuple[int, Event]]:
    """Read until an event of type ``done`` arrives (or fail after ``timeout`` s)."""
    got: list[tuple[int, Event]] = []
    deadline = time.monotonic() + timeout
    while not any(isinstance(e, done) for _, e in got):
        assert time.monotonic() < deadline, f"no {done.__name__} within {timeout} s; got {got}"
        got += stream.read(1000, 0.2)
    return got


def test_ensure_publication_is_idempotent(conn: psycopg.Connection) -> None:
    ensure_publication(conn, "pub", ["public.t"])
    assert published(conn, "pub") == {"t"}
    ensure_publication(conn, "pub", ["t"])
    assert published(conn, "pub") == {"t"}
    ensure_publication(conn, "pub", ["public.t", "public.u"])
    assert published(conn, "pub") == {"t", "u"}
    ensure_publication(conn, "pub", ["u"])
    assert published(conn, "pub") == {"u"}
    with pytest.raises(SourceError, match="public.nope does not exist"):
        ensure_publication(conn, "pub", ["public.nope"])


def test_ensure_slot(conn: psycopg.Connection) -> None:
    lsn = ensure_slot(conn, "hr")
    assert lsn > 0
    conn.execute("INSERT INTO u VALUES (1)")
    assert ensure_slot(conn, "hr") == lsn  # existing slot: not recreated, not advanced
    conn.execute("SELECT pg_create_logical_replication_slot('other', 'test_decoding')")
    with pytest.raises(SourceError, match="plugin test_decoding"):
        ensure_slot(conn, "other")


def test_exported_snapshot_is_importable(conn: psycopg.Connection, source_dsn: str) -> None:
    conn.execute("INSERT INTO u VALUES (1)")
    with ExportedSnapshot(source_dsn) as snap:
        conn.execute("INSERT INTO u VALUES (2)")
        assert snap.lsn > 0 and snap.snapshot_name
        with psycopg.connect(source_dsn) as reader:
            reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            reader.execute(f"SET TRANSACTION SNAPSHOT '{snap.snapshot_name}'")
            assert reader.execute("SELECT array_agg(id) FROM u").fetchone() == ([1],)
        after = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]  # type: ignore[index]
        assert snap.lsn < parse_lsn(after)
        slots = conn.execute("SELECT temporary FROM pg_replication_slots WHERE slot_name = %s", (snap.slot_name,))
        assert slots.fetchall() == [(True,)]
    # The temporary slot goes when its session ends, which the server notices a moment later.
    slots = "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s"
    wait_until(lambda: conn.execute(slots, (snap.slot_name,)).fetchone() == (0,), 10, "the temporary slot stayed")


def test_stream_read_acknowledge_restart(conn: psycopg.Connection, source_dsn: str) -> None:
    ensure_publication(conn, "pub", ["public.t"])
    start = ensure_slot(conn, "hr")
    with ReplicationStream(source_dsn, "hr", "pub", start) as stream:
        assert stream.read(10, 0.05) == []  # nothing yet: returns after the timeout
        with conn.transaction():
            conn.execute("SET LOCAL TimeZone = 'Asia/Tokyo'")  # the stream still renders UTC
            conn.execute(
                "INSERT INTO t VALUES (1, '2024-01-02 03:04:05+09', '1 day 2 hours', 0.1, 'x'), (2, NULL, NULL, NULL, '')"
            )
        conn.execute("INSERT INTO u VALUES (1)")  # not published: never shows up
        first = read_until(stream, Commit)
        kinds = [type(e) for _, e in first]
        assert kinds == [Begin, Relation, Insert, Insert, Commit]
        assert [e.new for _, e in first if isinstance(e, Insert)] == [
            ("1", "2024-01-01 18:04:05+00", "1 day 02:00:00", "0.1", "x"),
            ("2", None, None, None, ""),
        ]
        commit = first[-1][1]
        assert isinstance(commit, Commit)
        # data_start: the commit's end for COMMIT, the change's LSN for changes, and 0 for RELATION.
        assert first[-1][0] == commit.end_lsn
        assert first[0][0] <= first[2][0] <= first[3][0] < commit.commit_lsn
        assert first[1][0] == 0
        stream.acknowledge(commit.end_lsn)
        conn.execute("UPDATE t SET v = 'y' WHERE id = 1")
        assert [type(e) for _, e in read_until(stream, Commit)] == [Begin, Update, Commit]
    confirmed = conn.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'hr'")
    assert parse_lsn(confirmed.fetchone()[0]) == commit.end_lsn  # type: ignore[index]

    # Restart at the acknowledged position: the first transaction is not sent again.
    with ReplicationStream(source_dsn, "hr", "pub", commit.end_lsn) as stream:
        again = read_until(stream, Commit)
    changes = [e for _, e in again if isinstance(e, Insert | Update)]
    assert len(changes) == 1 and isinstance(changes[0], Update) and changes[0].new[-1] == "y"


def test_stream_hands_changes_over_undecoded_when_asked(conn: psycopg.Connection, source_dsn: str) -> None:
    """raw_changes: INSERT/UPDATE/DELETE as their message's bytes (decoding them gives what the
    plain stream gives), everything else decoded; without headrace._speedups, every message decoded."""
    ensure_publication(conn, "pub", ["public.t"])
    start = ensure_slot(conn, "hr")
    conn.execute("INSERT INTO t (id, v) VALUES (1, 'a')")
    conn.execute("UPDATE t SET v = 'b'")
    conn.execute("DELETE FROM t")
    def three_transactions(stream: ReplicationStream) -> list[object]:
        got: list[object] = []
        while sum(isinstance(e, Commit) for e in got) < 3:
            got += [e for _, e in read_until(stream, Commit)]
        return got

    with ReplicationStream(source_dsn, "hr", "pub", start) as stream:
        plain = three_transactions(stream)
    with ReplicationStream(source_dsn, "hr", "pub", start, raw_changes=True) as stream:
        raw = three_transactions(stream)
    if pgoutput.UNDECODED is None:
        assert raw == plain
        return
    assert [type(e) for e in raw] == [Begin, Relation, bytes, Commit, Begin, bytes, Commit, Begin, bytes, Commit]
    assert [pgoutput.UNDECODED.decode(e) if isinstance(e, bytes) else e for e in raw] == plain


def test_heartbeat_comes_back_as_message(conn: psycopg.Connection, source_dsn: str) -> None:
    ensure_publication(conn, "pub", ["public.t"])
    start = ensure_slot(conn, "hr")
    with ReplicationStream(source_dsn, "hr", "pub", start) as stream:
        lsn = emit_heartbeat(conn)
        got = read_until(stream, Commit)
    messages = [e for _, e in got if isinstance(e, Message)]
    assert len(messages) == 1
    assert messages[0].prefix == "headrace" and messages[0].transactional and messages[0].lsn == lsn


def test_stream_errors_are_translated(conn: psycopg.Connection, source_dsn: str) -> None:
    with pytest.raises(SourceError, match="slot missing"):
        ReplicationStream(source_dsn, "missing", "pub", 0)
    ensure_publication(conn, "pub", ["public.t"])
    start = ensure_slot(conn, "hr")
    stream = ReplicationStream(source_dsn, "hr", "pub", start)
    try:
        stream.read(10, 0.1)
        conn.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 'hr'")
        with pytest.raises(TransientError, match="slot hr"):
            stream.read(10, 2.0)
    finally:
        stream.close()


def test_idle_stream_survives_wal_sender_timeout(conn: psycopg.Connection, source_dsn: str) -> None:
    dbname = conn.info.dbname
    conn.execute(f'ALTER DATABASE "{dbname}" SET wal_sender_timeout = \'2s\'')
    ensure_publication(conn, "pub", ["public.t"])
    start = ensure_slot(conn, "hr")
    with ReplicationStream(source_dsn, "hr", "pub", start, status_interval=1) as stream:
        for _ in range(6):  # 3 s idle, past the 2 s timeout
            assert stream.read(10, 0.5) == []
        conn.execute("INSERT INTO t (id) VALUES (1)")
        assert any(isinstance(e, Insert) for _, e in read_until(stream, Commit))


def test_stream_bounds_what_psycopg2_confirms_on_its_own(conn: psycopg.Connection, source_dsn: str) -> None:
    """psycopg2 answers a keepalive asking for a reply (here: ``wal_sender_timeout / 2`` without
    one) with its flush position forwarded to the keepalive's ``wal_end``, while every message read
    is acknowledged. The slot moves without ``acknowledge``, never beyond ``forwardable``; and not
    at all past a message read but not acknowledged."""
    conn.execute(f'ALTER DATABASE "{conn.info.dbname}" SET wal_sender_timeout = \'1s\'')
    ensure_publication(conn, "pub", ["public.t"])
    start = ensure_slot(conn, "hr")

    def confirmed() -> int:
        row = conn.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'hr'")
        return parse_lsn(row.fetchone()[0])  # type: ignore[index]

    with ReplicationStream(source_dsn, "hr", "pub", start, status_interval=24 * 3600) as stream:
        for i in range(20):
            conn.execute("INSERT INTO u VALUES (%s)", (i,))  # not published: the WAL moves, nothing is sent
        deadline = time.monotonic() + 30
        while confirmed() == start:
            assert time.monotonic() < deadline, "the slot was never confirmed on psycopg2's own"
            assert stream.read(10, 0.2) == []
        assert start < confirmed() <= stream.forwardable

        conn.execute("INSERT INTO t (id) VALUES (1)")
        got = read_until(stream, Commit)  # read, not acknowledged: psycopg2 stops forwarding
        commit = next(lsn for lsn, event in got if isinstance(event, Commit))
        reach = stream.forwardable
        for i in range(20, 40):
            conn.execute("INSERT INTO u VALUES (%s)", (i,))
        for _ in range(10):  # 2 s: past the timeout twice over
            assert stream.read(10, 0.2) == []
        # A reply psycopg2 sent before it read the transaction may land at the server after read_until
        # returned (seen once in CI): the slot may reach what was forwardable then, never the commit.
        assert stream.forwardable == reach and confirmed() <= min(reach, commit)
