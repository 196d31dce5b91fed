"""When a table is due for maintenance (``run.maintenance.MaintenanceSchedule``): after ``every_minutes``
and ``after_batches`` both, or after ``max_batches`` whenever its last pass was."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from headrace.run.maintenance import MaintenanceSchedule
from tests.e2e.helpers import make_config


def test_a_busy_table_is_due_after_max_batches_however_recent_its_last_pass(tmp_path: Path) -> None:
    config = make_config("postgresql://127.0.0.1:1/x", tmp_path, ["public.t"], "ducklake",
                         maintenance={"every_minutes": 60, "after_batches": 5, "max_batches": 20})
    schedule = MaintenanceSchedule(config, "postgresql://127.0.0.1:1/x")
    row: Any = SimpleNamespace(oid=7)
    now = time.monotonic()
    schedule.last_pass[7] = now  # just maintained
    for _ in range(19):
        schedule.batch_applied(7)
    assert not schedule._due(row, now)  # 19 batches, within the hour
    assert schedule._due(row, now + 3601)  # the hour passed, and more than after_batches
    schedule.batch_applied(7)
    assert schedule._due(row, now)  # 20 batches: due at once
