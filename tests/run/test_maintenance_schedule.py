"""When a table is due for maintenance (``run.maintenance.MaintenanceSchedule``): after ``every_minutes``
and ``after_batches`` both, or after ``max_batches`` whenever its last pass was, or at once after a
copy the target wants maintained (``copied``)."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from headrace.run.maintenance import MaintenanceSchedule
from tests.e2e.helpers import make_config


def test_a_busy_table_is_due_after_max_batches_however_recent_its_last_pass(tmp_path: Path) -> None:
    config = make_config("postgresql://127.0.0.1:1/x", tmp_path, ["public.t"], "ducklake",
                         maintenance={"every_minutes": 60, "after_batches": 5, "max_batches": 20})
    schedule = MaintenanceSchedule(config, "postgresql://127.0.0.1:1/x")
    now = time.monotonic()
    schedule.last_pass[7] = now  # just maintained
    for _ in range(19):
        schedule.batch_applied(7)
    assert not schedule._due(7, now)  # 19 batches, within the hour
    assert schedule._due(7, now + 3601)  # the hour passed, and more than after_batches
    # Past after_batches but not due: the loop's step does not read the tables to find out.
    unread: Any = SimpleNamespace(tables=lambda: pytest.fail("the tables were read"))
    uncapped: Any = SimpleNamespace(caps_snapshots=False)
    assert schedule.step(unread, uncapped) is False
    schedule.batch_applied(7)
    assert schedule._due(7, now)  # 20 batches: due at once


def test_snapshots_are_capped_every_half_max_snapshots_batches_on_a_target_that_caps_them(tmp_path: Path) -> None:
    """Between full passes, a table's snapshots are capped after ``max_snapshots / 2`` batches (a cheap
    step, in the maintenance thread); a target that keeps no per-table snapshots is never asked."""
    config = make_config("postgresql://127.0.0.1:1/x", tmp_path, ["public.t"], "ducklake",
                         maintenance={"after_batches": 1000, "max_batches": 1000, "max_snapshots": 10})
    schedule = MaintenanceSchedule(config, "postgresql://127.0.0.1:1/x")
    row: Any = SimpleNamespace(oid=7, state=SimpleNamespace(applies_changes=True),
                               schema=SimpleNamespace(table_name="t"), qualified_name="public.t")
    state: Any = SimpleNamespace(tables=lambda: [row])
    asked: list[int | None] = []

    def expire_snapshots(table: Any, policy: Any) -> int:
        asked.append(policy.max_snapshots)
        return 3

    target: Any = SimpleNamespace(expire_snapshots=expire_snapshots, history=lambda: None, caps_snapshots=True,
                                  names_snapshots=False)

    def batches(n: int) -> None:
        for _ in range(n):
            schedule.batch_applied(7)
            schedule.step(state, target)
            if schedule._thread is not None:
                schedule._thread.join()

    batches(4)
    assert asked == []
    batches(1)  # 5 = 10 / 2
    assert asked == [10] and not schedule.busy(7)
    batches(5)
    assert asked == [10, 10]
    target.caps_snapshots = False  # a target without per-table snapshots (DuckLake's are the lake's)
    batches(20)
    assert asked == [10, 10]


def test_a_copy_the_target_wants_maintained_is_due_at_once(tmp_path: Path) -> None:
    config = make_config("postgresql://127.0.0.1:1/x", tmp_path, ["public.t"], "ducklake")
    schedule = MaintenanceSchedule(config, "postgresql://127.0.0.1:1/x")
    now = time.monotonic()
    schedule.last_pass[7] = now
    assert not schedule._due(7, now)
    schedule.copied(7)  # on the copy's thread: handed to the loop's
    schedule._take_copied()  # the loop's next step
    assert schedule._due(7, now)  # no batch yet, a pass a moment ago
