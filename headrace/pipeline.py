"""A pipeline with its control plane: the run (``headrace.run``) composed with the API and metrics
(``headrace.control``). What ``headrace run``, the demo and the tests start.

The run never imports the control plane, and the control plane sees the run only through
``run.view.RunView``; this module is where the two meet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from headrace.config import PipelineConfig
from headrace.control.metrics import PipelineMetrics
from headrace.control.plane import ControlPlane
from headrace.run import Run

if TYPE_CHECKING:  # pyspark loads only when a Spark job runs
    from pyspark.sql import SparkSession

__all__ = ["Pipeline"]


class Pipeline(Run):
    """A run that serves its control plane (``config.api``) and exports its metrics while it runs."""

    metrics: PipelineMetrics

    def __init__(self, config: PipelineConfig, spark: SparkSession | None = None) -> None:
        super().__init__(config, spark)
        self.metrics = PipelineMetrics(self)
        self.observers.add(self.metrics)
        self.control = ControlPlane(self)
        self.services.append(self.control)

    @property
    def api_address(self) -> str | None:
        """host:port the control API serves on, once the run started it."""
        return self.control.address
