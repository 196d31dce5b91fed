"""THE lane decision: which engine runs each unit of work, and why (``core.lanes``).

Every unit of work is decided here, from what the pipeline's ``engine`` setting asks, what the target
declares (``Target.applies_arrow``, ``Target.copies_arrow``) and what the work is (the staged files'
facts, the table's key, the Spark master); each answer carries its reason, which the log, the metrics
and ``status`` show. A lane that is given work and then finds it cannot do it exactly (a value only
Spark's casts decide, a data file the driver cannot read) raises ``core.lanes.NotOnLane``, and the
work runs on Spark, the lane that takes everything.

``engine``:
- ``auto`` (default): the driver for what it does fastest and exactly, measured on 2 cores (docs/
  benchmarks.md): keyed batches of up to ``apply.driver_batch_rows`` staged rows (a Spark batch costs
  ~0.5 s of jobs whatever its size), and in local mode the copy's groups (the driver's threads copied
  20M rows in 29.5 s against 34.5-37 s as warm Spark jobs); Spark for the rest and, on a cluster,
  for every copy group: the executors do the heavy work.
- ``spark``: every batch's build and every copy group as Spark jobs (what a cluster scales out);
  the apply is still the target's (DuckLake commits in DuckDB).
- ``driver``: the driver whenever it can, with no size bound.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from headrace.core.lanes import Engine, Lane, LaneChoice
from headrace.core.schema import TableSchema, TypeKind
from headrace.engines.spark.session import local_cores
from headrace.log.facts import FileFacts, total

_FLOATING = frozenset({TypeKind.FLOAT, TypeKind.DOUBLE})
SPARK_ENGINE = LaneChoice(Lane.SPARK, "engine", "engine: spark")


def batch_build_lane(engine: Engine, applies_arrow: bool, table: TableSchema, facts: Sequence[FileFacts | None],
                     driver_rows: int) -> LaneChoice:
    """Where a change batch of ``table`` (one ``facts`` per staged file) is read, deduplicated and cast.
    ``applies_arrow``: the target takes Arrow batches (``Target.applies_arrow``); ``driver_rows`` is
    ``apply.driver_batch_rows`` (0: never on the driver; ignored by ``engine: driver``)."""
    if engine == "spark":
        return SPARK_ENGINE
    if not applies_arrow:
        return LaneChoice(Lane.SPARK, "target", "the target takes no Arrow batches")
    if engine != "driver" and driver_rows <= 0:
        return LaneChoice(Lane.SPARK, "off", "apply.driver_batch_rows is 0")
    # Spark groups NaN and -0.0 its own way: a key, or a keyless table's row (grouped whole), holding
    # floating-point values stays on Spark.
    if not table.key and any(c.type.kind in _FLOATING for c in table.columns):
        return LaneChoice(Lane.SPARK, "float-row", "table without a key, with floating-point columns")
    if any(table.column(k).type.kind in _FLOATING for k in table.key):
        return LaneChoice(Lane.SPARK, "float-key", "floating-point key")
    if not facts or any(f is None for f in facts):
        return LaneChoice(Lane.SPARK, "no-facts", "files without registered facts")
    known = total(f for f in facts if f is not None)
    if not table.key and known.update_without_old:  # Spark's scan finds whether it is past the copy, and stops
        return LaneChoice(Lane.SPARK, "no-old-row", "an update of a table without a key lacks its old row")
    if engine != "driver" and known.rows > driver_rows:
        return LaneChoice(Lane.SPARK, "size", f"{known.rows} staged rows > apply.driver_batch_rows {driver_rows}")
    if known.key_toast:
        return LaneChoice(Lane.SPARK, "key-toast", "a key change left TOAST columns unchanged")
    if engine == "driver":
        return LaneChoice(Lane.DRIVER, "engine", "engine: driver")
    return LaneChoice(Lane.DRIVER, "fits", f"{known.rows} staged rows <= apply.driver_batch_rows {driver_rows}")


def copy_lane(engine: Engine, master: str, conf: Mapping[str, str]) -> LaneChoice:
    """Who copies the chunk groups of a file-writing copy: the driver's threads, or Spark tasks."""
    if engine == "spark":
        return SPARK_ENGINE
    if engine == "driver":
        return LaneChoice(Lane.DRIVER, "engine", "engine: driver")
    if local_cores(master, conf) is None:
        return LaneChoice(Lane.SPARK, "cluster", f"spark.master {master}: the executors copy")
    return LaneChoice(Lane.DRIVER, "local", "local mode: the driver's threads are Spark's cores")


def small_copy_lane(engine: Engine, copies_arrow: bool) -> LaneChoice:
    """Who writes a one-chunk table's copy, read already on the driver: the driver (no Spark job) where
    the target takes Arrow copies (``Target.copies_arrow``), or a Spark job over the rows read."""
    if engine == "spark":
        return SPARK_ENGINE
    if not copies_arrow:
        return LaneChoice(Lane.SPARK, "target", "the target writes no Arrow copies")
    return LaneChoice(Lane.DRIVER, "small", "one chunk, read on the driver")
