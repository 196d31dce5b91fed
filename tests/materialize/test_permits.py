"""Connection permits of the initial copy: never more than the total held, first come first served."""

from __future__ import annotations

import threading

import pytest

from headrace.materialize.permits import Permits


def test_permits_never_exceed_the_total_and_a_big_request_is_not_starved() -> None:
    permits = Permits(3)
    held = 0
    most = 0
    lock = threading.Lock()
    order: list[str] = []
    first = threading.Event()

    def use(name: str, count: int, hold: threading.Event | None = None) -> None:
        nonlocal held, most
        with permits.take(count):
            with lock:
                held += count
                most = max(most, held)
                order.append(name)
            first.set()
            if hold is not None:
                hold.wait(5)
            with lock:
                held -= count

    release = threading.Event()
    small = threading.Thread(target=use, args=("small", 2, release))
    small.start()
    first.wait(5)
    big = threading.Thread(target=use, args=("big", 3))
    big.start()
    # Queued behind the big request even though one permit is free: first come first served.
    late = threading.Thread(target=use, args=("late", 1))
    while not permits._queue:  # the big request is waiting
        threading.Event().wait(0.001)
    late.start()
    while len(permits._queue) < 2:  # both wait: the late one could fit, but the big one came first
        threading.Event().wait(0.001)
    release.set()
    for t in (small, big, late):
        t.join(5)
    assert order == ["small", "big", "late"]
    assert most <= 3


def test_permits_refuse_a_request_above_the_total() -> None:
    with pytest.raises(ValueError, match="cannot take 4 of 3"), Permits(3).take(4):
        pass


class CountedSession:
    """A stand-in driver session (``ChunkSession``) that counts how many are open at once."""

    open_now = 0
    opened = 0

    def __init__(self) -> None:
        CountedSession.open_now += 1
        CountedSession.opened += 1
        self.broken = False
        self.closed = False

    def read(self, table: object, start: int, end: int) -> list[object]:
        return []

    def close(self) -> None:
        self.closed = True
        CountedSession.open_now -= 1


def test_sessions_are_parked_and_reused_and_count_as_connections() -> None:
    CountedSession.open_now = CountedSession.opened = 0
    permits = Permits(3)
    for _ in range(5):  # one after another: one session serves every read
        with permits.session(CountedSession) as session:
            pass
    assert CountedSession.opened == 1 and CountedSession.open_now == 1
    with permits.session(CountedSession) as held, permits.session(CountedSession):
        assert held is session  # the parked one first, then a second opened beside it
        with permits.take(1):  # one permit stays for planning: sessions stop one below the total
            pass
    assert CountedSession.opened == 2
    with permits.take(2):  # a group of two: the free permit and one parked session's
        assert CountedSession.open_now == 1
    with permits.take(3):  # every permit: no session left open
        assert CountedSession.open_now == 0
    with permits.session(CountedSession) as session:
        session.broken = True  # a failed read: closed, not parked
    assert session.closed and CountedSession.open_now == 0
    with permits.session(CountedSession):
        pass
    permits.close_parked()
    assert CountedSession.open_now == 0
    with permits.take(3):  # every permit is back
        pass


def test_a_session_in_use_is_not_taken_from_its_reader_and_a_waiter_gets_its_permit_next() -> None:
    CountedSession.open_now = CountedSession.opened = 0
    permits = Permits(1)
    closed_when_taken: list[bool] = []

    def take_the_permit() -> None:
        with permits.take(1):
            closed_when_taken.append(first.closed)

    with permits.session(CountedSession) as first:
        waiter = threading.Thread(target=take_the_permit)
        waiter.start()
        while not permits._queue:
            threading.Event().wait(0.001)
        assert not first.closed and closed_when_taken == []  # waits for the read to end
    waiter.join(5)
    assert closed_when_taken == [True] and CountedSession.open_now == 0
