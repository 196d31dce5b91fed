"""The two engines a unit of work can run on, and the one refusal a lane gives.

A unit of work is a batch's build (read the staged files, keep the last change per key, cast), a
batch's apply (commit it into the target) or a copy group. ``driver``: DuckDB and pyarrow in this
process, no Spark job. ``spark``: Spark jobs, in local mode on this machine's cores or on a cluster's
executors. ``materialize.lanes`` decides; this module only names the answers.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

Engine = Literal["auto", "spark", "driver"]  # the pipeline's ``engine`` setting


class Lane(str, enum.Enum):
    """Where a unit of work runs."""

    DRIVER = "driver"
    SPARK = "spark"


@dataclass(frozen=True)
class LaneChoice:
    """A lane and why: ``reason`` a short code (a metric label), ``detail`` the sentence for the log."""

    lane: Lane
    reason: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.lane.value} ({self.detail or self.reason})"


class NotOnLane(Exception):
    """The lane given a unit of work cannot run it exactly (a value, a file, a table's layout): the
    caller runs it on the other lane. The message says why."""
