"""Staging a pgoutput change from its bytes (``pgoutput.UNDECODED``, ``headrace._speedups.stage_change``)
stages exactly the row the decoded event stages: every column of the staging schema and the
buffer's byte count, for random tables and messages, and for changes a real server sent. Without
the built module there is no codec and the stream hands over events only (test_replication)."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.capture.buffer import TableBuffer, stage
from headrace.core.changes import UNCHANGED, Begin, Delete, Insert, Streamed, Update, Value
from headrace.core.schema import Column, ColumnType, TableSchema, TypeKind
from headrace.core.undecoded import UndecodedCodec
from headrace.log.codec import StagingBuffer
from headrace.source.postgres import pgoutput
from headrace.source.postgres.pgoutput import MalformedMessage, decode
from tests.pgoutput_wire import tuple_data

speedups = pytest.importorskip("headrace._speedups", reason="headrace._speedups not built (python setup.py build_ext)")
CODEC = pgoutput.UNDECODED
assert CODEC is not None
DECODING = UndecodedCodec(pgoutput.relation_oid, lambda *args: None, CODEC.decode)  # declines every change

OID = 16384
TXN = Begin(final_lsn=0x1_0000_0000, commit_ts_us=1_700_000_000_000_000, xid=771)
TEXT = ColumnType(TypeKind.STRING, "text")

# Text as PostgreSQL sends it never holds NUL; everything else may be in it.
texts = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30),
    st.sampled_from(['', '"', "\\", '\\"', "\n\t\x01\x1f\x7f\b\f\r", "ü€😀", "\u2028\u2029", "\x85", "a" * 70_000]),
)
values = st.one_of(st.none(), texts, st.just(UNCHANGED))


def _schema(ncols: int, key_at: tuple[int, ...]) -> TableSchema:
    names = tuple(f'c{i}"\\é,%'[: 2 + i % 6] + str(i) for i in range(ncols))  # keys that need escaping
    columns = tuple(Column(name, TEXT, 25) for name in names)
    return TableSchema(OID, "public", "t", columns, tuple(names[i] for i in key_at))


def message(op: str, marker: str, old: tuple[Value, ...], new: tuple[Value, ...]) -> bytes:
    head = op.encode() + struct.pack(">I", OID)
    if op == "I":
        return head + b"N" + tuple_data(new)
    if op == "D":
        return head + marker.encode() + tuple_data(old)
    if marker == "N":
        return head + b"N" + tuple_data(new)
    return head + marker.encode() + tuple_data(old) + b"N" + tuple_data(new)


def staged_rows(schema: TableSchema, events: list[object], codec: UndecodedCodec | None = None
                ) -> tuple[list[dict[str, object]], int]:
    buffers: dict[int, TableBuffer] = {}
    added = sum(stage(ev, TXN, seq, {OID: schema}, buffers, codec)  # type: ignore[arg-type]
                for seq, ev in enumerate(events, 1))
    buf = buffers[OID].buffer
    assert added == buf.nbytes
    return buf.to_table().to_pylist(), buf.nbytes


def native(msg: bytes, tb: TableBuffer) -> tuple[int | None, list[tuple[object, ...]]]:
    """The stager's answer for ``msg`` alone, and the rows it appended."""
    buf = StagingBuffer()
    added = CODEC.stage(msg, tb.layout, buf.columns, TXN.final_lsn, 1, TXN.commit_ts_us, TXN.xid)
    return added, list(zip(*buf.columns, strict=True))


@st.composite
def tables_and_messages(draw: st.DrawFn) -> tuple[TableSchema, list[bytes]]:
    ncols = draw(st.integers(1, 7))
    keyless = draw(st.booleans())
    key_at = () if keyless else tuple(sorted(draw(st.sets(st.integers(0, ncols - 1), min_size=1))))
    schema = _schema(ncols, key_at)
    row = st.tuples(*[values] * ncols)
    messages = []
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from("IUD"))
        marker = draw(st.sampled_from("NKO" if op == "U" else "KO"))
        old, new = draw(row), draw(row)
        if marker == "K" and draw(st.booleans()):  # as the server sends it: key columns, NULL elsewhere
            old = tuple(v if i in key_at else None for i, v in enumerate(old))
        if draw(st.booleans()):  # the key unchanged, or the whole row the same
            new = tuple(o if i in key_at or draw(st.booleans()) else v for i, (v, o) in enumerate(zip(new, old, strict=True)))
        messages.append(message(op, marker, old, new))
    return schema, messages


@settings(max_examples=400, deadline=None)
@given(tables_and_messages())
def test_staged_from_bytes_is_staged_from_the_decoded_event(case: tuple[TableSchema, list[bytes]]) -> None:
    schema, messages = case
    expected = staged_rows(schema, [decode(m) for m in messages])
    assert staged_rows(schema, messages, CODEC) == expected  # type: ignore[arg-type]
    assert staged_rows(schema, messages, DECODING) == expected  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 40), st.data())
def test_the_native_stager_declines_only_unchanged_toast_in_the_old_row(ncols: int, data: st.DataObject) -> None:
    """Every well-formed change is staged natively, an unchanged TOAST value in the new row too
    (named in _unchanged_cols, or filled from a FULL old row); only a 'u' in the old row is not."""
    tb = TableBuffer(_schema(ncols, (0,)))
    row = st.tuples(*[st.one_of(st.none(), texts)] * ncols)
    old, new = data.draw(row), data.draw(row)
    for op, marker in (("I", "N"), ("U", "N"), ("U", "K"), ("U", "O"), ("D", "K"), ("D", "O")):
        added, rows = native(message(op, marker, old, new), tb)
        assert added is not None and len(rows) == 1 and rows[0][0] == op and rows[0][5] is None
    toasted = (UNCHANGED, *new[1:])
    for marker, unchanged in (("N", tb.layout[4][0]), ("K", tb.layout[4][0]), ("O", None)):
        added, rows = native(message("U", marker, old, toasted), tb)
        assert added is not None and rows[0][5] == unchanged
    assert native(message("U", "K", toasted, new), tb) == (None, [])
    assert native(message("D", "O", toasted, new), tb) == (None, [])


def test_odd_messages_are_left_to_the_decoder_and_its_errors() -> None:
    schema = _schema(2, (0,))
    tb = TableBuffer(schema)
    good = message("I", "N", (), ("1", "x"))
    data = json.dumps(dict(zip(schema.column_names, ("1", "x"), strict=True)), separators=(",", ":"))
    assert native(good, tb) == (48 + len(data), [("I", TXN.final_lsn, 1, TXN.commit_ts_us, TXN.xid, None, data, None)])
    for cut in range(6, len(good)):  # truncated: declined, and decoding names it
        assert native(good[:cut], tb) == (None, [])
        with pytest.raises(MalformedMessage):
            stage(good[:cut], TXN, 1, {OID: schema}, {}, CODEC)
    assert native(message("I", "N", (), ("1",)), tb) == (None, [])  # a column count not the relation's
    not_utf8 = b"I" + struct.pack(">I", OID) + b"N\x00\x02t\x00\x00\x00\x011t\x00\x00\x00\x01\xff"
    assert native(not_utf8, tb) == (None, [])
    with pytest.raises(MalformedMessage, match="not UTF-8"):
        stage(not_utf8, TXN, 1, {OID: schema}, {}, CODEC)
    assert native(b"I" + struct.pack(">I", OID) + b"X\x00\x00", tb) == (None, [])  # not 'N'
    assert native(b"I" + struct.pack(">I", OID) + b"N\x00\x02b\x00\x00\x00\x011n", tb) == (None, [])  # binary
    assert stage(good, TXN, 1, {}, {}, CODEC) == 0  # not this pipeline's table
    with pytest.raises(TypeError):
        speedups.stage_change(good, tb.layout, (), 1, 1, 1, 1)
    with pytest.raises(TypeError):
        speedups.stage_change(good, tb.layout[:4], tuple(StagingBuffer().columns), 1, 1, 1, 1)
    # inside a streamed block the xid comes first: stage_streamed_change is stage_change at 5
    streamed = good[:1] + struct.pack(">I", 901) + good[1:]
    a, b = StagingBuffer(), StagingBuffer()
    assert speedups.stage_streamed_change(streamed, tb.layout, tuple(a.columns), 1, 2, 3, 4) == \
        speedups.stage_change(streamed, tb.layout, tuple(b.columns), 1, 2, 3, 4, 5)
    assert a.columns == b.columns and len(a.columns[0]) == 1
    with pytest.raises(TypeError):
        speedups.stage_streamed_change(streamed, tb.layout, tuple(a.columns), 1, 2, 3, 4, 5)


# Real bytes from the server: REPLICA IDENTITY FULL, key moves, unchanged TOAST, keyless tables.
@pytest.fixture
def conn(source_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(source_dsn, autocommit=True, options="-c synchronous_commit=on") as c:
        c.execute("CREATE TABLE k (id int, sub text, doc text, n int, PRIMARY KEY (id, sub))")
        c.execute("CREATE TABLE f (id int PRIMARY KEY, doc text, n int)")
        c.execute("ALTER TABLE f REPLICA IDENTITY FULL")
        c.execute("CREATE TABLE nk (a text, doc text)")
        c.execute("ALTER TABLE nk REPLICA IDENTITY FULL")
        c.execute("CREATE PUBLICATION p FOR TABLE k, f, nk")
        c.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        yield c


def test_server_changes_stage_alike_from_bytes_and_from_events(conn: psycopg.Connection) -> None:
    big = "".join(chr(0x20 + (i * 7919) % 0x2000) for i in range(300_000))  # TOASTed, incompressible-ish
    for t in ("k", "f"):
        conn.execute(f"ALTER TABLE {t} ALTER COLUMN doc SET STORAGE EXTERNAL")
    conn.execute("INSERT INTO k VALUES (1, 'a', %s, 1), (2, 'b\"\\\n', NULL, 2), (3, '', 'x\u2028y', 3)", (big,))
    conn.execute("INSERT INTO f VALUES (1, %s, 1), (2, 'small', 2)", (big,))
    conn.execute("INSERT INTO nk VALUES ('x', 'y'), ('x', 'y'), (NULL, '😀')")
    conn.execute("UPDATE k SET n = n + 10")  # 'u' for the TOASTed doc of row 1: _unchanged_cols
    conn.execute("UPDATE k SET sub = sub || '!' WHERE id = 2")  # a key move: old key sent
    conn.execute("UPDATE k SET n = 0, doc = 'é' WHERE id = 3")
    conn.execute("UPDATE f SET n = n + 1")  # FULL: the old row fills the unchanged TOAST value
    conn.execute("UPDATE f SET id = 5 WHERE id = 2")
    conn.execute("UPDATE nk SET doc = 'z' WHERE a IS NULL")
    conn.execute("DELETE FROM k WHERE id = 2")
    conn.execute("DELETE FROM f")
    conn.execute("DELETE FROM nk WHERE a = 'x'")
    rows = conn.execute(
        "SELECT data FROM pg_logical_slot_peek_binary_changes('s', NULL, NULL, 'proto_version', '1',"
        " 'publication_names', 'p')").fetchall()
    msgs = [bytes(r[0]) for r in rows]
    schemas = {}
    for m in msgs:
        if m[:1] == b"R":
            rel = decode(m)
            key = tuple(c.name for c in rel.columns if c.is_key) if rel.name == "k" else (("id",) if rel.name == "f" else ())  # type: ignore[union-attr]
            schemas[rel.oid] = TableSchema(rel.oid, rel.namespace, rel.name,  # type: ignore[union-attr]
                                           tuple(Column(c.name, TEXT, c.type_oid) for c in rel.columns), key)  # type: ignore[union-attr]
    changes = [m for m in msgs if m[:1] in (b"I", b"U", b"D")]
    assert len(changes) == 8 + 3 + 2 + 1 + 3 + 2 + 1 + 2
    natively = sum(isinstance(decode(m), Insert | Update | Delete)
                   and native(m, TableBuffer(schemas[pgoutput.relation_oid(m)]))[0] is not None for m in changes)
    assert natively == len(changes)

    def staged(events: list[object]) -> dict[int, list[dict[str, object]]]:
        buffers: dict[int, TableBuffer] = {}
        total = sum(stage(ev, TXN, seq, schemas, buffers, CODEC)  # type: ignore[arg-type]
                    for seq, ev in enumerate(events, 1))
        assert total == sum(tb.buffer.nbytes for tb in buffers.values())
        return {oid: tb.buffer.to_table().to_pylist() for oid, tb in buffers.items()}

    expected = staged([decode(m) for m in changes])
    assert staged(changes) == expected  # type: ignore[arg-type]
    k_rows = next(rows for oid, rows in expected.items() if schemas[oid].name == "k")
    assert [r["_unchanged_cols"] for r in k_rows if r["_op"] == "U"][:3] == ["doc", None, None]
    f_rows = next(rows for oid, rows in expected.items() if schemas[oid].name == "f")
    assert any(r["_op"] == "U" and r["_unchanged_cols"] is None
               and json.loads(str(r["_data"]))["doc"] == big for r in f_rows)


@settings(max_examples=200, deadline=None)
@given(tables_and_messages(), st.integers(0, 2**32 - 1))
def test_staged_inside_a_streamed_block_is_staged_as_outside(case: tuple[TableSchema, list[bytes]], xid: int) -> None:
    """Inside a block of a streamed transaction (protocol 2) each change carries its subtransaction's
    xid after the kind byte: the same rows, natively and decoded, and the xid read back."""
    schema, messages = case
    inside = [m[:1] + struct.pack(">I", xid) + m[1:] for m in messages]
    streamed = CODEC.streamed
    assert streamed is not None and streamed.xid is not None
    expected = staged_rows(schema, messages, CODEC)  # type: ignore[arg-type]
    assert staged_rows(schema, inside, streamed) == expected  # type: ignore[arg-type]
    assert [streamed.xid(m) for m in inside] == [xid] * len(inside)
    assert [decode(m, streamed=True) for m in inside] == [Streamed(xid, decode(m)) for m in messages]
