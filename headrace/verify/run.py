"""``headrace verify``: every table compared at one consistent point, then the rows still changing
compared again at later points until they settle or the time is up; results recorded in state."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import duckdb

from headrace.config import PipelineConfig
from headrace.core.errors import HeadraceError
from headrace.core.names import TableName, TableNameError
from headrace.source import source_kind
from headrace.state.store import StateStore, TableRow
from headrace.state.verify import VerifyStore
from headrace.verify.compare import Progress, TableCheck, compare_table, recheck_table
from headrace.verify.lake import pinned_target
from headrace.verify.point import SourcePoint, VerifyError, wait_for_target
from headrace.verify.sides import LakeSide, SourceSide


@dataclass(frozen=True)
class VerifyOptions:
    """How ``verify`` runs: which tables (None: all), the share of keys (``sample``), how long to wait
    for the target to reach a point (``wait_seconds``), and for changing rows to settle."""

    tables: tuple[str, ...] | None = None
    sample: float = 1.0
    wait_seconds: float = 120.0
    settle_seconds: float = 60.0


def _selected(rows: list[TableRow], names: tuple[str, ...] | None) -> list[TableRow]:
    if not names:
        return rows
    by_name = {r.qualified_name: r for r in rows}
    out = []
    for name in names:
        try:
            wanted = str(TableName.parse(name))
        except TableNameError as exc:
            raise VerifyError(f"--tables {name}: {exc}") from exc
        if wanted not in by_name:
            raise VerifyError(f"{name} is not replicated by this pipeline (see `headrace status`)")
        out.append(by_name[wanted])
    return out


def _shape_problem(point: SourcePoint, side: SourceSide, row: TableRow) -> str | None:
    """Why the source table's shape at the point differs from the target's (a change in flight)."""
    try:
        at = point.shape(side, row)
    except HeadraceError as exc:
        return str(exc)
    if [(c.name, c.type.kind) for c in at.columns] != [(c.name, c.type.kind) for c in row.schema.columns]:
        return (f"its columns are changing (source: {', '.join(at.column_names)}; target: "
                f"{', '.join(row.schema.column_names)}): run verify again once the change is applied")
    return None


def source_point(config: PipelineConfig, state: StateStore) -> SourcePoint:
    """The pipeline's source, as verify reads it."""
    dsn = config.source.resolved_dsn()
    if source_kind(dsn) == "mysql":
        from headrace.source.mysql.position import epoch_of
        from headrace.verify.mysql import MySqlPoint

        return MySqlPoint(dsn, epoch_of(state.captured_lsn()))
    from headrace.verify.postgres import PostgresPoint

    # PostgreSQL sums one query's rows on one core: the snapshot is read on as many connections as
    # the copy may use (snapshot.max_connections), each summing a part of the table's pages
    return PostgresPoint(dsn, config.source.text_columns, config.snapshot.max_connections)


def verify(config: PipelineConfig, options: VerifyOptions, progress: Progress) -> list[TableCheck]:
    """Compare the selected tables; each ``TableCheck`` says what differs (or why it could not run)."""
    state = StateStore(config.source.resolved_state_dsn(), config.name)
    try:
        if not state.installed() or state.meta() is None:
            raise VerifyError(f"pipeline {config.name} has not started yet: run `headrace run` first")
        point = source_point(config, state)
        rows = _selected(state.tables(), options.tables)
        if not rows:
            raise VerifyError(f"pipeline {config.name} replicates no tables yet")
        return _verify(config, point, state, rows, options, progress)
    finally:
        state.close()


def _verify(config: PipelineConfig, point: SourcePoint, state: StateStore, rows: list[TableRow],
            options: VerifyOptions, progress: Progress) -> list[TableCheck]:
    """The first round at one point, every table; then ``_settle``. One connection reads the source
    in the snapshot, one reads it as it is now (row versions)."""
    checks = {r.oid: TableCheck(r.qualified_name, r.schema) for r in rows}
    with point.current() as current:
        with point.snapshot() as (source, position):
            progress.note(f"source snapshot at {point.format_position(position)}; waiting for the target to reach it")
            estimates = point.estimates(source, rows)
            live = []
            for r in rows:
                checks[r.oid].position = position
                checks[r.oid].position_text = point.format_position(position)
                if not config.history.mirrored(r.schema.table_name):
                    modes = ", ".join(config.history.modes(r.schema.table_name))
                    checks[r.oid].error = (f"{r.qualified_name}: its target table is its history ({modes}), not a"
                                           " mirror of it; verify compares mirrors: list the table as"
                                           " [mirror, ...] in history.tables to have one")
                elif (problem := _shape_problem(point, source, r)) is not None:
                    checks[r.oid].error = f"{r.qualified_name}: {problem}"
                else:
                    live.append(r)
            live = _reached(checks, live, wait_for_target(point, state, live, position, options.wait_seconds))
            if live:
                with pinned_target(config, [r.schema for r in live]) as target:
                    _first_round(point, checks, live, source, target, current, position, options, estimates,
                                 progress)
        _settle(config, point, state, current, checks, live, options, progress)
    return [checks[r.oid] for r in rows]


def _settle(config: PipelineConfig, point: SourcePoint, state: StateStore, current: SourceSide,
            checks: dict[int, TableCheck], rows: list[TableRow], options: VerifyOptions, progress: Progress) -> None:
    """Later rounds: the rows that changed while compared, again at new points, until they settle
    or ``options.settle_seconds`` have passed."""
    deadline = time.monotonic() + options.settle_seconds
    while (busy := [r for r in rows if checks[r.oid].pending and checks[r.oid].error is None]) \
            and time.monotonic() < deadline:
        progress.note(f"{sum(len(checks[r.oid].pending) for r in busy)} rows changed while compared: again later")
        with point.snapshot() as (source, position):
            busy = _reached(checks, busy, wait_for_target(point, state, busy, position, options.wait_seconds))
            if not busy:
                return
            with pinned_target(config, [r.schema for r in busy]) as target:
                progress.note(f"comparing them again at {point.format_position(position)}")
                for r in busy:
                    _guarded(point, checks[r.oid], lambda c=checks[r.oid], s=source, t=target, p=position:
                             recheck_table(s, t, current, c, p))
        time.sleep(0.2)


def _reached(checks: dict[int, TableCheck], rows: list[TableRow], behind: dict[int, str]) -> list[TableRow]:
    """The tables whose target reached the point; the others get their reason as their error."""
    for oid, why in behind.items():
        checks[oid].error = f"{checks[oid].table}: {why}"
    return [r for r in rows if r.oid not in behind]


def _first_round(point: SourcePoint, checks: dict[int, TableCheck], rows: list[TableRow], source: SourceSide,
                 target: LakeSide, current: SourceSide, position: int, options: VerifyOptions,
                 estimates: dict[int, int], progress: Progress) -> None:
    for i, r in enumerate(rows):
        progress.table(i, len(rows), r.qualified_name)
        _guarded(point, checks[r.oid], lambda c=checks[r.oid], r=r: compare_table(
            source, target, current, c, position, options.sample, estimates.get(r.oid, 0), progress))
    progress.table(len(rows), len(rows), "")


def _guarded(point: SourcePoint, check: TableCheck, compare: Any) -> None:
    """Run one table's comparison; a database error becomes that table's error, not the command's."""
    caught: tuple[type[Exception], ...] = (*point.errors, duckdb.Error)
    try:
        compare()
    except caught as exc:
        check.error = f"{check.table}: {str(exc).strip().splitlines()[0]}"


def report(check: TableCheck, sample: float) -> dict[str, Any]:
    """One table's result as ``--json`` prints it and state records it."""
    if check.error is not None:
        status = "error"
    elif check.differs:
        status = "different"
    elif check.pending:
        status = "unsettled"
    else:
        status = "equal"
    return {"table": check.table, "oid": check.schema.oid, "status": status, "equal": status == "equal",
            "position": check.position_text,
            "position_int": check.position, "sample": sample,
            "rows_source": check.rows_source, "rows_target": check.rows_target,
            "differences": [d.as_dict() for d in check.differences], "unsettled": len(check.pending),
            "differing_rows_not_listed": check.unlisted,
            "error": check.error}


def record(config: PipelineConfig, reports: list[dict[str, Any]]) -> None:
    """Keep each table's result for status, the API and metrics."""
    store = VerifyStore(config.source.resolved_state_dsn(), config.name)
    try:
        for r in reports:
            store.record(r)
    finally:
        store.close()
