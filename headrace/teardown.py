"""Removing a pipeline: ``headrace drop`` (everything it created) and ``headrace reset`` (its position).

``drop`` removes, in this order, what a pipeline leaves behind: with ``targets`` its target tables
(while the state still lists them), the replication slot (the one object that makes the source keep
WAL), the publication, the pipeline's rows in ``_headrace`` (the schema too when no other pipeline
has rows there), its cursor rows in a DuckLake, and its staged files. Each step removes only what
exists, so a second run, or a run after a crash half-way, finishes the job and then reports nothing
left.

``reset`` is the recovery from a lost slot: the same, but target tables stay and the ``_headrace``
schema always stays (its offset sequence must keep counting up, past any cursor a target kept). The
next ``headrace run`` creates a new slot and copies every table again; each copy replaces its target
table's rows.

A MySQL/MariaDB pipeline has nothing on the source (no slot, no publication: a replica's position
is its own, kept in state): ``drop`` removes its state rows, staged files and, with ``targets``,
target tables, without connecting to the source; ``reset`` forgets the binlog position, so the next
run reads the binlog from the server's position then and copies every table again. A running
pipeline is recognised by the lock its binlog reader holds in the state database
(``source.mysql.names.running_pid``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pyarrow.fs as pafs
from psycopg import sql

from headrace.config import PipelineConfig, source_kind
from headrace.core.errors import SourceError
from headrace.core.interfaces import Target
from headrace.core.names import TableName, path_segment
from headrace.core.schema import TableSchema
from headrace.log.store import StagingStore
from headrace.state.store import StateStore


@dataclass(frozen=True)
class Leftovers:
    """What a pipeline has on the source, in state, in staging and in its target."""

    slot: str | None  # the replication slot's name, when it exists
    slot_pid: int | None  # the walsender's pid while a ``headrace run`` streams from the slot
    publication: str | None
    state_rows: int  # rows of this pipeline in the _headrace tables
    tables: list[TableSchema] = field(default_factory=list)  # tracked tables (their targets)
    staged_files: int = 0
    staging_dir: str | None = None  # the staging store's folder (a path or URI)
    source_kind: str = "postgresql"  # "mysql": no slot or publication; slot_pid is the state lock's holder

    @property
    def nothing(self) -> bool:
        return not (self.slot or self.publication or self.state_rows or self.staged_files or self.staging_dir)

    def lines(self, targets: bool) -> list[str]:
        """The leftovers for people, one per line."""
        out = []
        if self.slot:
            out.append(f"replication slot {self.slot}")
        if self.publication:
            out.append(f"publication {self.publication}")
        if self.state_rows:
            out.append(f"{self.state_rows} rows in the _headrace state tables")
        if self.staging_dir:
            out.append(f"staging folder {self.staging_dir} ({self.staged_files} staged files)")
        if targets:
            out += [f"target table {TableName(t.target_schema, t.target_table)} (source {t.qualified_name})"
                    for t in self.tables]
        return out


def _state_tables(conn: psycopg.Connection[Any]) -> list[str]:
    """The _headrace tables that have a ``pipeline`` column (every one headrace creates)."""
    rows = conn.execute(
        "SELECT table_name FROM information_schema.columns WHERE table_schema = '_headrace'"
        " AND column_name = 'pipeline' ORDER BY table_name").fetchall()
    return [r[0] for r in rows]


def _staging_dir(config: PipelineConfig) -> StagingStore:
    return StagingStore.for_pipeline(config.staging.path, config.name)


def survey(config: PipelineConfig) -> Leftovers:
    """What ``drop`` would remove now."""
    dsn = config.source.resolved_dsn()
    kind = source_kind(dsn)
    slot = pub = None
    if kind == "postgresql":
        with psycopg.connect(dsn, autocommit=True) as conn:
            slot = conn.execute("SELECT slot_name, active_pid FROM pg_replication_slots WHERE slot_name = %s",
                                (config.slot_name,)).fetchone()
            pub = conn.execute("SELECT pubname FROM pg_publication WHERE pubname = %s",
                               (config.publication_name,)).fetchone()
    rows, tables, reader_pid = 0, [], None
    with psycopg.connect(config.source.state_dsn or dsn, autocommit=True) as conn:
        if kind == "mysql":
            from headrace.source.mysql.names import running_pid

            reader_pid = running_pid(conn, config.name)
        for name in _state_tables(conn):
            query = sql.SQL("SELECT count(*) FROM _headrace.{} WHERE pipeline = %s").format(sql.Identifier(name))
            rows += int(conn.execute(query, (config.name,)).fetchone()[0])  # type: ignore[index]
    if rows:
        state = StateStore(config.source.state_dsn or dsn, config.name)
        try:
            tables = [r.schema for r in state.tables()]
        finally:
            state.close()
    staging = _staging_dir(config)
    staged = sum(1 for f in staging.files() if f.endswith(".parquet"))
    return Leftovers(slot=slot[0] if slot else None, slot_pid=slot[1] if slot else reader_pid,
                     publication=pub[0] if pub else None, state_rows=rows, tables=tables,
                     staged_files=staged, staging_dir=staging.root if staging.exists_root() else None,
                     source_kind=kind)


def refuse_if_running(config: PipelineConfig, found: Leftovers, command: str) -> None:
    """A ``headrace run`` streams from the slot (MySQL: holds its lock in state): removing things under it
    would break it mid-write."""
    if found.slot_pid is not None and found.source_kind == "mysql":
        raise SourceError(
            f"pipeline {config.name} is running: its binlog reader holds the pipeline's lock in the state "
            f"database (backend pid {found.slot_pid} there). Stop the `headrace run` process first (Ctrl-C, or "
            f"SIGTERM to its pid; `systemctl stop` / `kubectl scale --replicas=0` for a service), then run "
            f"`headrace {command}` again"
        )
    if found.slot_pid is not None:
        raise SourceError(
            f"pipeline {config.name} is running: its replication slot {found.slot} is in use (walsender pid "
            f"{found.slot_pid} on the source). Stop the `headrace run` process first (Ctrl-C, or SIGTERM to "
            f"its pid; `systemctl stop` / `kubectl scale --replicas=0` for a service), then run `headrace "
            f"{command}` again"
        )


def drop_pipeline(config: PipelineConfig, targets: bool,
                  open_target: Callable[[], Target] | None = None, keep_schema: bool = False) -> list[str]:
    """Remove what ``survey`` found (target tables only with ``targets``); return what was removed.

    ``open_target`` opens the pipeline's target; needed only with ``targets``. ``keep_schema``
    keeps the ``_headrace`` schema even when no pipeline is left in it (``reset``).
    """
    found = survey(config)
    refuse_if_running(config, found, "reset" if keep_schema else "drop")
    done: list[str] = []
    if targets and found.tables:
        assert open_target is not None, "drop with targets needs the target"
        target = open_target()
        try:
            for table in found.tables:
                target.drop_table(table)
                done.append(f"target table {table.target_schema}.{table.target_table}")
        finally:
            target.close()  # a DuckLake is attached once per process: the cursor clean-up below attaches it
        done += _drop_table_folders(config, found.tables)
    dsn = config.source.resolved_dsn()
    if found.slot or found.publication:  # PostgreSQL only: a MySQL pipeline leaves nothing on the source
        with psycopg.connect(dsn, autocommit=True) as conn:
            if found.slot:
                # A slot can become active between survey and here; dropping then fails with a clear error.
                conn.execute("SELECT pg_drop_replication_slot(%s)", (found.slot,))
                done.append(f"replication slot {found.slot}")
            if found.publication:
                conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(found.publication)))
                done.append(f"publication {found.publication}")
    return done + _drop_rest(config, found, dsn, keep_schema)


def _drop_table_folders(config: PipelineConfig, tables: list[TableSchema]) -> list[str]:
    """On an object store, what a dropped table leaves in its folder (``<location>/<schema>/<table>``):
    files no snapshot references any more (an Iceberg PURGE deletes only the ones its metadata names;
    DuckLake leaves a dropped table's files to its cleanup). A local folder is left as the target left it."""
    from headrace import storage

    settings = config.target.settings
    inner = getattr(settings, "inner", None)  # the fault-injecting target wraps another
    settings = inner.settings if inner is not None else settings
    schema_setting = getattr(settings, "namespace", None) or getattr(settings, "schema_", None)
    done: list[str] = []
    for location in config.target.plugin.locations(config.target.settings):
        if not storage.is_object_store(location):
            continue
        for table in tables:
            folder = (f"{location.rstrip('/')}/{path_segment(schema_setting or table.target_schema)}/"
                      f"{path_segment(table.target_table)}")
            filesystem, path = storage.filesystem(folder)
            with contextlib.suppress(FileNotFoundError):
                if filesystem.get_file_info(path).type != pafs.FileType.NotFound:
                    filesystem.delete_dir(path)
                    done.append(f"folder {folder}")
    return done


def _drop_rest(config: PipelineConfig, found: Leftovers, dsn: str, keep_schema: bool) -> list[str]:
    """The state rows, the target's cursors and the staged files (what every source leaves)."""
    done: list[str] = []
    if found.state_rows:
        _forget_target_cursors(config)  # before the state rows: a crash in between is finished next time
        done += _drop_state(config.source.state_dsn or dsn, config.name, keep_schema)
    if found.staging_dir is not None:
        StagingStore.open(found.staging_dir).delete_all()
        done.append(f"staging folder {found.staging_dir} ({found.staged_files} staged files)")
    return done


def _drop_state(dsn: str, pipeline: str, keep_schema: bool) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        names = _state_tables(conn)
        deleted = 0
        for name in names:
            query = sql.SQL("DELETE FROM _headrace.{} WHERE pipeline = %s").format(sql.Identifier(name))
            deleted += conn.execute(query, (pipeline,)).rowcount
        others = 0
        for name in names:
            query = sql.SQL("SELECT count(*) FROM _headrace.{}").format(sql.Identifier(name))
            others += int(conn.execute(query).fetchone()[0])  # type: ignore[index]
        done = [f"{deleted} rows in the _headrace state tables"]
        if not others and not keep_schema:
            conn.execute("DROP SCHEMA _headrace CASCADE")
            done.append("schema _headrace (no other pipeline uses it)")
    return done


def _forget_target_cursors(config: PipelineConfig) -> None:
    """A DuckLake keeps each table's log offset beside its rows: a pipeline set up again under this
    name starts its offsets over, and a stale cursor there would skip its first changes."""
    if config.target.kind != "ducklake":
        return
    from headrace.targets.ducklake import extension
    from headrace.targets.ducklake.target import CURSOR_TABLE

    con = extension.connect(config.target.settings)
    try:
        with contextlib.suppress(Exception):  # no cursor table: the target never applied a change
            con.execute(f"DELETE FROM {CURSOR_TABLE} WHERE pipeline = ?", [config.name])
    finally:
        con.close()


def confirm(question: str, yes: bool, stdin: Any, stdout: Any) -> bool:
    """True with ``--yes``; on a terminal, ask; otherwise refuse (a script must say --yes)."""
    if yes:
        return True
    if not stdin.isatty():
        raise SourceError(f"{question.rstrip('?')}: refusing without confirmation; standard input is not a "
                          "terminal, so pass --yes to confirm")
    stdout.write(f"{question} [y/N] ")
    stdout.flush()
    return stdin.readline().strip().lower() in ("y", "yes")
