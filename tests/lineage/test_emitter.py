"""The lineage emitter without Spark: copies seen in state, interval summaries, the HTTP transport."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest

from headrace.lineage.emitter import Lineage
from headrace.materialize.apply import Applied
from headrace.pipeline import Pipeline
from headrace.state.store import StateStore
from tests.e2e.helpers import make_config


def _tracked(dsn: str, tmp_path: Path, **lineage: Any) -> tuple[Lineage, StateStore, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
    config = make_config(dsn, tmp_path, ["public.items"], "ducklake", lineage=lineage)
    state = Pipeline(config).setup()
    return Lineage(config, dsn), state, state.tables()[0].oid


def _step(lineage: Lineage, state: StateStore) -> None:
    lineage._next_step = 0.0  # the run loop's steps are a second apart; here, one after the other
    lineage.step(state)


def _applied(lsn: int, rows: int) -> Applied:
    return Applied("public.items", entries=1, rows_in=rows, log_offset=1, applied_lsn=lsn, seconds=0.1, drained=True)


def test_a_copy_once_then_interval_summaries(source_dsn: str, tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    lineage, state, oid = _tracked(source_dsn, tmp_path, transport="file", file=str(path), every="interval",
                                   interval_seconds=3600)
    try:
        _step(lineage, state)  # first look: the table is PENDING
        state.copy_started(oid, 1000)
        state.copy_finished(oid, 7)
        _step(lineage, state)
        _step(lineage, state)  # the same copy is not reported twice
        row = state.table(oid)
        assert row is not None
        lineage.batch_applied(state, row, _applied(2000, 3))
        lineage.batch_applied(state, row, _applied(3000, 4))
        _step(lineage, state)  # the interval has not passed: nothing yet
        events = [json.loads(line) for line in path.read_text().splitlines()]
        assert [e["run"]["facets"]["headrace_positions"]["kind"] for e in events] == ["copy"]
        assert events[0]["outputs"][0]["outputFacets"]["outputStatistics"]["rowCount"] == 7
        lineage.close(state)  # a stopping run sends what it summed
        summary = json.loads(path.read_text().splitlines()[-1])
        assert summary["run"]["facets"]["headrace_positions"] == {
            **summary["run"]["facets"]["headrace_positions"], "kind": "apply", "fromLsn": "0/3E8",
            "toLsn": "0/BB8", "batches": 2}
        assert summary["outputs"][0]["outputFacets"]["outputStatistics"]["rowCount"] == 7
    finally:
        state.close()


def test_http_transport_posts_to_a_marquez_endpoint(source_dsn: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    received: list[tuple[str, str | None, dict[str, Any]]] = []

    class Marquez(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.path, self.headers.get("Authorization"), json.loads(body)))
            self.send_response(201)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Marquez)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("HR_OL_KEY", "secret-token")
    lineage, state, oid = _tracked(source_dsn, tmp_path, transport="http", api_key_env="HR_OL_KEY",
                                   url=f"http://127.0.0.1:{server.server_address[1]}")
    try:
        row = state.table(oid)
        assert row is not None
        lineage.batch_applied(state, row, _applied(2000, 3))
        lineage.close(state)
    finally:
        state.close()
        server.shutdown()
    (path, auth, event), = received
    assert path == "/api/v1/lineage" and auth == "Bearer secret-token"
    assert event["outputs"][0]["name"] == "public.items"
    assert event["job"]["facets"]["jobType"]["jobType"] == "APPLY"
