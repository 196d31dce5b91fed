"""Orchestration: start-up checks, the run loop, table tracking, the catalog watch, outages.

``Pipeline`` is one run of one config. The control plane sees it only through ``run.view.RunView``
and hears of its events through ``run.observer.RunObserver``; the run never imports the control
plane (``headrace.pipeline`` composes the two).
"""

from headrace.run.pipeline import Pipeline, RunStats, Service

__all__ = ["Pipeline", "RunStats", "Service"]
