"""The fan-out instance's ``/metrics`` endpoint on ``api.listen``: prometheus_client's own HTTP server.

A fan-out has no control plane to share a port with (no table commands, no status page), so the
library's exporter, serving the instance's registry in a background thread, is all it needs.
"""

from __future__ import annotations

import logging

from prometheus_client import start_http_server

from headrace.core.errors import ConfigError
from headrace.fanout.config import ApiConfig
from headrace.fanout.metrics import FanoutMetrics, fanout_registry
from headrace.logs import event

log = logging.getLogger("headrace.fanout")


class MetricsServer:
    """Serves one instance's metrics until ``stop()``; ``address`` is where (port 0 resolved)."""

    def __init__(self, api: ApiConfig, metrics: FanoutMetrics, pipeline: str, instance_id: str) -> None:
        registry = fanout_registry(metrics, pipeline, instance_id)
        try:
            self._httpd, self._thread = start_http_server(api.port, addr=api.host, registry=registry)
        except OSError as exc:
            raise ConfigError(f"api.listen {api.listen}: cannot serve /metrics there ({exc.strerror or exc}); "
                              "pick a free port, or an address of this machine") from exc
        self.address = f"{api.host}:{self._httpd.server_address[1]}"
        event(log, "fanout.metrics.listen", address=self.address, pipeline=pipeline, instance=instance_id)

    @property
    def url(self) -> str:
        host, _, port = self.address.rpartition(":")
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"

    def stop(self) -> None:
        """Stop serving and free the port."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
