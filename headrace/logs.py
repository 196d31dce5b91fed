"""Structured logging: one event name plus key=value fields per line (logfmt), or JSON lines.

``HEADRACE_LOG_FORMAT=json`` switches to JSON. Fields are values headrace chooses to log; DSNs go
through ``config.redacted_dsn`` first, so credentials never reach a log line.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class _Formatter(logging.Formatter):
    def __init__(self, as_json: bool) -> None:
        super().__init__()
        self.as_json = as_json

    def format(self, record: logging.LogRecord) -> str:
        fields = {k: v for k, v in record.__dict__.items() if k not in _RESERVED}
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        if self.as_json:
            out = {"ts": ts, "level": record.levelname.lower(), "event": record.getMessage(), **fields}
            if record.exc_info:
                out["exc"] = self.formatException(record.exc_info)
            return json.dumps(out, default=str)
        parts = [ts, record.levelname.lower(), record.getMessage()]
        for key, value in fields.items():
            text = str(value)
            if " " in text or "=" in text or not text:
                text = json.dumps(text)
            parts.append(f"{key}={text}")
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class _Stderr(logging.StreamHandler):
    """A handler writing to ``sys.stderr`` as it is at each event, not as it was at set-up: whoever
    swaps it later (a test runner capturing each test's output) gets the events, and a stream closed
    since is never written to."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self) -> Any:
        return sys.stderr


def setup_logging(level: str = "INFO") -> None:
    """Send headrace's events to stderr; quieten chatty libraries."""
    handler = _Stderr()
    handler.setFormatter(_Formatter(os.environ.get("HEADRACE_LOG_FORMAT", "").lower() == "json"))
    root = logging.getLogger("headrace")
    root.handlers[:] = [handler]
    root.setLevel(os.environ.get("HEADRACE_LOG_LEVEL", level).upper())
    root.propagate = False
    logging.getLogger("py4j").setLevel(logging.WARNING)


def event(logger: logging.Logger, name: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log one structured event: ``event(log, "snapshot.chunk", table="public.t", rows=10)``."""
    logger.log(level, name, extra=fields)
