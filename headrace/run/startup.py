"""Start-up: check the source, set up what the pipeline needs, and reconcile the state with the source.

Idempotent: the state tables, the publication and the slot are created when missing and adopted
when present. A run refuses state the source or the staging store no longer matches (another
cluster, a slot moved or lost, staged files missing) with the remedy; tables dropped and created
again while headrace was down are copied anew, and tables created meanwhile are found (discovery).
"""

from __future__ import annotations

import logging
from typing import Any

from headrace.config import PipelineConfig
from headrace.core.errors import SourceError
from headrace.core.names import TableName
from headrace.core.schema import TableSchema
from headrace.log.store import StagingStore
from headrace.logs import event
from headrace.run.observer import RunObserver
from headrace.run.table_watch import TableWatch
from headrace.run.tracking import published_names
from headrace.source.base import Source
from headrace.state.invariants import check_staged_files, check_tables
from headrace.state.progress import DDL as PROGRESS_DDL
from headrace.state.store import StateStore, TableRow

log = logging.getLogger("headrace.pipeline")


def check(config: PipelineConfig, source: Source) -> list[str]:
    """Every problem that would stop ``run``, for people to read; empty when all is well."""
    return source.problems()


def setup(config: PipelineConfig, source: Source, state_dsn: str, watch: TableWatch, observer: RunObserver,
          staging: StagingStore) -> StateStore:
    """Create what the pipeline needs, idempotently, and return the state store."""
    problems = check(config, source)
    if problems:
        raise SourceError("the source is not ready:\n" + "\n".join(f"  - {p}" for p in problems))
    state = StateStore(state_dsn, config.name)
    state.install()
    state.conn.execute(PROGRESS_DDL)  # start-up checks and their remedies name it
    with source.connect() as conn:
        sysid = source.identity(conn)
        meta = state.meta()
        if meta and meta["system_identifier"] != sysid and source.kind == "mysql":
            # MariaDB's identity has several fields, compared by the source (a state recorded before one
            # was added still matches), which refuses another server naming both and the fix.
            source.check_same_source(conn, state)
        elif meta and meta["system_identifier"] != sysid:
            what = "cluster (system identifier" if source.kind == "postgresql" else "server (server UUID"
            raise SourceError(
                f"pipeline {config.name} was set up on another {source.label} {what} "
                f"{meta['system_identifier']}, now {sysid}): use a new pipeline "
                "name, or drop the _headrace rows of this pipeline to start over"
            )
        names = configured_tables(config, source, conn, state)
        schemas = [source.read_table_schema(conn, name) for name in names]
        # Refuse to run on state the source or the staging store no longer matches.
        source.check_capture(conn, state)
        for old, new in check_tables(state, schemas, config.schema_changes.recreated_table):
            resync_recreated(state, old, new, observer)
        check_staged_files(state, staging)
        watch.follow_text_columns(state, conn)  # source.columns_as_text changed
        # Tables added through the API or discovered stay published across restarts, by oid: a
        # dropped one drops out, and a recreated one is published only once it is tracked.
        published = list(dict.fromkeys(names + published_names(source, conn, state.tables())))
        slot_lsn = source.prepare_capture(conn, published)
    state.ensure_meta(sysid, config.slot_name, config.publication_name, slot_lsn)
    tracked = {row.oid: row for row in state.tables()}
    for schema in schemas:
        if schema.oid not in tracked:
            state.add_table(schema)
            event(log, "table.added", table=schema.qualified_name, oid=schema.oid)
            if meta is not None and config.source.discovers:  # created while headrace was down
                state.record_ddl(schema.oid, schema.qualified_name, "create_table", "new table: copying")
                observer.ddl_applied("create_table")
    return state


def configured_tables(config: PipelineConfig, source: Source, conn: Any, state: StateStore) -> list[TableName]:
    """The tables the config names; with schemas / all_tables, those found that can be replicated.

    A discovered table that cannot be replicated does not stop the others: it is noted as
    refused (``status`` shows why) and assessed again by each discovery pass.
    """
    settings = config.source
    if not settings.discovers:
        return source.configured_names(settings.table_names)
    tracked = {r.oid for r in state.tables()}
    names: list[TableName] = []
    refused = set()
    for oid, name in source.list_tables(conn, settings.schemas or None).items():
        problems = [] if oid in tracked else source.table_problems(conn, name)
        if problems:
            refused.add(oid)
            if state.refuse_table(oid, name, "; ".join(problems)):
                event(log, "table.refused", logging.WARNING, table=name, oid=oid, reason="; ".join(problems))
        else:
            names.append(TableName.parse(name))
    state.forget_refused(refused)
    return names


def resync_recreated(state: StateStore, old: TableRow, new: TableSchema, observer: RunObserver) -> None:
    """Start-up found ``old`` dropped and created again as ``new``: forget the old, copy the new.

    The copy replaces the target table's rows (and the table, if the new one has another shape).
    """
    state.remove_table(old.oid)  # its staged changes belong to the old table: never applied
    detail = f"oid {old.oid} -> {new.oid}, found at start-up: copying the new table into the same target table"
    state.record_ddl(new.oid, new.qualified_name, "recreate_table", detail)
    observer.ddl_applied("recreate_table")
    event(log, "table.recreated", logging.WARNING, table=new.qualified_name, old_oid=old.oid, oid=new.oid,
          resync=True)
