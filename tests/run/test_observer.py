"""Observers hear every event of the run, and one that fails never stops the others (nor the run)."""

from __future__ import annotations

from typing import Any

from headrace.run.observer import Observers


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def batch_applied(self, state: Any, row: Any, applied: Any) -> None:
        self.events.append(("batch", row))

    def table_failed(self, table: str, kind: str) -> None:
        self.events.append(("failed", table, kind))

    def ddl_applied(self, kind: str) -> None:
        self.events.append(("ddl", kind))

    def values_changed(self, table: str, counts: dict[tuple[str, str], int]) -> None:
        self.events.append(("values", table, counts))


class Broken(Recorder):
    def ddl_applied(self, kind: str) -> None:
        raise RuntimeError("metrics backend away")


def test_every_observer_hears_each_event_even_after_one_fails() -> None:
    observers, first, last = Observers(), Broken(), Recorder()
    observers.add(first)
    observers.add(last)
    observers.ddl_applied("drop_table")
    observers.table_failed("public.a", "terminal")
    observers.values_changed("public.a", {("ts", "out_of_range_clamped"): 2})
    observers.batch_applied(None, "row", None)  # type: ignore[arg-type]
    assert last.events == [("ddl", "drop_table"), ("failed", "public.a", "terminal"),
                           ("values", "public.a", {("ts", "out_of_range_clamped"): 2}), ("batch", "row")]
    assert first.events == last.events[1:]
