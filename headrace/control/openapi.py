"""The OpenAPI 3 document served at ``/openapi.json`` (hand-written; kept next to the routes)."""

from __future__ import annotations

from typing import Any

_JSON = {"application/json": {"schema": {"type": "object"}}}


def _op(summary: str, *, mutating: bool = False, name: bool = False, body: dict[str, Any] | None = None,
        codes: tuple[int, ...] = ()) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": {"200": {"description": "OK", "content": _JSON}}}
    for code, text in [(201, "created"), (202, "queued: the pipeline is busy and runs it next"),
                       (404, "no such table"), (409, "conflicts with the table's state"),
                       (422, "the table cannot be replicated (the body lists why)")]:
        if code in codes:
            op["responses"][str(code)] = {"description": text, "content": _JSON}
    if name:
        op["parameters"] = [{"name": "table", "in": "path", "required": True, "schema": {"type": "string"},
                             "description": "schema.table (a bare name means public) or the table's oid"}]
    if body:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    if mutating:
        op["security"] = [{"bearer": []}]
        op["responses"]["401"] = {"description": "missing or wrong bearer token"}
    return op


_TABLE_BODY = {"type": "object", "required": ["table"], "properties": {"table": {"type": "string"}}}

OPENAPI: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {
        "title": "headrace control API",
        "version": "1",
        "description": "Steer a running headrace pipeline. Mutating requests need `Authorization: Bearer`"
        " when a token is configured (api.token_env) and a JSON content type.",
    },
    "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    "paths": {
        "/healthz": {"get": _op("Liveness: the process is serving")},
        "/readyz": {"get": {**_op("Readiness: capture connected, no table waiting for the operator or past its retry budget"),
                            "responses": {"200": {"description": "ready", "content": _JSON},
                                          "503": {"description": "not ready; reasons in the body",
                                                  "content": _JSON}}}},
        "/metrics": {"get": {"summary": "Prometheus metrics (text format)",
                             "responses": {"200": {"description": "OK", "content": {"text/plain": {}}}}}},
        "/api/status": {"get": _op("Pipeline, slot, capture and every table with state and lag")},
        "/api/pause": {"post": _op("Pause the pipeline: capture goes on, copy and apply wait", mutating=True,
                                   codes=(202,))},
        "/api/resume": {"post": _op("Resume the pipeline", mutating=True, codes=(202,))},
        "/api/tables": {
            "get": _op("Replicated tables with state, lag (bytes, seconds), backlog and throughput"),
            "post": _op("Add a table: checked, published, copied, then streamed (no restart)", mutating=True,
                        body=_TABLE_BODY, codes=(201, 202, 404, 409, 422)),
        },
        "/api/tables/{table}": {
            "get": _op("Describe a table: columns, types, key, target name", name=True, codes=(404,)),
            "delete": {**_op("Stop replicating a table (drop_target=true also drops the target table)",
                             mutating=True, name=True, codes=(202, 404)),
                       "parameters": [
                           {"name": "table", "in": "path", "required": True, "schema": {"type": "string"}},
                           {"name": "drop_target", "in": "query", "schema": {"type": "boolean"}}]},
        },
        "/api/tables/{table}/pause": {"post": _op("Pause one table", mutating=True, name=True,
                                                  codes=(202, 404))},
        "/api/tables/{table}/resume": {"post": _op("Resume a paused table, or retry an ERRORED one now", mutating=True, name=True,
                                                   codes=(202, 404, 409))},
        "/api/tables/{table}/resync": {"post": _op("Copy the table again; the copy replaces the target's rows",
                                                   mutating=True, name=True, codes=(202, 404))},
        "/api/source/tables": {"get": _op("Every source table, assessed: key, replica identity, types kept"
                                          " as text, privileges, problems")},
        "/api/check": {"get": _op("The `headrace check` assessment of the server and the pipeline's tables")},
    },
}
