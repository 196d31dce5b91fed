"""The facts a staging buffer records as rows go in: counts per op, the latest truncate, TOAST and
old-row flags; their sum and their JSON form (as the log index stores them)."""

from __future__ import annotations

import json

from headrace.core.position import Position
from headrace.log.codec import StagingBuffer
from headrace.log.facts import FileFacts, total


def _buffer(rows: list[tuple[str, int, int, str | None, str | None]]) -> StagingBuffer:
    buf = StagingBuffer()
    for op, lsn, seq, unchanged, old_key in rows:
        buf.append(op, lsn, seq, 0, 1, None if op == "T" else '{"id":"1"}', unchanged, old_key)
    return buf


def test_an_empty_buffer_knows_nothing() -> None:
    assert StagingBuffer().facts == FileFacts() and FileFacts().rows == 0


def test_each_op_is_counted() -> None:
    facts = _buffer([("I", 1, 1, None, None), ("I", 1, 2, None, None), ("U", 2, 1, None, '{"id":"0"}'),
                     ("D", 3, 1, None, None), ("T", 4, 1, None, None)]).facts
    assert (facts.inserts, facts.updates, facts.deletes, facts.truncates, facts.rows) == (2, 1, 1, 1, 5)
    assert not facts.unchanged and not facts.key_toast and not facts.update_without_old


def test_the_latest_truncate_by_position_not_by_arrival() -> None:
    facts = _buffer([("T", 9, 2, None, None), ("I", 9, 3, None, None), ("T", 9, 1, None, None)]).facts
    assert facts.last_truncate == Position(9, 2) and facts.truncates == 2


def test_toast_unchanged_columns_set_the_flag() -> None:
    assert _buffer([("U", 1, 1, "doc", None)]).facts.unchanged
    assert not _buffer([("U", 1, 1, None, None)]).facts.unchanged


def test_a_key_move_leaving_toast_unchanged_is_key_toast() -> None:
    moved = _buffer([("U", 1, 1, "doc", '{"id":"0"}')]).facts
    assert moved.key_toast and moved.unchanged and not moved.update_without_old
    # A key move that sent every column, and an unchanged column without a key move, are not.
    assert not _buffer([("U", 1, 1, None, '{"id":"0"}'), ("U", 2, 1, "doc", None)]).facts.key_toast


def test_an_update_without_old_key_is_recorded() -> None:
    # On a keyed table that is an ordinary update; on a keyless one the old row is missing.
    assert _buffer([("U", 1, 1, None, None)]).facts.update_without_old
    assert not _buffer([("U", 1, 1, None, '{"id":"1","v":"x"}'), ("I", 2, 1, None, None)]).facts.update_without_old


def test_facts_add_up_and_survive_json() -> None:
    a = _buffer([("I", 1, 1, None, None), ("T", 5, 1, None, None)]).facts
    b = _buffer([("U", 7, 1, "doc", '{"id":"0"}'), ("T", 3, 1, None, None)]).facts
    both = a + b
    assert both == total([a, b]) == b + a
    assert (both.rows, both.last_truncate, both.unchanged, both.key_toast) == (4, Position(5, 1), True, True)
    for facts in (FileFacts(), a, b, both):
        assert FileFacts.from_json(json.loads(json.dumps(facts.to_json()))) == facts
    # A newer version's extra fact is ignored by this one.
    assert FileFacts.from_json({**a.to_json(), "something_new": 1}) == a


def test_the_latest_commit_time_is_kept_summed_and_stored() -> None:
    # the status page's lag reads it from here, not from each applied file's footer (a request on S3)
    buf = StagingBuffer()
    for ts in (5_000_000, 9_000_000, 7_000_000):
        buf.append("I", 1, 1, ts, 1, '{"id":"1"}')
    facts = buf.facts
    assert facts.last_commit_us == 9_000_000
    assert (facts + FileFacts(last_commit_us=12_000_000)).last_commit_us == 12_000_000
    assert (facts + FileFacts()).last_commit_us == 9_000_000
    assert FileFacts.from_json(json.loads(json.dumps(facts.to_json()))) == facts
    assert FileFacts.from_json({"inserts": 1}).last_commit_us is None  # a file registered before
