"""Streamed transactions' spill (``capture.spill``): what a Stream Commit registers is what the
transaction kept (a rolled-back subtransaction's rows left out, the commit's position on every row),
and an aborted transaction leaves no file behind."""

from __future__ import annotations

import json
from pathlib import Path

from headrace.capture.spill import StreamedTransactions, table_facts
from headrace.core.changes import (
    Insert,
    Relation,
    RelationColumn,
    StreamAbort,
    StreamCommit,
    Streamed,
    StreamStart,
    StreamStop,
)
from headrace.core.schema import Column, ColumnType, TableSchema, TypeKind
from headrace.log.codec import StagingBuffer, read_staging_file
from headrace.log.store import StagingStore

OID = 16400
SCHEMA = TableSchema(OID, "public", "t", (Column("id", ColumnType(TypeKind.LONG, "bigint"), 20),
                                          Column("v", ColumnType(TypeKind.STRING, "text"), 25)), ("id",))
REL = Relation(OID, "public", "t", "d", (RelationColumn("id", 20, -1, True), RelationColumn("v", 25, -1, False)))


def _streamed(tmp_path: Path, limit: int) -> StreamedTransactions:
    return StreamedTransactions(tmp_path / "spill", {}, lambda ev: SCHEMA, None, limit)


def _block(streamed: StreamedTransactions, xid: int, first: bool, rows: list[tuple[int, int]]) -> None:
    """One block of ``xid``: a RELATION, then an insert per (subxid, id)."""
    assert streamed.message(StreamStart(xid, first))
    streamed.message(Streamed(xid, REL))
    for subxid, key in rows:
        streamed.message(Streamed(subxid, Insert(OID, (str(key), "x" * 50))))
    assert not streamed.message(StreamStop())


def test_commit_keeps_what_the_transaction_kept_at_its_commit_position(tmp_path: Path) -> None:
    streamed = _streamed(tmp_path, limit=2_000)  # spills every ~20 rows
    _block(streamed, 500, True, [(500, k) for k in range(100)])
    _block(streamed, 600, True, [(600, 1000)])  # another transaction, aborted whole
    _block(streamed, 500, False, [(501, k) for k in range(100, 150)] + [(502, k) for k in range(150, 160)])
    streamed.message(StreamAbort(500, 501))  # the savepoint of 100..149 rolled back
    streamed.message(StreamAbort(600, 600))
    assert not (tmp_path / "spill" / "600").exists()
    assert len(list((tmp_path / "spill" / "500").iterdir())) > 3
    _block(streamed, 500, False, [(500, 160)])
    committed = streamed.commit(StreamCommit(500, 0x2000, 0x2100, 1_700_000_000_000_000))
    assert committed is not None and committed.relations == {OID: SCHEMA}
    store = StagingStore.open(tmp_path / "staging")
    files = committed.finish(store, 30)
    rows = [r for f in files for r in read_staging_file(f.path).to_pylist()]
    assert sorted(int(json.loads(r["_data"])["id"]) for r in rows) == [*range(100), *range(150, 161)]
    assert {(r["_lsn"], r["_xid"], r["_op"]) for r in rows} == {(0x2000, 500, "I")}
    seqs = [r["_seq"] for r in rows]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert all(f.min_lsn == f.max_lsn == 0x2000 and f.facts is not None for f in files)
    assert sum(f.rows for f in files) == len(rows) == 111 and max(f.rows for f in files) <= 30
    committed.discard()
    assert not (tmp_path / "spill" / "500").exists()
    streamed.close()
    assert not (tmp_path / "spill").exists()


def test_facts_counted_by_arrow_are_the_facts_of_the_rows() -> None:
    buf = StagingBuffer()
    for op, seq, unchanged, old_key in [("I", 1, None, None), ("U", 2, "c", None), ("U", 3, None, '{"id":"1"}'),
                                         ("U", 4, "c", '{"id":"2"}'), ("T", 5, None, None), ("D", 6, None, None),
                                         ("T", 7, None, None)]:
        buf.append(op, 9, seq, 0, 1, "{}", unchanged, old_key)
    assert table_facts(buf.to_table()) == buf.facts
    only_inserts = StagingBuffer()
    only_inserts.append("I", 9, 1, 0, 1, "{}")
    assert table_facts(only_inserts.to_table()) == only_inserts.facts


def test_rows_of_subtransactions_that_alternate_keep_their_own(tmp_path: Path) -> None:
    """Subtransaction xids are kept per row as runs: changes of a savepoint rolled back are left out
    however they interleave with the rest, in memory (no spill) and across spills."""
    for limit in (1_000_000, 300):
        streamed = _streamed(tmp_path / str(limit), limit=limit)
        order = [500, 501, 501, 500, 502, 501, 502, 500, 500, 501]
        _block(streamed, 500, True, [(subxid, key) for key, subxid in enumerate(order)])
        streamed.message(StreamAbort(500, 501))
        committed = streamed.commit(StreamCommit(500, 0x2000, 0x2100, 1_700_000_000_000_000))
        assert committed is not None
        files = committed.finish(StagingStore.open(tmp_path / str(limit) / "staging"), 100)
        kept = sorted(int(json.loads(r["_data"])["id"]) for f in files for r in read_staging_file(f.path).to_pylist())
        assert kept == [key for key, subxid in enumerate(order) if subxid != 501]
        committed.discard()
        streamed.close()
