"""A change batch as either engine builds it and a target applies it (``Target.apply_batch``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa

from headrace.core.lanes import Lane
from headrace.core.position import Position

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


@dataclass(frozen=True)
class ChangeBatch:
    """A batch ready for ``Target.apply_batch``."""

    # Keyed tables: at most one row per key, Target row shape plus _hr_op and _hr_unchanged.
    # Keyless tables: one row per row image added (I) or removed (D); see ``engines.spark.batch``.
    # An Arrow table when built on the driver (``engines.driver.batch``); a Spark DataFrame by ``engines.spark.batch``.
    changes: DataFrame | pa.Table
    truncate_before: Position | None  # the latest TRUNCATE in the batch, if any
    rows_in: int  # staged rows read (before skipping and deduplication)
    # (column, reason) -> values the casts changed under ``values.infinity: clamp`` (staged changes)
    values_changed: dict[tuple[str, str], int] = field(default_factory=dict)
    lane: Lane = Lane.SPARK  # where it was read, cast and deduplicated
