"""The HTTP control plane of ``headrace run``: REST API, /metrics, health checks and the status page.

Standard library only (``ThreadingHTTPServer``). Reads are open; every mutating request (POST,
DELETE) must carry ``Authorization: Bearer <token>`` when a token is configured, and a JSON
content type always, so a web page elsewhere cannot submit a form to it. Table operations are
submitted to the run (``RunView.submit``), which runs them in its loop; the run's domain errors
become status codes here (``STATUS_OF``).
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import psycopg
from prometheus_client import CONTENT_TYPE_LATEST

from headrace.control import health
from headrace.control.assess import assess_config, candidates
from headrace.control.metrics import LAG_SAMPLE_SECONDS, SAMPLE_SECONDS, MeteredRun
from headrace.control.openapi import OPENAPI
from headrace.control.page import render_page
from headrace.control.status import target_name as status_target_name
from headrace.core.errors import (
    CommandConflict,
    RequestError,
    RunUnavailable,
    TableNotFound,
    TableRefused,
)
from headrace.core.schema import TableSchema
from headrace.logs import event
from headrace.outage_signs import lost_connection
from headrace.run.view import Request, find_table
from headrace.state.store import StateStore

log = logging.getLogger("headrace.control")

# The run's domain errors, as HTTP status codes (the most specific class first; RequestError: 400).
STATUS_OF: tuple[tuple[type[RequestError], int], ...] = (
    (TableNotFound, 404), (CommandConflict, 409), (TableRefused, 422), (RunUnavailable, 503), (RequestError, 400),
)


class ApiServer:
    """Serves the control plane of one pipeline on ``config.api.listen`` in background threads."""

    def __init__(self, pipeline: MeteredRun) -> None:
        self.pipeline = pipeline
        api = pipeline.config.api
        self.token = api.resolved_token()
        handler = type("Handler", (_Handler,), {"api": self})
        self.httpd = ThreadingHTTPServer((api.host, api.port), handler)
        self.httpd.daemon_threads = True
        self.address = f"{api.host}:{self.httpd.server_address[1]}"
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.2},
                             name="api", daemon=True),
            threading.Thread(target=self._sample, name="api-sampler", daemon=True),
        ]

    def start(self) -> ApiServer:
        for t in self._threads:
            t.start()
        event(log, "api.listen", address=self.address, auth="bearer" if self.token else "none")
        return self

    def stop(self) -> None:
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def _sample(self) -> None:
        every = max(1, round(LAG_SAMPLE_SECONDS / SAMPLE_SECONDS))  # a lag sample every this many ticks
        tick = 1  # the first one LAG_SAMPLE_SECONDS after start, not beside start-up's own status reads
        while not self._stop.is_set():
            self.pipeline.metrics.sample()
            if tick % every == 0:
                self.pipeline.metrics.sample_lag()
            tick += 1
            self._stop.wait(SAMPLE_SECONDS)

    # -- what the routes answer ---------------------------------------------------------------------
    def describe(self, name: str) -> dict[str, Any]:
        p = self.pipeline
        state = StateStore(p.state_dsn, p.config.name)
        try:
            row = find_table(state, name)
            pending = state.log_index.pending_changes().get(row.oid, 0)
        finally:
            state.close()
        s = row.schema
        return {
            "table": row.qualified_name,
            "oid": row.oid,
            "state": row.state.value,
            "target": {"kind": p.config.target.kind, "table": target_name(p, s)},
            "key": list(s.key),
            "replica_identity": s.replica_identity,
            "columns": [{"name": c.name, "pg_type": c.type.pg_type, "type": c.type.kind.value,
                         "nullable": c.nullable, "key": c.name in s.key} for c in s.columns],
            "rows_copied": row.rows_copied,
            "rows_applied": row.rows_applied,
            "pending_changes": pending,
            "error": row.error,
        }

    def source_tables(self) -> list[dict[str, Any]]:
        p = self.pipeline
        state = StateStore(p.state_dsn, p.config.name)
        try:
            tracked = {r.qualified_name for r in state.tables()}
        finally:
            state.close()
        with psycopg.connect(p.dsn, autocommit=True) as conn:
            return candidates(conn, p.config.publication_name, tracked)

    def check(self) -> dict[str, Any]:
        p = self.pipeline
        state = StateStore(p.state_dsn, p.config.name)
        try:
            tracked = [r.qualified_name for r in state.tables()]
        finally:
            state.close()
        return assess_config(p.config, tracked)


def target_name(pipeline: MeteredRun, schema: TableSchema) -> str:
    """The table's name in the target (see ``status.target_name``)."""
    return status_target_name(pipeline.config, schema)


class _Handler(BaseHTTPRequestHandler):
    api: ApiServer
    server_version = "headrace"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        log.debug("api: " + format, *args)

    # -- plumbing -------------------------------------------------------------------------------
    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj, indent=1, default=str).encode(), "application/json")

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"error": message})

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        if not length:
            return {}
        data = json.loads(self.rfile.read(length))
        if not isinstance(data, dict):
            raise RequestError("the request body must be a JSON object")
        return data

    def _authorized(self) -> bool:
        token = self.api.token
        if token is None:
            return True
        given = self.headers.get("Authorization", "")
        scheme, _, value = given.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token.encode())

    def _route(self) -> tuple[list[str], dict[str, list[str]]]:
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.split("/") if p]
        return parts, parse_qs(url.query)

    def _run(self, request: Request, created: bool = False) -> None:
        done, result = self.api.pipeline.submit(request)
        if done:
            self._json(201 if created else 200, result)
        else:
            self._json(202, {"queued": True, "note": "the pipeline is busy (a copy or a batch); it runs next"})

    def _guarded(self, handler: Any) -> None:
        try:
            handler()
        except RequestError as exc:
            self._error(next(code for kind, code in STATUS_OF if isinstance(exc, kind)), str(exc))
        except json.JSONDecodeError as exc:
            self._error(400, f"the request body is not JSON: {exc}")
        except Exception as exc:
            if lost_connection(exc):  # a server is away: the run waits for it, the client may retry
                reasons = self.api.pipeline.outage_reasons() or [str(exc).strip().splitlines()[0]]
                log.debug("api: %s %s during an outage: %s", self.command, self.path, exc)
                self._error(503, "; ".join(reasons))
                return
            log.warning("api: %s %s failed: %s", self.command, self.path, exc, exc_info=exc)
            self._error(500, f"{type(exc).__name__}: {str(exc).strip()}")

    # -- verbs ----------------------------------------------------------------------------------
    def do_GET(self) -> None:
        self._guarded(self._get)

    def do_POST(self) -> None:
        self._guarded(lambda: self._mutate(self._post))

    def do_DELETE(self) -> None:
        self._guarded(lambda: self._mutate(self._delete))

    def _mutate(self, handler: Any) -> None:
        if not self._authorized():
            self.send_response(401)
            body = b'{"error": "missing or wrong bearer token (Authorization: Bearer <token>)"}'
            self.send_header("WWW-Authenticate", 'Bearer realm="headrace"')
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if self.command == "POST" and not self.headers.get("Content-Type", "").startswith("application/json"):
            self._error(415, "send Content-Type: application/json")
            return
        handler()

    def _get(self) -> None:
        api, parts = self.api, self._route()[0]
        p = api.pipeline
        match parts:
            case []:
                self._send(200, render_page(p, auth=api.token is not None).encode(), "text/html; charset=utf-8")
            case ["metrics"]:
                self._send(200, p.metrics.exposition(), CONTENT_TYPE_LATEST)
            case ["healthz"]:
                ok, body = health.liveness(p)
                self._json(200 if ok else 503, body)
            case ["readyz"]:
                ok, body = health.readiness(p)
                self._json(200 if ok else 503, body)
            case ["openapi.json"]:
                self._json(200, OPENAPI)
            case ["api", "status"]:
                self._json(200, p.metrics.live_status())
            case ["api", "tables"]:
                self._json(200, {"tables": p.metrics.live_status()["tables"]})
            case ["api", "tables", name]:
                self._json(200, api.describe(name))
            case ["api", "source", "tables"]:
                self._json(200, {"tables": api.source_tables()})
            case ["api", "check"]:
                self._json(200, api.check())
            case _:
                self._error(404, f"no such resource: {self.path} (see /openapi.json)")

    def _post(self) -> None:
        parts = self._route()[0]
        match parts:
            case ["api", "pause"]:
                self._run(Request("pause"))
            case ["api", "resume"]:
                self._run(Request("resume"))
            case ["api", "tables"]:
                table = self._body().get("table")
                if not isinstance(table, str) or not table:
                    raise RequestError('give the table to add: {"table": "schema.table"}')
                self._run(Request("add_table", table), created=True)
            case ["api", "tables", name, "pause"]:
                self._run(Request("pause_table", name))
            case ["api", "tables", name, "resume"]:
                self._run(Request("resume_table", name))
            case ["api", "tables", name, "resync"]:
                self._run(Request("resync_table", name))
            case _:
                self._error(404, f"no such action: POST {self.path} (see /openapi.json)")

    def _delete(self) -> None:
        parts, query = self._route()
        match parts:
            case ["api", "tables", name]:
                drop = query.get("drop_target", ["false"])[0].lower() in ("1", "true", "yes")
                self._run(Request("remove_table", name, drop_target=drop))
            case _:
                self._error(404, f"no such resource: DELETE {self.path} (see /openapi.json)")


def start_api(pipeline: MeteredRun) -> ApiServer | None:
    """Start the control plane; a port that is taken is logged, and replication runs on without it."""
    try:
        return ApiServer(pipeline).start()
    except OSError as exc:
        event(log, "api.unavailable", logging.ERROR, listen=pipeline.config.api.listen, error=str(exc))
        return None
