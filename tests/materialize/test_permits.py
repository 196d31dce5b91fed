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
