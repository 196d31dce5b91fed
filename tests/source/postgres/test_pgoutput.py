"""The pgoutput decoder against real bytes from the server (pg_logical_slot_peek_binary_changes)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import datetime, timezone

import psycopg
import pytest

from headrace.core.changes import (
    UNCHANGED,
    Begin,
    Commit,
    Delete,
    Event,
    Insert,
    Message,
    Relation,
    StreamAbort,
    StreamCommit,
    Streamed,
    StreamStart,
    StreamStop,
    Truncate,
    Update,
)
from headrace.source.postgres.pgoutput import MalformedMessage, decode


@pytest.fixture
def conn(source_dsn: str) -> Iterator[psycopg.Connection]:
    # The test server runs with synchronous_commit=off, and logical decoding only reads WAL that
    # is flushed: commit synchronously so peeking right after a change sees it.
    with psycopg.connect(source_dsn, autocommit=True, options="-c synchronous_commit=on") as c:
        c.execute("CREATE TABLE t (id int PRIMARY KEY, txt text, n int)")
        c.execute("CREATE PUBLICATION p FOR TABLE t")
        c.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        yield c


def peek(conn: psycopg.Connection) -> list[bytes]:
    rows = conn.execute(
        "SELECT data FROM pg_logical_slot_peek_binary_changes('s', NULL, NULL, 'proto_version', '1',"
        " 'publication_names', 'p', 'messages', 'true')"
    ).fetchall()
    return [bytes(r[0]) for r in rows]


def events(conn: psycopg.Connection) -> list[Event]:
    return [e for e in (decode(m) for m in peek(conn)) if e is not None]


def changes(conn: psycopg.Connection) -> list[Event]:
    return [e for e in events(conn) if not isinstance(e, Begin | Commit | Relation)]


def test_transaction_frame_relation_and_insert(conn: psycopg.Connection) -> None:
    before = datetime.now(timezone.utc).timestamp() * 1e6
    with conn.transaction():
        xid = conn.execute("SELECT txid_current()").fetchone()[0]  # type: ignore[index]
        conn.execute("INSERT INTO t VALUES (1, 'a', NULL), (2, '', 7), (3, 'żółw 🐢 ✓', -1)")
    lsn_text = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]  # type: ignore[index]
    evs = events(conn)
    begin, rel, *inserts, commit = evs
    assert isinstance(begin, Begin) and isinstance(commit, Commit)
    assert begin.xid == xid
    assert begin.final_lsn == commit.commit_lsn < commit.end_lsn
    assert begin.commit_ts_us == commit.commit_ts_us
    assert abs(begin.commit_ts_us - before) < 60e6  # µs since the Unix epoch, not since 2000
    assert lsn_text  # sanity: the server is up
    assert isinstance(rel, Relation)
    assert (rel.namespace, rel.name, rel.replica_identity) == ("public", "t", "d")
    assert [(c.name, c.type_oid, c.typmod, c.is_key) for c in rel.columns] == [
        ("id", 23, -1, True), ("txt", 25, -1, False), ("n", 23, -1, False),
    ]
    assert inserts == [
        Insert(rel.oid, ("1", "a", None)),
        Insert(rel.oid, ("2", "", "7")),  # empty string is not NULL
        Insert(rel.oid, ("3", "żółw 🐢 ✓", "-1")),
    ]


def test_update_delete_key_change_and_toast(conn: psycopg.Connection) -> None:
    big = os.urandom(8000).hex()  # 16 KB of random hex: too big to inline, hard to compress
    conn.execute("INSERT INTO t VALUES (1, %s, 0), (2, 'x', 0)", (big,))
    conn.execute("SELECT pg_replication_slot_advance('s', pg_current_wal_lsn())")
    conn.execute("UPDATE t SET n = 1 WHERE id = 1")  # TOASTed txt untouched → 'u'
    conn.execute("UPDATE t SET id = 20 WHERE id = 2")  # key change → 'K' old tuple
    conn.execute("DELETE FROM t WHERE id = 20")
    oid = conn.execute("SELECT 't'::regclass::oid").fetchone()[0]  # type: ignore[index]
    assert changes(conn) == [
        Update(oid, ("1", UNCHANGED, "1")),
        Update(oid, ("20", "x", "0"), old=("2", None, None), old_kind="K"),
        Delete(oid, ("20", None, None), "K"),
    ]


def test_replica_identity_full_sends_whole_old_row(conn: psycopg.Connection) -> None:
    conn.execute("ALTER TABLE t REPLICA IDENTITY FULL")
    conn.execute("INSERT INTO t VALUES (1, 'a', NULL)")
    conn.execute("SELECT pg_replication_slot_advance('s', pg_current_wal_lsn())")
    conn.execute("UPDATE t SET txt = 'b'")
    conn.execute("DELETE FROM t")
    evs = events(conn)
    rel = next(e for e in evs if isinstance(e, Relation))
    assert rel.replica_identity == "f"
    assert all(c.is_key for c in rel.columns)  # FULL flags every column as key
    assert [e for e in evs if isinstance(e, Update | Delete)] == [
        Update(rel.oid, ("1", "b", None), old=("1", "a", None), old_kind="O"),
        Delete(rel.oid, ("1", "b", None), "O"),
    ]


def test_truncate_and_message(conn: psycopg.Connection) -> None:
    conn.execute("CREATE TABLE u (id int PRIMARY KEY)")
    conn.execute("ALTER PUBLICATION p ADD TABLE u")
    conn.execute("TRUNCATE t, u RESTART IDENTITY")
    # A non-transactional message has no commit to flush its WAL: the transactional one after it does.
    conn.execute("SELECT pg_logical_emit_message(false, 'other', '\\x00ff'::bytea)")
    conn.execute("SELECT pg_logical_emit_message(true, 'headrace', 'hi')")
    oids = conn.execute("SELECT 't'::regclass::oid, 'u'::regclass::oid").fetchone()
    evs = changes(conn)
    truncate = next(e for e in evs if isinstance(e, Truncate))
    assert set(truncate.relation_oids) == set(oids)  # type: ignore[arg-type]
    assert truncate.restart_identity and not truncate.cascade
    messages = [e for e in evs if isinstance(e, Message)]
    assert [(m.transactional, m.prefix, m.content) for m in messages[:2]] == [
        (False, "other", b"\x00\xff"), (True, "headrace", b"hi"),
    ]
    assert messages[0].lsn > 0


def test_type_message_is_ignored_and_memoryview_accepted(conn: psycopg.Connection) -> None:
    conn.execute("CREATE TYPE mood AS ENUM ('ok', 'sad')")
    conn.execute("ALTER TABLE t ADD COLUMN m mood")
    conn.execute("INSERT INTO t VALUES (1, 'a', 1, 'sad')")
    raw = peek(conn)
    assert chr(raw[1][0]) == "Y"  # a TYPE message precedes the RELATION for a non-builtin type
    assert decode(memoryview(raw[1])) is None
    assert decode(memoryview(raw[3])) == decode(raw[3])
    assert isinstance(decode(raw[3]), Insert)


def test_malformed_messages_are_rejected(conn: psycopg.Connection) -> None:
    conn.execute("INSERT INTO t VALUES (1, 'abc', 1)")
    insert = peek(conn)[2]
    for bad in (b"", b"Z123", insert[:-2], b"B\x00"):
        with pytest.raises(MalformedMessage):
            decode(bad)


def test_decode_speed(conn: psycopg.Connection) -> None:
    """Not asserted: prints the decode rate on ~100k real messages."""
    conn.execute("ALTER TABLE t ADD COLUMN ts timestamptz DEFAULT now(), ADD COLUMN amount numeric(12,2)")
    conn.execute("INSERT INTO t SELECT g, md5(g::text), g, now(), g / 7.0 FROM generate_series(1, 50000) g")
    conn.execute("UPDATE t SET n = n + 1 WHERE id <= 50000")
    raw = peek(conn)
    assert len(raw) > 100_000
    wall, cpu = time.perf_counter(), time.process_time()
    for m in raw:
        decode(m)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(f"\npgoutput decode: {len(raw)} messages, {len(raw) / wall:,.0f} msg/s wall, {len(raw) / cpu:,.0f} msg/s CPU")


def test_streamed_transaction_blocks_subtransactions_and_commit(conn: psycopg.Connection) -> None:
    """Protocol 2 with streaming on, the session's logical_decoding_work_mem at its floor: a
    transaction over 64kB comes in Stream Start ... Stop blocks whose messages carry their
    (sub)transaction's xid, a rolled-back savepoint as a Stream Abort of its subxact, then a Stream
    Commit at the commit's position."""
    conn.execute("SET logical_decoding_work_mem = '64kB'")
    with conn.transaction():
        xid = conn.execute("SELECT txid_current()").fetchone()[0]  # type: ignore[index]
        conn.execute("INSERT INTO t SELECT g, repeat('x', 100), g FROM generate_series(1, 2000) g")
        with pytest.raises(psycopg.errors.DivisionByZero), conn.transaction():  # a savepoint rolled back
            conn.execute("INSERT INTO t SELECT g, 'rolled back', g FROM generate_series(2001, 4000) g")
            conn.execute("SELECT 1 / 0")
    rows = conn.execute(
        "SELECT data FROM pg_logical_slot_peek_binary_changes('s', NULL, NULL, 'proto_version', '2',"
        " 'publication_names', 'p', 'streaming', 'on')").fetchall()
    in_block, evs = False, []
    for (data,) in rows:
        ev = decode(bytes(data), in_block)
        in_block = isinstance(ev, StreamStart) or (in_block and not isinstance(ev, StreamStop))
        evs.append(ev)
    starts = [e for e in evs if isinstance(e, StreamStart)]
    assert len(starts) >= 2 and starts[0] == StreamStart(xid, True) and not any(s.first for s in starts[1:])
    assert len(starts) == sum(isinstance(e, StreamStop) for e in evs)
    inside = [e for e in evs if isinstance(e, Streamed)]
    subxids = {e.xid for e in inside} - {xid}
    assert len(subxids) == 1  # the savepoint's subtransaction
    assert [e for e in evs if isinstance(e, StreamAbort)] == [StreamAbort(xid, subxids.pop())]
    kept = [e.event for e in inside if e.xid == xid and isinstance(e.event, Insert)]
    assert [int(i.new[0]) for i in kept] == list(range(1, 2001))
    assert isinstance(evs[-1], StreamCommit) and evs[-1].xid == xid and evs[-1].commit_lsn < evs[-1].end_lsn
