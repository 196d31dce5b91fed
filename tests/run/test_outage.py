"""Riding out an outage: the run releases what the outage broke, counts one outage however many
attempts it takes, and waits on the servers, not on a fixed sleep (no database: a refused port)."""

from __future__ import annotations

import functools
import threading

import psycopg

from headrace.core.backoff import Backoff
from headrace.run.outage import OutageWatch, first_line, ride_out

NOWHERE = "postgresql://nobody@127.0.0.1:1/none"  # nothing listens on port 1: refused at once


def test_one_outage_however_many_attempts() -> None:
    watch = OutageWatch({"source": NOWHERE}, Backoff(0.01, 0.02), connect_timeout=1)
    stop, released = threading.Event(), []
    stop.set()  # the run is stopping: no waiting for the server
    error = psycopg.OperationalError("connection refused\nmore detail")
    for attempt in (1, 2, 3):
        ride_out(watch, error, attempt, stop, functools.partial(released.append, attempt))
    assert watch.outages == 1
    assert released == [1, 2, 3]  # each attempt drops what the outage broke


def test_the_watch_names_the_server_that_does_not_answer() -> None:
    watch = OutageWatch({"source": NOWHERE}, Backoff(0.01, 0.02), connect_timeout=1)
    assert watch.explains(RuntimeError("a table's own error"))  # the probe finds the source down
    assert not watch.up("source")
    (reason,) = watch.reasons()
    assert reason.startswith("the source server ") and "nothing is lost" in reason


def test_servers_answering_end_the_wait() -> None:
    watch = OutageWatch({}, Backoff(0.01, 0.02))
    stop, released = threading.Event(), []
    ride_out(watch, RuntimeError("gone"), 1, stop, lambda: released.append(1))  # returns: every server answers
    assert released == [1] and watch.outages == 1


def test_first_line() -> None:
    assert first_line(RuntimeError("one\ntwo")) == "RuntimeError: one"
    assert first_line(RuntimeError("")) == "RuntimeError"
