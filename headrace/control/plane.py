"""The control plane of one run: its metrics (a ``RunObserver``) and its HTTP API, attached to the run.

``attach`` is all a composer (``headrace.pipeline``, the CLI, the demo) calls: the metrics hear the
run's events, and the API starts once capture runs and stops with the run.
"""

from __future__ import annotations

from headrace.control.api import ApiServer, start_api
from headrace.control.metrics import MeteredRun


class ControlPlane:
    """Serves the API of one run while it runs (a ``run.Service``)."""

    def __init__(self, run: MeteredRun) -> None:
        self.run = run
        self.server: ApiServer | None = None
        self.address: str | None = None  # host:port the API serves on, once started

    def start(self) -> None:
        """Start the API; a port that is taken is logged, and replication runs on without it."""
        self.server = start_api(self.run)
        self.address = self.server.address if self.server else None

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
