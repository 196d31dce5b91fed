"""The command queue between the control plane and the run loop, with no database: requests run in the
loop's thread, in order; a run that is not (or no longer) running refuses them with a domain error."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from headrace.config import parse_config
from headrace.core.errors import RequestError, RunUnavailable
from headrace.run.commands import Operations, Request
from headrace.run.tracking import TableTracking, parse_table

NO_STATE: Any = None  # the pipeline-wide commands do not read table state


def _operations(tmp_path: Path) -> Operations:
    config = parse_config({"name": "t", "source": {"dsn": "postgresql://nobody@127.0.0.1:1/none", "tables": ["a"]},
                           "target": {"ducklake": {"catalog": str(tmp_path / "meta.ducklake"),
                                                   "data_path": str(tmp_path / "data")}},
                           "staging": {"path": str(tmp_path / "staging")}})

    def no_target() -> Any:
        raise AssertionError("no command here opens the target")

    tracking = TableTracking(config, config.source.resolved_dsn(), lambda: None, no_target)
    return Operations(config.name, tracking)


def _loop(ops: Operations, stop: threading.Event) -> threading.Thread:
    """The run loop's part: run what is queued, wait for more."""
    def loop() -> None:
        while not stop.is_set():
            ops.run_pending(NO_STATE)
            ops.wait(0.05)
        ops.close()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def test_requests_before_the_loop_runs_are_refused(tmp_path: Path) -> None:
    with pytest.raises(RunUnavailable, match="not running"):
        _operations(tmp_path).submit(Request("pause"))


def test_pause_and_resume_run_in_the_loop(tmp_path: Path) -> None:
    ops, stop = _operations(tmp_path), threading.Event()
    ops.run_pending(NO_STATE)  # the loop has started
    thread = _loop(ops, stop)
    try:
        assert ops.submit(Request("pause")) == (True, {"paused": True})
        assert ops.paused
        assert ops.submit(Request("resume")) == (True, {"paused": False})
        assert not ops.paused
    finally:
        stop.set()
        thread.join()
    with pytest.raises(RunUnavailable):  # the loop ended: closed for requests
        ops.submit(Request("pause"))


def test_a_command_still_queued_when_the_loop_ends_fails(tmp_path: Path) -> None:
    ops = _operations(tmp_path)
    ops.run_pending(NO_STATE)
    result: list[BaseException] = []

    def submit() -> None:
        try:
            ops.submit(Request("pause"), timeout=30)
        except RunUnavailable as exc:
            result.append(exc)

    caller = threading.Thread(target=submit)
    caller.start()
    while ops._queue.empty():
        ops._wake.wait(0.01)
    ops.close()
    caller.join()
    assert [str(e) for e in result] == ["the pipeline stopped before the command ran"]
    assert not ops.paused


def test_every_action_has_its_command(tmp_path: Path) -> None:
    ops = _operations(tmp_path)
    for action in ("pause", "resume", "add_table", "remove_table", "pause_table", "resume_table", "resync_table"):
        assert callable(ops.command(Request(action, "public.a")))  # type: ignore[arg-type]


def test_a_table_name_that_does_not_parse_is_a_request_error() -> None:
    with pytest.raises(RequestError):
        parse_table('public."unterminated')
    assert str(parse_table("a")) == "public.a"
