"""The materializer's driver side: pick a table's next staged batch, hand it to the target, advance.

A batch is a run of consecutive log entries of one table written under one schema. The cursor
advances only after the target committed; a target that stores the cursor with its data
(``Target.stores_cursor``) is the authority on where the table stands.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import pyarrow as pa

from headrace.config import ApplyConfig, SchemaChangesConfig, ValuesConfig
from headrace.core.batch import ChangeBatch
from headrace.core.errors import ConfigError
from headrace.core.faults import crash_point
from headrace.core.interfaces import Target
from headrace.core.lanes import Engine, Lane, LaneChoice, NotOnLane
from headrace.core.position import Position, format_lsn
from headrace.core.rows import HR_FROM
from headrace.core.schema import TableSchema
from headrace.core.spark_types import ValueRules, value_rules
from headrace.engines.driver.batch import batch_schema, read_driver_batch
from headrace.engines.spark.arrow import to_arrow
from headrace.engines.spark.batch import read_change_batch
from headrace.history.config import HistoryConfig, Mode
from headrace.history.writer import apply_history
from headrace.log.index import LogEntry
from headrace.logs import event
from headrace.materialize.evolve import evolve_table
from headrace.materialize.lanes import SPARK_ENGINE, batch_build_lane
from headrace.state.store import StateStore, TableRow

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("headrace.materialize")


# A table written in one history mode under its own name: its batches are built and committed there only.
HISTORY_ONLY = LaneChoice(Lane.DRIVER, "history", "a history table without a mirror: built on the driver, committed by the target's history writer")

# apply.driver_batch_rows's default, for callers without a pipeline's config (tests, benches).
DRIVER_BATCH_ROWS: int = ApplyConfig().driver_batch_rows


@dataclass(frozen=True)
class Applied:
    """What one apply step did."""

    table: str
    entries: int
    rows_in: int
    log_offset: int
    applied_lsn: int
    seconds: float
    drained: bool  # the batch reached the end of the table's log as it stood when planned
    ddl: tuple[str, ...] = ()  # schema change kinds applied to the target before this batch
    # (column, reason) -> values the casts changed (``values.infinity: clamp``)
    values_changed: dict[tuple[str, str], int] = field(default_factory=dict)
    build: LaneChoice = SPARK_ENGINE  # where the batch was read, deduplicated and cast, and why
    apply: LaneChoice = SPARK_ENGINE  # where it was committed into the target, and why

    @property
    def lanes(self) -> dict[str, str]:
        """Both lanes and their reasons, as status shows them."""
        return {"build": self.build.lane.value, "build_reason": self.build.detail or self.build.reason,
                "apply": self.apply.lane.value, "apply_reason": self.apply.detail or self.apply.reason}


class CursorCache:
    """Each table's cursor as last read or advanced by this process, so a quiet table costs no read.

    A cursor moves only when headrace commits a batch, and that commit updates the cache; so the
    cached value stays right as long as nothing else writes it. What else can: a failed apply (the
    target may or may not have committed), a new copy (another snapshot), a target opened anew (an
    outage, a restart). The run drops the entry (``forget``) or the whole cache for those, and the
    next read goes to the target or state again.
    """

    def __init__(self) -> None:
        self._target: Target | None = None
        self._known: dict[int, tuple[int | None, int]] = {}  # oid -> (snapshot LSN, cursor)

    def get(self, target: Target, row: TableRow) -> int | None:
        """The cached cursor, or None when it must be read."""
        if target is not self._target:  # reopened: what the old one said is not evidence any more
            self._target, self._known = target, {}
            return None
        known = self._known.get(row.oid)
        return known[1] if known is not None and known[0] == row.snapshot_lsn else None

    def put(self, target: Target, row: TableRow, cursor: int) -> None:
        """Remember ``cursor`` as the table's position (read back, or just committed)."""
        if target is not self._target:
            self._target, self._known = target, {}
        self._known[row.oid] = (row.snapshot_lsn, cursor)

    def forget(self, oid: int) -> None:
        """The table's cursor may have moved behind our back: read it again next time."""
        self._known.pop(oid, None)


def current_cursor(state: StateStore, target: Target, row: TableRow, cache: CursorCache | None = None) -> int:
    """The table's position in the staged log: from the target when it keeps it, else from state
    (through ``cache`` when given: read once, then kept in step by ``apply_next``)."""
    if cache is not None and (cached := cache.get(target, row)) is not None:
        return cached
    if target.stores_cursor:
        cursor = max(target.read_cursor(row.schema) or 0, 0)
    else:
        cursor = state.log_index.cursor(row.oid)
    if cache is not None:
        cache.put(target, row, cursor)
    return cursor


def next_batch(state: StateStore, row: TableRow, cursor: int, max_files: int,
               max_rows: int | None = None, through: int | None = None) -> list[LogEntry]:
    """Consecutive entries after ``cursor`` (up to offset ``through``, a cut) that share one schema,
    at most ``max_files`` of them and, with ``max_rows``, no more staged rows than that (but always
    the first entry)."""
    entries = state.log_index.entries(row.oid, cursor, max_files, through)
    if not entries:
        return []
    first = entries[0].schema
    batch: list[LogEntry] = []
    rows = 0
    for entry in entries:
        if entry.schema != first or (max_rows is not None and batch and rows + entry.rows > max_rows):
            break
        batch.append(entry)
        rows += entry.rows
    return batch


@dataclass(frozen=True)
class PlannedBatch:
    """A table's next batch as planned on the run loop's thread (``plan_batch``): which staged files,
    under which schema (the target evolved to it already), skipping what the copy holds."""

    row: TableRow
    cursor: int
    tail: int  # the table's last staged offset when planned
    entries: list[LogEntry]
    schema: TableSchema
    skip: Position | None
    rules: ValueRules
    ddl: tuple[str, ...]
    started: float  # time.monotonic() when planned
    build: LaneChoice = SPARK_ENGINE  # where it is to be read, deduplicated and cast (lanes.batch_build_lane)
    history: tuple[Mode, ...] = ()  # history tables written before the mirror (headrace.history)
    mirrored: bool = True  # False: the table is its one history mode under its own name, no mirror
    driver_rows: int = DRIVER_BATCH_ROWS  # apply.driver_batch_rows (``collected``)
    read_ahead: bool = False  # built while the table's previous batch committed (``run.read_ahead``)


def plan_batch(state: StateStore, target: Target, row: TableRow, max_files: int,
               policy: SchemaChangesConfig | None = None, values: ValuesConfig | None = None,
               cursors: CursorCache | None = None, driver_rows: int = DRIVER_BATCH_ROWS,
               max_rows: int | None = None, engine: Engine = "auto", through: int | None = None,
               history: HistoryConfig | None = None) -> PlannedBatch | None:
    """The table's next batch, or None when it is caught up with the staged log. Touches the state
    store and runs the schema change DDL, so it runs where the state store's connection lives (the
    run loop's thread); ``execute_batch`` may then run on another thread. ``driver_rows`` is
    ``apply.driver_batch_rows`` and ``engine`` the pipeline's (``lanes.batch_build_lane``); ``max_rows``
    ``apply.max_batch_rows``, the most staged rows a keyed table's batch takes (a keyless table's
    goes through Spark whatever its size: not capped); ``through``: no entry past this offset (a cut,
    ``consistency``)."""
    cursor = current_cursor(state, target, row, cursors)
    tail = state.log_index.last_offset(row.oid)
    entries = next_batch(state, row, cursor, max_files, max_rows if row.schema.key else None, through)
    if not entries:
        return None
    started = time.monotonic()
    schema, ddl = row.schema, list[str]()
    if entries[0].schema != row.schema and (row.snapshot_lsn is None or entries[-1].max_lsn >= row.snapshot_lsn):
        # The table changed shape between the last batch and this one: the target follows first.
        # (Batches wholly before the copy are skipped; the copy already has the newer shape.)
        schema, ddl = evolve_table(state, target, row.schema, entries[0].schema, policy or SchemaChangesConfig(),
                                   entries[0].min_lsn)
        target.ensure_table(schema)
    return _planned(target, row, cursor, tail, entries, schema, tuple(ddl), values, driver_rows, engine, history,
                    started)


def plan_following(state: StateStore, target: Target, row: TableRow, in_flight: PlannedBatch, tail: int,
                   max_files: int, values: ValuesConfig | None = None, driver_rows: int = DRIVER_BATCH_ROWS,
                   max_rows: int | None = None, engine: Engine = "auto") -> PlannedBatch | None:
    """The batch after ``in_flight`` (the table's batch a worker is committing), planned now: only
    when it is full (``tail``, the table's last staged offset, lies beyond it: planned later, it would
    hold the same entries), in the table's shape as it stands (no schema change to run first) and
    built on the driver without history tables; else None. Touches nothing but the log index."""
    if not row.schema.key or in_flight.history or not in_flight.mirrored or in_flight.build.lane is not Lane.DRIVER:
        return None
    cursor = in_flight.entries[-1].offset
    entries = next_batch(state, row, cursor, max_files, max_rows)
    if not entries or entries[-1].offset >= tail or entries[0].schema != row.schema:
        return None
    planned = _planned(target, row, cursor, tail, entries, row.schema, (), values, driver_rows, engine, None,
                       time.monotonic())
    return planned if planned.build.lane is Lane.DRIVER else None


def _planned(target: Target, row: TableRow, cursor: int, tail: int, entries: list[LogEntry], schema: TableSchema,
             ddl: tuple[str, ...], values: ValuesConfig | None, driver_rows: int, engine: Engine,
             history: HistoryConfig | None, started: float) -> PlannedBatch:
    # Changes committed before the snapshot's LSN are in the copy. A transaction committing exactly
    # at it is not (the slot decodes it), so keep ordinals >= 1 there; were it in the copy, applying
    # it again would change nothing (positions).
    skip = Position(row.snapshot_lsn, 0) if row.snapshot_lsn is not None else None
    rules = value_rules(row.qualified_name, target, (values or ValuesConfig()).infinity)
    build = batch_build_lane(engine, target.applies_arrow, schema, [e.facts for e in entries], driver_rows)
    modes = history.history_modes(row.schema.table_name) if history is not None else ()
    mirrored = history is None or history.mirrored(row.schema.table_name)
    return PlannedBatch(row, cursor, tail, entries, schema, skip, rules, ddl, started, build, modes, mirrored,
                        driver_rows)


@dataclass(frozen=True)
class Executed:
    """A batch committed into the target (``execute_batch``), with the lanes that built and applied it."""

    batch: ChangeBatch
    build: LaneChoice
    apply: LaneChoice


def execute_batch(spark: SparkSession, target: Target, planned: PlannedBatch,
                  built: Future[ChangeBatch] | None = None) -> Executed:
    """Read, cast and deduplicate the planned files and commit them to the target; the batch, where it
    was built and where it was applied. Touches neither the state store nor the cursor cache: safe
    on a worker thread, one batch per table.

    A batch the plan gave the driver (``lanes.batch_build_lane``) is built by DuckDB there
    (``headrace.engines.driver.batch``, no Spark job) unless a value needs Spark's casts; every
    other batch by Spark. ``built``: that driver build, started while the table's previous batch
    committed (``run.read_ahead``).
    """
    schema, skip, rules, entries = planned.schema, planned.skip, planned.rules, planned.entries
    if planned.history:
        write_history(target, planned)
    if not planned.mirrored:  # the history table committed the batch and the cursor: no mirror to apply
        staged = sum(e.rows for e in entries)
        return Executed(ChangeBatch(pa.table({}), None, staged, lane=Lane.DRIVER), HISTORY_ONLY, HISTORY_ONLY)
    batch, build = None, planned.build
    if build.lane is Lane.DRIVER:
        try:
            batch = built.result() if built is not None else driver_build(planned)
        except NotOnLane as exc:
            build = LaneChoice(Lane.SPARK, "values", str(exc))
            event(log, "apply.driver_fallback", table=planned.row.qualified_name, reason=str(exc))
    if batch is None:
        batch = collected(read_change_batch(spark, [e.path for e in entries], schema, skip, rules,
                                            facts=[e.facts for e in entries]), schema, target, planned.driver_rows)
    if isinstance(batch.changes, pa.Table):
        applied = target.apply_arrow_batch(schema, batch.changes, batch.truncate_before, entries[-1].offset)
    else:
        applied = target.apply_batch(schema, batch.changes, batch.truncate_before, entries[-1].offset)
    return Executed(batch, build, applied)


def driver_build(planned: PlannedBatch) -> ChangeBatch:
    """The planned batch read, deduplicated and cast by DuckDB on the driver (``read_driver_batch``)."""
    entries = planned.entries
    return read_driver_batch([e.path for e in entries], planned.schema, planned.skip, planned.rules,
                             [e.facts for e in entries])


def collected(batch: ChangeBatch, table: TableSchema, target: Target, driver_rows: int) -> ChangeBatch:
    """A keyed batch Spark built of at most ``driver_rows`` staged rows, collected to the driver as the
    Arrow table the driver's build gives (``batch_schema``), for a target that applies Arrow batches:
    Iceberg then applies it as a driver batch (position deletes or a rewrite, the MERGE only where
    those cannot), no MERGE job; DuckLake collects every batch anyway. The build stays Spark's
    (``engine: spark``: the executors' tasks); a batch whose key change left TOAST columns unchanged
    (``_hr_from``), a keyless one or a bigger one reaches the target as the DataFrame."""
    if (not target.applies_arrow or not table.key or isinstance(batch.changes, pa.Table)
            or batch.rows_in > driver_rows or HR_FROM in batch.changes.columns):
        return batch
    shape = batch_schema(table)
    return replace(batch, changes=to_arrow(batch.changes).select(shape.names).cast(shape))


def write_history(target: Target, planned: PlannedBatch) -> None:
    """Write the batch into the table's history tables before the mirror (``history.writer``)."""
    writer = target.history()
    if writer is None:
        raise ConfigError(f"history modes {list(planned.history)} for {planned.row.qualified_name}: target"
                          f" {target.name} writes no history tables; use target ducklake or iceberg, or"
                          " remove the table from history.tables")
    entries = [(e.offset, e.path) for e in planned.entries]
    written = apply_history(writer, planned.schema, planned.history, entries, planned.skip, planned.rules,
                            planned.cursor, own=not planned.mirrored)
    if written and planned.mirrored:
        event(log, "apply.history", table=planned.row.qualified_name, modes=",".join(written),
              log_offset=planned.entries[-1].offset)
        crash_point("apply.after_history_commit")


def finish_batch(state: StateStore, target: Target, planned: PlannedBatch,
                 executed: Executed, cursors: CursorCache | None = None) -> Applied:
    """After the target's commit (run loop's thread): record a TRUNCATE, advance the cursor."""
    row, last, ddl = planned.row, planned.entries[-1], list(planned.ddl)
    batch, build, apply = executed.batch, executed.build, executed.apply
    if (trunc := batch.truncate_before) is not None:
        state.record_ddl(row.oid, row.qualified_name, "truncate", f"TRUNCATE at {format_lsn(trunc.lsn)}", trunc.lsn)
        ddl.append("truncate")
    crash_point("apply.after_target_commit")
    state.log_index.advance(row.oid, last.offset, last.max_lsn, batch.rows_in)
    if cursors is not None:
        cursors.put(target, row, max(planned.cursor, last.offset))
    applied = Applied(row.qualified_name, len(planned.entries), batch.rows_in, last.offset, last.max_lsn,
                      time.monotonic() - planned.started, drained=last.offset >= planned.tail, ddl=tuple(ddl),
                      values_changed=batch.values_changed, build=build, apply=apply)
    event(log, "apply.batch", table=applied.table, files=applied.entries, rows=applied.rows_in,
          log_offset=applied.log_offset, applied_lsn=format_lsn(applied.applied_lsn),
          seconds=round(applied.seconds, 3), build_lane=build.lane.value, build_reason=build.detail or build.reason,
          apply_lane=apply.lane.value, apply_reason=apply.detail or apply.reason,
          **({"read_ahead": True} if planned.read_ahead else {}))
    return applied


def apply_next(spark: SparkSession, state: StateStore, target: Target, row: TableRow,
               max_files: int, policy: SchemaChangesConfig | None = None,
               values: ValuesConfig | None = None, cursors: CursorCache | None = None,
               driver_rows: int = DRIVER_BATCH_ROWS) -> Applied | None:
    """Apply the table's next batch on this thread (plan, execute, finish); None when the table is
    caught up with the staged log.

    With ``cursors``, the caller must ``forget`` the table when this raises (the target may have
    committed the batch or not)."""
    planned = plan_batch(state, target, row, max_files, policy, values, cursors, driver_rows)
    if planned is None:
        return None
    return finish_batch(state, target, planned, execute_batch(spark, target, planned), cursors)
