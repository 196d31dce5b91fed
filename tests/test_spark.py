"""The task slots a local master gives, known before its session starts (the copy's driver threads
copy on those cores while it starts)."""

from __future__ import annotations

import os

from headrace.engines.spark.session import local_cores


def test_local_masters_give_their_cores_and_other_masters_none() -> None:
    every = len(os.sched_getaffinity(0))
    assert local_cores("local") == 1
    assert local_cores("local[3]") == 3
    assert local_cores("local[*]") == every
    assert local_cores("local[2, 4]") == 2  # local[N, maxFailures]
    assert local_cores("local[*]", {"spark.default.parallelism": "5"}) == 5
    for cluster in ("spark://10.0.0.1:7077", "yarn", "k8s://https://api:6443", "local-cluster[2,1,1024]"):
        assert local_cores(cluster) is None
        assert local_cores(cluster, {"spark.default.parallelism": "8"}) is None  # still a cluster
