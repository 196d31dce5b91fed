"""One exponential backoff for every retry headrace makes: reconnecting, retrying a table, a fan-out lake.

The delays come from tenacity's ``wait_exponential`` (first, 2 x first, 4 x first, ... capped), so
the rule lives in one place and the loops that retry say only what they wait for.
"""

from __future__ import annotations

from dataclasses import dataclass

import tenacity


@dataclass(frozen=True)
class Backoff:
    """Exponential delays: ``first`` seconds after the first failure, doubling up to ``cap``."""

    first: float = 1.0
    cap: float = 30.0

    def delay(self, failures: int) -> float:
        """Seconds to wait after the ``failures``-th consecutive failure (1 = the first)."""
        if failures <= 0:
            return 0.0
        wait = tenacity.wait_exponential(multiplier=self.first, exp_base=2, max=self.cap)
        # tenacity counts attempts from 1 and waits multiplier * 2 ** (attempt - 1) after attempt n.
        call = tenacity.RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
        call.attempt_number = failures
        return float(wait(call))
