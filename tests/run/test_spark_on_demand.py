"""The run's on-demand Spark session: nothing starts it until something reads from it, then it is
the session itself, started once whichever threads ask at the same moment."""

from __future__ import annotations

import threading
from typing import Any

from headrace.engines.spark.on_demand import SparkOnDemand


def test_the_session_starts_on_first_use_and_once(spark: Any) -> None:
    starts: list[int] = []
    gate = threading.Barrier(4)

    def start() -> Any:
        starts.append(1)
        return spark

    lazy = SparkOnDemand(start)
    assert not lazy.started and starts == []  # made, handed out: not started
    seen: list[Any] = []

    def use() -> None:
        gate.wait()
        seen.append(lazy.sparkContext)

    threads = [threading.Thread(target=use) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert lazy.started and starts == [1]
    assert all(sc is spark.sparkContext for sc in seen)
    assert lazy.range(3).count() == 3  # the session's own methods, on the session


def test_a_background_start_then_a_warm_up_once_and_it_says_when_it_is_warm(spark: Any) -> None:
    release = threading.Event()
    warmed: list[Any] = []

    def warm_up(session: Any) -> None:
        warmed.append(session)
        release.wait(30)

    lazy = SparkOnDemand(lambda: spark, warm_up)
    assert not lazy.wait_warm(0)  # not started: a job now would pay the start
    lazy.start_in_background()
    lazy.start_in_background()  # under way already: nothing more
    lazy.warm_in_background()
    lazy.warm_in_background()  # once
    assert not lazy.wait_warm(0.05)  # warming
    release.set()
    assert lazy.wait_warm(30) and lazy.started
    assert warmed == [spark]
    lazy.warm_in_background()
    assert warmed == [spark]


def test_a_failed_warm_up_leaves_a_warm_working_session_and_a_handed_in_one_is_warm(spark: Any) -> None:
    def warm_up(session: Any) -> None:
        raise RuntimeError("no workers")

    lazy = SparkOnDemand(lambda: spark, warm_up)
    lazy.warm_in_background()
    assert lazy.wait_warm(30)  # the copy goes on with Spark's jobs
    assert lazy.range(2).count() == 2
    assert SparkOnDemand(lambda: spark).wait_warm(0)  # nothing to warm: Spark's jobs from the first group
