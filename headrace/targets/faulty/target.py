"""A target that fails on purpose: it wraps another target and fails the chosen calls.

The tests use it to drive the per-table error boundary through every failure kind the run loop
tells apart (transient, terminal, unknown, a crash) with nothing but a setting: no storage to break,
no mocks. Calls no fault matches go to the inner target unchanged.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from headrace.core.errors import TerminalError, TransientError
from headrace.core.filesink import FileSink, WrittenFile
from headrace.core.interfaces import Target
from headrace.core.lanes import LaneChoice
from headrace.core.maintenance import MaintenancePolicy, TableFiles
from headrace.core.position import Position
from headrace.core.schema import SchemaChange, TableSchema
from headrace.targets.faulty.config import Fault

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame


# A held call gives up waiting after this long, so a test that forgets to release cannot hang a run.
HOLD_LIMIT_SECONDS = 300.0


class InjectedError(RuntimeError):
    """The ``unknown`` kind: an error no rule of the error boundary recognises."""


@dataclass
class _Armed:
    fault: Fault
    left: int | None  # failures still to inject; None: every matching call


class FaultyTarget(Target):
    """Delegates to ``inner`` except for the calls a fault matches; see the module docstring."""

    name = "faulty"

    def __init__(self, inner: Target, faults: Sequence[Fault] = ()) -> None:
        self.inner = inner
        self.keeps_infinity = inner.keeps_infinity
        self.stores_cursor = inner.stores_cursor
        self.applies_arrow = inner.applies_arrow
        self.copies_arrow = inner.copies_arrow
        self.caps_batches = inner.caps_batches
        self.caps_snapshots = inner.caps_snapshots
        self._lock = threading.Lock()  # the run loop, the copy thread and a test call in concurrently
        self._armed = [_Armed(f, f.times) for f in faults]
        self.injected: list[tuple[str, str]] = []  # (call, table) of every failure injected so far
        self._released = threading.Event()  # ends the wait of held calls (``hold`` faults)

    def inject(self, fault: Fault) -> None:
        """Arm one more fault, e.g. from a test while a pipeline runs."""
        with self._lock:
            self._armed.append(_Armed(fault, fault.times))

    def release(self) -> None:
        """Let every held call (``hold`` faults) go on to the inner target, now and from now on."""
        self._released.set()

    def clear(self) -> None:
        """Disarm every fault: from now on every call goes to the inner target."""
        with self._lock:
            self._armed.clear()

    def _maybe_fail(self, call: str, table: TableSchema) -> None:
        with self._lock:
            armed = next((a for a in self._armed if a.fault.fail_on == call and a.left != 0
                          and a.fault.table in (None, table.qualified_name)), None)
            if armed is None:
                return
            if armed.left is not None:
                armed.left -= 1
            self.injected.append((call, table.qualified_name))
            attempt = len(self.injected)
        if armed.fault.error == "hold":
            self._released.wait(HOLD_LIMIT_SECONDS)  # outside the lock: other calls go on meanwhile
            return
        what = f"injected {armed.fault.error} failure in {call} of {table.qualified_name} (faulty target)"
        if armed.fault.error == "crash":
            sys.stderr.write(f"headrace: {what}, exiting\n")
            sys.stderr.flush()
            os._exit(137)
        if armed.fault.error == "transient":
            raise TransientError(f"{what}, #{attempt}")
        if armed.fault.error == "terminal":
            raise TerminalError(f"{what}: remove the fault from target.faulty.faults, then resume the table")
        raise InjectedError(what)

    # -- Target, delegated ---------------------------------------------------------------------
    def ensure_table(self, table: TableSchema) -> str:
        """The inner target's, unless a fault fails it."""
        self._maybe_fail("ensure_table", table)
        return self.inner.ensure_table(table)

    def write_snapshot(self, table: TableSchema, rows: DataFrame, position: Position, replace: bool = True) -> int:
        """The inner target's, unless a fault fails it."""
        self._maybe_fail("write_snapshot", table)
        return self.inner.write_snapshot(table, rows, position, replace)

    def write_snapshot_arrow(self, table: TableSchema, rows: pa.Table, replace: bool = True) -> int:
        """The inner target's, unless a fault on ``write_snapshot`` fails it (the same step to a user)."""
        self._maybe_fail("write_snapshot", table)
        return self.inner.write_snapshot_arrow(table, rows, replace)

    def copy_sink(self, table: TableSchema, replace: bool) -> FileSink | None:
        """The inner target's."""
        return self.inner.copy_sink(table, replace)

    def register_copy_files(self, table: TableSchema, sink: FileSink, written: list[WrittenFile],
                            replace: bool) -> int:
        """The inner target's, unless a fault on ``write_snapshot`` fails it (the same step to a user)."""
        self._maybe_fail("write_snapshot", table)
        return self.inner.register_copy_files(table, sink, written, replace)

    def copy_finished(self, table: TableSchema) -> bool:
        """The inner target's."""
        return self.inner.copy_finished(table)

    def apply_batch(self, table: TableSchema, changes: DataFrame, truncate_before: Position | None,
                    log_offset: int) -> LaneChoice:
        """The inner target's, unless a fault fails it (before the inner target sees the batch)."""
        self._maybe_fail("apply_batch", table)
        return self.inner.apply_batch(table, changes, truncate_before, log_offset)

    def apply_arrow_batch(self, table: TableSchema, changes: pa.Table, truncate_before: Position | None,
                          log_offset: int) -> LaneChoice:
        """The inner target's, unless a fault fails it (a fault on ``apply_batch`` fails both)."""
        self._maybe_fail("apply_batch", table)
        return self.inner.apply_arrow_batch(table, changes, truncate_before, log_offset)

    def evolve(self, old: TableSchema, new: TableSchema, changes: Sequence[SchemaChange]) -> None:
        """The inner target's, unless a fault fails it."""
        self._maybe_fail("evolve", new)
        self.inner.evolve(old, new, changes)

    def drop_table(self, table: TableSchema) -> None:
        """The inner target's, unless a fault fails it."""
        self._maybe_fail("drop_table", table)
        self.inner.drop_table(table)

    def read_table(self, table: TableSchema) -> DataFrame:
        """The inner target's, unless a fault fails it."""
        self._maybe_fail("read_table", table)
        return self.inner.read_table(table)

    def read_cursor(self, table: TableSchema) -> int | None:
        """The inner target's, unless a fault fails it."""
        self._maybe_fail("read_cursor", table)
        return self.inner.read_cursor(table)

    def maintain(self, table: TableSchema, policy: MaintenancePolicy) -> None:
        """The inner target's, unless a fault fails it."""
        self._maybe_fail("maintain", table)
        self.inner.maintain(table, policy)

    def expire_snapshots(self, table: TableSchema, policy: MaintenancePolicy) -> int:
        """The inner target's, unless a fault fails it."""
        self._maybe_fail("expire_snapshots", table)
        return self.inner.expire_snapshots(table, policy)

    def table_files(self, table: TableSchema) -> TableFiles | None:
        """The inner target's, unless a fault fails it."""
        self._maybe_fail("table_files", table)
        return self.inner.table_files(table)

    def close(self) -> None:
        """Close the inner target."""
        self.inner.close()
