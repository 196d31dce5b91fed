"""The run's on-demand Spark session: nothing starts it until something reads from it, then it is
the session itself, started once whichever threads ask at the same moment."""

from __future__ import annotations

import threading
from typing import Any

from headrace.run.spark_on_demand import SparkOnDemand


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
