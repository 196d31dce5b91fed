"""One running pipeline (DuckLake target) with its control API, shared by the control tests.

Starting Spark jobs and copying tables is the slow part, so the pipeline starts once per session
and each test steers it through the API, as an operator would.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from headrace.pipeline import Pipeline
from headrace.source.postgres.throwaway import ThrowawayPostgres, free_port
from tests.e2e.helpers import make_config

TOKEN_ENV = "HR_CONTROL_TEST_TOKEN"
TOKEN = "control-test-token"


@dataclass
class Running:
    """A pipeline running in a thread, and how to talk to it."""

    pipeline: Pipeline
    base: str
    dsn: str
    config_path: Path
    stop: Callable[[], None]

    def call(self, method: str, path: str, body: Any = None, token: str | None = TOKEN,
             content_type: str = "application/json") -> tuple[int, Any]:
        """One API request: (status, decoded JSON or text)."""
        headers = {"Content-Type": content_type}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        data = json.dumps(body).encode() if body is not None else (b"{}" if method == "POST" else None)
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode()

    def table(self, name: str) -> dict[str, Any]:
        status, body = self.call("GET", "/api/tables")
        assert status == 200, body
        return next(t for t in body["tables"] if t["table"] == name)

    def wait(self, predicate: Callable[[], bool], what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}")

    def loop_passes(self, n: int) -> None:
        """Wait until the run loop has made ``n`` whole passes from now (woken each poll: a settled
        loop would otherwise idle up to ``apply.idle_max_seconds`` between passes)."""
        start = self.pipeline.loop_passes

        def done() -> bool:
            self.pipeline.operations.wake()
            return self.pipeline.loop_passes >= start + n + 1  # pass start+n has ended: the next began

        self.wait(done, f"{n} run-loop passes")

    def source(self, sql: str) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(sql)


# Package scope: the pipeline stops when the control tests are done instead of idling (a run loop,
# capture and its slot) through the rest of the session.
@pytest.fixture(scope="package")
def control_db(pg_server: ThrowawayPostgres) -> Iterator[str]:
    """A database with two replicated tables, one to add later and one that cannot be replicated."""
    name = f"ctl{os.getpid()}"
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    dsn = pg_server.dsn_for(name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("""
            CREATE TABLE customers (id serial PRIMARY KEY, name text NOT NULL, balance numeric(12,2));
            CREATE TABLE orders (id serial PRIMARY KEY, customer int, total numeric(10,2), note text);
            CREATE TABLE extra (id int PRIMARY KEY, label text, span int4range);
            CREATE TABLE keyless (a int, b text);
            INSERT INTO customers (name, balance) SELECT 'c' || g, g * 1.5 FROM generate_series(1, 300) g;
            INSERT INTO orders (customer, total) SELECT g % 300 + 1, g FROM generate_series(1, 100) g;
            INSERT INTO extra SELECT g, 'x' || g, int4range(g, g + 10) FROM generate_series(1, 50) g;
        """)
    yield dsn
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots"
                     " WHERE database = %s AND active_pid IS NOT NULL", (name,))
        for (slot,) in conn.execute("SELECT slot_name FROM pg_replication_slots WHERE database = %s",
                                    (name,)).fetchall():
            with contextlib.suppress(psycopg.Error):
                conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="package")
def running(control_db: str, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """The pipeline, running, with both configured tables STREAMING."""
    tmp = tmp_path_factory.mktemp("control")
    port = free_port()
    os.environ[TOKEN_ENV] = TOKEN
    api = {"listen": f"127.0.0.1:{port}", "token_env": TOKEN_ENV}
    config = make_config(control_db, tmp, ["public.customers", "public.orders"], "ducklake", api=api,
                         name="ctl")
    config_path = tmp / "pipeline.yaml"
    config_path.write_text(json.dumps(config.model_dump(mode="json", by_alias=True, exclude_none=True)))
    pipeline = Pipeline(config, spark=spark)
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            pipeline.run(stop=stop)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, name="pipeline", daemon=True)
    thread.start()

    def stop_pipeline() -> None:
        stop.set()
        thread.join(120)
        assert not thread.is_alive(), "the pipeline did not stop"

    r = Running(pipeline, f"http://127.0.0.1:{port}", control_db, config_path, stop_pipeline)

    def streaming() -> bool:
        if errors:
            raise errors[0]
        with contextlib.suppress(OSError, AssertionError, StopIteration):
            return all(r.table(t)["state"] == "STREAMING" for t in ("public.customers", "public.orders"))
        return False

    r.wait(streaming, "both tables to stream", timeout=120)
    yield r
    stop_pipeline()
    if errors:
        raise errors[0]
