"""A small client of the control API, for the CLI: the running pipeline's address and token come
from the same config file it was started with."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

from headrace.config import PipelineConfig
from headrace.core.errors import HeadraceError


class ApiClient:
    """Calls the API of the pipeline that runs with ``config``."""

    def __init__(self, config: PipelineConfig, timeout: float = 60.0) -> None:
        api = config.api
        host = api.host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"  # listening everywhere: loopback reaches it
        self.base = f"http://{'[' + host + ']' if ':' in host else host}:{api.port}"
        self.token = os.environ.get(api.token_env) if api.token_env else None
        self.timeout = timeout

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One request; the decoded JSON answer, or a HeadraceError saying what went wrong."""
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = json.dumps(body).encode() if body is not None else (b"{}" if method == "POST" else None)
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            try:
                message = json.loads(exc.read()).get("error", exc.reason)
            except ValueError:
                message = exc.reason
            raise HeadraceError(f"{method} {path}: HTTP {exc.code}: {message}") from None
        except urllib.error.URLError as exc:
            raise HeadraceError(
                f"no pipeline answers at {self.base} ({exc.reason}): is `headrace run` running with this "
                "config (api.listen)?"
            ) from None

    @staticmethod
    def table_path(table: str, action: str = "") -> str:
        return f"/api/tables/{quote(table, safe='')}" + (f"/{action}" if action else "")
