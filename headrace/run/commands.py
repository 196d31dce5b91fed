"""Operator commands against a running pipeline, and the queue that runs them in the run loop.

The control plane's threads never touch table state themselves: they submit a ``Request``, and the
run loop executes it between copy and apply steps (``run_pending``), so a command cannot race a
batch that is being applied. The caller waits for the result, or hears "still queued" if the loop
is busy for long. A request that cannot be carried out raises a domain error (``core.errors``:
``TableNotFound``, ``CommandConflict``, ``TableRefused``, ``RequestError``, ``RunUnavailable``).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Literal

from headrace.core.errors import RunUnavailable
from headrace.logs import event
from headrace.run.tracking import TableTracking
from headrace.state.store import StateStore

log = logging.getLogger("headrace.control")

Command = Callable[[StateStore], dict[str, Any]]
Action = Literal["pause", "resume", "add_table", "remove_table", "pause_table", "resume_table", "resync_table"]


@dataclass(frozen=True)
class Request:
    """What an operator asks of the run: ``action``, on ``table`` for the table actions."""

    action: Action
    table: str = ""
    drop_target: bool = False  # remove_table: drop the target table too


class Operations:
    """The command queue between the control plane and the run loop, and the commands themselves."""

    def __init__(self, pipeline_name: str, tracking: TableTracking) -> None:
        self.pipeline_name = pipeline_name
        self.tracking = tracking
        self.paused = False  # the whole pipeline; capture goes on, copy and apply wait
        self._queue: queue.Queue[tuple[Command, Future[dict[str, Any]]]] = queue.Queue()
        self._wake = threading.Event()
        self._running = False
        # Runs before each command: the run lets its apply batches in flight end (a command may touch any table).
        self.before_command: Callable[[StateStore], None] = lambda state: None

    # -- the queue ------------------------------------------------------------------------------
    def submit(self, request: Request, timeout: float = 20.0) -> tuple[bool, dict[str, Any]]:
        """Run ``request`` in the run loop: (True, result), or (False, {}) if still queued at ``timeout``."""
        return self.call(self.command(request), timeout)

    def call(self, command: Command, timeout: float = 20.0) -> tuple[bool, dict[str, Any]]:
        """Run ``command`` in the run loop: (True, result), or (False, {}) if still queued at ``timeout``."""
        if not self._running:
            raise RunUnavailable("the pipeline is not running")
        future: Future[dict[str, Any]] = Future()
        self._queue.put((command, future))
        self._wake.set()
        try:
            return True, future.result(timeout)
        except TimeoutError:
            return False, {}

    def run_pending(self, state: StateStore) -> None:
        """Execute queued commands (called by the run loop)."""
        self._running = True
        while True:
            try:
                command, future = self._queue.get_nowait()
            except queue.Empty:
                return
            if not future.set_running_or_notify_cancel():
                continue
            try:
                self.before_command(state)
                future.set_result(command(state))
            except Exception as exc:
                future.set_exception(exc)

    def begin_pass(self) -> None:
        """A run-loop pass starts: it sees every command and staged file there is now, so a wake-up
        from before is used up (one arriving during the pass makes the next ``wait`` return at once)."""
        self._wake.clear()

    def wake(self) -> None:
        """End the run loop's idle wait now (capture staged files)."""
        self._wake.set()

    def wait(self, seconds: float) -> None:
        """Sleep in the run loop until ``seconds`` pass, a command arrives or capture stages files."""
        self._wake.wait(seconds)

    def close(self) -> None:
        """The run loop is ending: fail whatever is still queued."""
        self._running = False
        while True:
            try:
                _command, future = self._queue.get_nowait()
            except queue.Empty:
                return
            if future.set_running_or_notify_cancel():
                future.set_exception(RunUnavailable("the pipeline stopped before the command ran"))

    # -- commands (each runs in the run loop) -------------------------------------------------------
    def command(self, request: Request) -> Command:
        """The command that carries out ``request``."""
        match request.action:
            case "pause":
                return self.pause_pipeline
            case "resume":
                return self.resume_pipeline
            case "add_table":
                return self.add_table(request.table)
            case "remove_table":
                return self.remove_table(request.table, request.drop_target)
            case "pause_table":
                return self.pause_table(request.table)
            case "resume_table":
                return self.resume_table(request.table)
            case "resync_table":
                return self.resync_table(request.table)

    def pause_pipeline(self, state: StateStore) -> dict[str, Any]:
        self.paused = True
        event(log, "pipeline.paused", pipeline=self.pipeline_name)
        return {"paused": True}

    def resume_pipeline(self, state: StateStore) -> dict[str, Any]:
        self.paused = False
        event(log, "pipeline.resumed", pipeline=self.pipeline_name)
        return {"paused": False}

    def pause_table(self, name: str) -> Command:
        return lambda state: self.tracking.pause(state, name)

    def resume_table(self, name: str) -> Command:
        """Resume a PAUSED table, or try an ERRORED one again now (after the operator fixed the cause)."""
        return lambda state: self.tracking.resume(state, name)

    def resync_table(self, name: str) -> Command:
        return lambda state: self.tracking.resync(state, name)

    def add_table(self, name: str) -> Command:
        return lambda state: self.tracking.add(state, name)

    def remove_table(self, name: str, drop_target: bool = False) -> Command:
        return lambda state: self.tracking.remove(state, name, drop_target)
