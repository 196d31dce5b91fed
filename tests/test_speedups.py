"""The optional native helpers (``headrace/_speedups.c``) give exactly what the Python code gives:
the same JSON bytes as ``json.dumps(..., ensure_ascii=False)`` and the same decoded tuples and
errors. Without the built module, the Python paths are the ones under test (and still checked)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.core.changes import UNCHANGED, StreamCommit, Streamed
from headrace.core.errors import UnsupportedError
from headrace.log import codec
from headrace.source.postgres import pgoutput
from tests.pgoutput_wire import tuple_data

speedups = pytest.importorskip("headrace._speedups", reason="headrace._speedups not built (python setup.py build_ext)")

# Text as PostgreSQL sends it never holds NUL, but every other character may be in it.
texts = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)
values = st.lists(st.one_of(st.none(), texts, st.sampled_from(['"', "\\", "\n\t\x01\x1f\x7f", "ü€😀"])),
                  min_size=0, max_size=8)


@settings(max_examples=300, deadline=None)
@given(values)
def test_native_json_is_byte_for_byte_json_dumps(row: list[str | None]) -> None:
    names = tuple(f"c{i}\"é" for i in range(len(row)))  # keys that need escaping too
    keys = codec.RowEncoder(names).keys
    expected = json.dumps(dict(zip(names, row, strict=True)), ensure_ascii=False, separators=(",", ":"))
    assert speedups.encode_object(keys, tuple(row)) == expected
    assert speedups.encode_object(keys, row) == expected  # a list of values too
    with pytest.MonkeyPatch.context() as patch:  # and the Python join, the module not used
        patch.setattr(codec, "_native_object", None)
        assert codec.encode_row(names, row) == (expected, None)


def test_native_json_leaves_unchanged_rows_to_python() -> None:
    keys = codec.RowEncoder(("id", "doc")).keys
    assert speedups.encode_object(keys, ("1", UNCHANGED)) is None
    assert codec.encode_row(("id", "doc"), ("1", UNCHANGED)) == ('{"id":"1"}', "doc")
    with pytest.raises(ValueError, match="2 columns"):
        codec.encode_row(("id", "doc"), ("1",))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.none(), texts, st.just(UNCHANGED)), max_size=8), st.binary(max_size=3))
def test_native_tuple_decodes_as_python_does(row: list[str | None | object], tail: bytes) -> None:
    buf = b"I\x00\x00\x00\x01N" + tuple_data(row) + tail
    native = speedups.decode_tuple(buf, 6, UNCHANGED)
    assert native == pgoutput._python_tuple(buf, 6) == (tuple(row), len(buf) - len(tail))
    assert native[0].count(UNCHANGED) == sum(v is UNCHANGED for v in row)  # the marker itself, not a copy


def test_native_tuple_errors_are_the_decoders() -> None:
    buf = b"I\x00\x00\x00\x01N" + tuple_data(["1", "two"])
    for cut in range(7, len(buf)):  # every truncation is a MalformedMessage
        with pytest.raises(pgoutput.MalformedMessage):
            pgoutput.decode(buf[:cut])
    binary = b"I\x00\x00\x00\x01N\x00\x01b\x00\x00\x00\x01x"
    assert speedups.decode_tuple(binary, 6, UNCHANGED) is None  # left to Python, which names it
    with pytest.raises(UnsupportedError, match="binary"):
        pgoutput.decode(binary)
    with pytest.raises(pgoutput.MalformedMessage, match="not UTF-8"):
        pgoutput.decode(b"I\x00\x00\x00\x01N\x00\x01t\x00\x00\x00\x01\xff")


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(b"SEcAIUDRTYM"), st.binary(max_size=40))
def test_native_stream_head_reads_what_python_reads(kind: int, tail: bytes) -> None:
    """Stream Start, Stop, Commit, Abort and the xid of a message inside a streamed block: the same
    fields (or None for a message too short) from C and from Python, for any bytes."""
    buf = bytes([kind]) + tail
    assert speedups.stream_head(buf) == pgoutput.python_stream_head(buf)


def test_streamed_messages_decode_with_their_xid() -> None:
    insert = b"I\x00\x00\x00\x01N" + tuple_data(["1", None])
    streamed = insert[:1] + (7).to_bytes(4, "big") + insert[1:]
    assert pgoutput.decode(streamed, streamed=True) == Streamed(7, pgoutput.decode(insert))
    commit = b"c" + (7).to_bytes(4, "big") + b"\x00" + (16).to_bytes(8, "big") + (24).to_bytes(8, "big") + bytes(8)
    assert pgoutput.decode(commit, streamed=True) == StreamCommit(7, 16, 24, pgoutput.PG_EPOCH_OFFSET_US)
    for cut in range(1, len(commit)):
        with pytest.raises(pgoutput.MalformedMessage):
            pgoutput.decode(commit[:cut])
