"""Orchestration: start-up checks, the run loop, table tracking, the catalog watch, outages.

``Run`` is one run of one config. The control plane sees it only through ``run.view.RunView``
and hears of its events through ``run.observer.RunObserver``; the run never imports the control
plane (``headrace.pipeline`` composes the two).
"""

from headrace.run.runner import Run, RunStats, Service

__all__ = ["Run", "RunStats", "Service"]
