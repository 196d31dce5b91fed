"""MySQL/MariaDB behind the ``Source`` interface: the binlog for changes, per-chunk snapshots for the copy.

Positions are binlog (file number << 32 | offset) ints (``position.py``). State stays in PostgreSQL
(``source.state_dsn``). What PostgreSQL has and MySQL does not, the run skips: no publication (the
binlog client filters the tracked tables itself), no slot (the server keeps binlog files for
``binlog_expire_logs_seconds``; a purged position is refused at start-up), no catalog watch
(DDL arrives in the binlog: the next TABLE_MAP of a changed table is a Relation).

The copy: each chunk (a primary-key range) is read under its own ``START TRANSACTION WITH
CONSISTENT SNAPSHOT`` and carries that snapshot's binlog position on every row (``copy.py``); the
round's position, read before any chunk starts, is at or before every chunk's, so the apply pass
replays the binlog after it and the position rule keeps each row's newer state.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

import psycopg
import pymysql

from headrace.core.changes import Begin, Commit, Event, Relation
from headrace.core.errors import SourceError, TableNotFound, TransientError
from headrace.core.names import TableName
from headrace.core.schema import TableSchema
from headrace.core.settings import redacted_dsn
from headrace.source.base import ChangeStream, ChunkRead, CopySnapshot, Route, Source
from headrace.source.mysql import catalog, check
from headrace.source.mysql import copy as chunked
from headrace.source.mysql.connect import connect, parse_dsn
from headrace.source.mysql.identity import dropped_message
from headrace.source.mysql.newest import NewestSchemas, staged_in_state, staged_schemas
from headrace.source.mysql.position import format_position, to_int

if TYPE_CHECKING:
    from headrace.state.store import StateStore

Conn = Any  # a pymysql connection
SYSTEM_DATABASES = ("mysql", "information_schema", "performance_schema", "sys")
ROWS_PER_PAGE = 50  # snapshot.chunk_pages is in 8 KiB pages; a MySQL chunk is a key range of about this many rows


def default_server_id(pipeline: str) -> int:
    """A replica server_id derived from the pipeline name (stable, and unlikely to collide)."""
    return 1_000_000 + zlib.crc32(pipeline.encode()) % 1_000_000_000


class MySqlSource(Source):
    """A MySQL/MariaDB source (row-based binlog, ``mysql-replication``)."""

    kind = "mysql"
    label = "MariaDB/MySQL"
    transient_errors = (pymysql.err.OperationalError, pymysql.err.InterfaceError)

    _renamed: dict[int, TableName] = {}  # noqa: RUF012 -- replaced, never mutated (configured_names)
    _generation = 0  # changes of the captured table set (capture_tables), for the stream's NewestSchemas

    @property
    def server_id(self) -> int:
        return self.config.source.server_id or default_server_id(self.config.name)

    @property
    def replica_tag(self) -> str:
        """The host name the binlog client registers under (SHOW SLAVE HOSTS): tells this pipeline's own
        registrations (a connection a killed run left) from another replica's under the same id."""
        return f"headrace:{self.config.name}"[:60]

    # -- connections and checks --------------------------------------------------------------------
    def connect(self) -> AbstractContextManager[Any]:
        return contextlib.closing(connect(self.dsn))

    def user(self) -> str | None:
        return parse_dsn(self.dsn).user

    def databases(self) -> list[str]:
        """The databases the config's tables or ``schemas:`` name."""
        settings = self.config.source
        return list(settings.schemas) or sorted({t.schema for t in settings.table_names})

    def problems(self) -> list[str]:
        try:
            with self.connect() as conn:
                names = self.configured_names(self.config.source.table_names)
                if self.config.source.discovers:
                    names = [TableName.parse(n) for n in self.list_tables(conn, self._schemas()).values()]
                return [*check.check_server(conn, names),
                        *check.replica_id_problems(conn, self.server_id, self.replica_tag,
                                                   derived=not self.config.source.server_id)]
        except (pymysql.err.Error, SourceError, TransientError) as exc:
            return [f"cannot connect to the source {redacted_dsn(self.dsn)}: {str(exc).strip()}"]

    def identity(self, conn: Conn) -> str:
        return _identity(conn)

    def check_same_source(self, conn: Conn, state: StateStore) -> None:
        from headrace.source.mysql.binlog import same_server

        meta = state.meta()
        if meta is None:
            return
        now, recorded = _identity(conn), str(meta["system_identifier"])
        if not same_server(recorded, now):
            raise SourceError(
                f"the source {redacted_dsn(self.dsn)} is another MariaDB/MySQL server than the one pipeline"
                f" {state.pipeline} was set up on (now {now}; recorded {recorded}): its binlog positions mean"
                " nothing here. Point source.dsn back at the original server, or copy every table again from"
                " this one: `headrace reset -c <pipeline file> --yes`, then run (MariaDB's server_uid changes"
                " with the host, the data directory or the port)")
        self.check_capture(conn, state)

    def probe(self) -> None:
        with self.connect() as conn, conn.cursor() as cur:
            cur.execute("SELECT 1")

    # -- catalog ------------------------------------------------------------------------------------
    def _schemas(self) -> list[str] | None:
        return list(self.config.source.schemas) or None

    def list_tables(self, conn: Conn, schemas: list[str] | None) -> dict[int, str]:
        databases = schemas or _all_databases(conn)
        return {catalog.table_id(t.schema, t.name): str(t) for t in catalog.list_tables(conn, databases)}

    def table_problems(self, conn: Conn, name: str) -> list[str]:
        return check.table_problems(conn, TableName.parse(name))  # keyless tables are fine: full-row identity

    def configured_names(self, names: list[TableName]) -> list[TableName]:
        """``names`` with each table state tracks under its name now: a renamed table keeps the id of its
        first name (``identity.Identities``), so the config may go on naming it by that name, or by its
        new one (as for PostgreSQL, whose oids follow a table). Reads state's renamed tables
        (``renamed_tables``) for ``read_table_schema`` and ``current_names`` too."""
        self._renamed = renamed_tables(self.config.source.state_dsn, self.config.name)
        return [self._renamed.get(catalog.table_id(n.schema, n.name), n) for n in names]

    def _name(self, conn: Conn, table: str | TableName | int) -> TableName:
        if isinstance(table, TableName):
            return table
        if isinstance(table, str):
            return TableName.parse(table)
        names = self.current_names(conn, [table])
        if not names:
            raise TableNotFound(f"table with id {table} no longer exists in the source")
        return names[0]

    def read_table_schema(self, conn: Conn, table: str | TableName | int) -> TableSchema:
        name = self._name(conn, table)
        schema = catalog.read_table_schema(conn, name.schema, name.name)
        tracked = next((oid for oid, now in self._renamed.items() if now == name), None)
        # A tracked table renamed keeps its first name's id: the new name's hash would be another table.
        return schema if tracked is None else replace(schema, oid=tracked)

    def assess(self, conn: Conn, names: list[str | TableName]) -> dict[str, Any]:
        assessed: list[dict[str, Any]] = []
        for table in names:
            name = TableName.parse(table) if isinstance(table, str) else table
            try:
                schema = catalog.read_table_schema(conn, name.schema, name.name)
            except SourceError as exc:
                assessed.append({"table": str(name), "oid": None, "exists": False, "ready": False,
                                 "problems": [str(exc)]})
                continue
            problems = check.table_problems(conn, name)
            assessed.append({"table": str(name), "oid": schema.oid, "exists": True, "ready": not problems,
                             "problems": problems, "key": list(schema.key), "columns": len(schema.columns),
                             "replica_identity": "primary key" if schema.key else "full row (no primary key)",
                             "kept_as_text": []})
        server = check.server_problems(conn)
        return {"server_problems": server, "tables": assessed,
                "problems": server + [p for t in assessed for p in t["problems"]]}

    def current_names(self, conn: Conn, oids: list[int]) -> list[TableName]:
        """Tables' names now: a renamed table keeps the id of its first name (``identity.Identities``),
        so the running stream's name for an id comes first, the catalog's ``table_id`` of a name after."""
        listed = catalog.list_tables(conn, _all_databases(conn))
        found = {catalog.table_id(t.schema, t.name): t for t in listed}
        stream: PositionStream | None = getattr(self, "_stream", None)
        names: list[TableName] = []
        for oid in oids:
            if stream is not None and oid in stream.inner.dropped:
                continue
            current = stream.inner.identities.name_of(oid) if stream is not None else None
            name = TableName(current[0], current[1]) if current is not None else None
            name = name or self._renamed.get(oid) or found.get(oid)  # no stream yet: state's names
            if name is not None and name in listed:
                names.append(name)
        return names

    # -- capture --------------------------------------------------------------------------------------
    def prepare_capture(self, conn: Conn, tables: list[TableName]) -> int:
        return self.current_position(conn)  # a new pipeline streams from now; its copies start after

    def capture_tables(self, conn: Conn, tables: list[TableName]) -> None:
        # Called after capture learns a table added (or removed) and before its copy's snapshot: the
        # stream rebuilds its map of tracked tables at its next TABLE_MAP (NewestSchemas).
        self._generation += 1

    def check_capture(self, conn: Conn, state: StateStore) -> None:
        meta = state.meta()
        if meta is None:
            return
        captured = int(meta["captured_lsn"])
        with conn.cursor() as cur:
            cur.execute("SHOW BINARY LOGS")
            files = [to_int(row[0], 0) for row in cur.fetchall()]
        if files and captured < min(files):
            raise SourceError(
                f"the binlog at {format_position(captured)}, where pipeline {state.pipeline} resumes, was purged"
                " from the source (binlog_expire_logs_seconds, or PURGE BINARY LOGS), so the changes since are gone:"
                " the target can no longer be kept exact. Copy every table again: `headrace reset -c <pipeline"
                " file> --yes`, then run; keep binlogs longer than headrace may stop (binlog_expire_logs_seconds)")

    def open_stream(self, start: int, known: Callable[[], dict[int, TableSchema]]) -> ChangeStream:
        from headrace.source.mysql.binlog import BinlogStream

        # Column ids given by schema changes staged but not applied yet, read here (not by a check).
        newest = NewestSchemas(known, staged_in_state(self.config.source.state_dsn, self.config.name),
                               lambda: self._generation)

        def tracked(database: str, table: str) -> bool:
            return catalog.table_id(database, table) in newest()  # state's ids; rebuilt only when they change

        inner = BinlogStream(self.dsn, self.server_id, start, tracked, known=newest, tag=self.replica_tag)
        self._stream = PositionStream(inner, start, newest)
        return self._stream

    def relation_schema(self, conn: Conn, stream: ChangeStream, ev: Relation, known: TableSchema) -> TableSchema:
        assert isinstance(stream, PositionStream)
        return stream.inner.schema(ev.oid)  # the TABLE_MAP's shape with column ids, not the catalog's

    def heartbeat(self, conn: Conn) -> None:
        pass  # the server's own heartbeat events move the position

    def flushed_position(self, conn: Conn) -> int:
        return self.current_position(conn)

    def current_position(self, conn: Conn) -> int:
        with conn.cursor() as cur:
            cur.execute("SHOW MASTER STATUS")
            row = cur.fetchone()
        if row is None:
            raise SourceError("the source has no binary log: set log_bin (and binlog_format = ROW) in my.cnf")
        return to_int(row[0], int(row[1]))

    def format_position(self, pos: int) -> str:
        return format_position(pos)

    # -- the initial copy ---------------------------------------------------------------------------
    @contextmanager
    def copy_snapshot(self, name: str) -> Iterator[CopySnapshot]:  # type: ignore[override]
        with self.connect() as conn:
            position = self.current_position(conn)  # before any chunk's snapshot: at or before all of them
        yield CopySnapshot(position, None)

    def schema_at(self, conn: Conn, oid: int, snapshot: CopySnapshot) -> TableSchema | None:
        names = self.current_names(conn, [oid])
        return catalog.read_table_schema(conn, names[0].schema, names[0].name) if names else None

    def plan_chunks(self, conn: Conn, table: TableSchema) -> list[tuple[int, int]]:
        if not table.key:
            return [chunked.WHOLE_TABLE]  # keyless: one snapshot, one position for every row
        return chunked.plan_chunks(conn, table, self.config.snapshot.chunk_pages * ROWS_PER_PAGE)

    def chunk_reader(self, table: TableSchema, snapshot: CopySnapshot, binary: bool) -> ChunkRead:
        return ChunkRead(partial(chunked.copy_chunk, self.dsn, table), [Route.TEXT] * len(table.columns),
                         per_row_position=True)

    def text_columns_watch(self, conn: Conn, tracked: list[int]) -> set[int]:
        return set()  # columns_as_text is PostgreSQL's


class PositionStream:
    """The binlog stream, plus an empty transaction whenever the binlog moved past transactions that
    touch no tracked table (or DDL): capture registers that position, as a PostgreSQL heartbeat's
    commit lets it, so an idle pipeline is caught up and a restart does not read them again."""

    def __init__(self, inner: Any, start: int, known: Callable[[], dict[int, TableSchema]] = dict) -> None:
        self.inner = inner
        self._known = known  # state's schemas: a dropped table's name when the stream never saw its rows
        self._sent = start  # the end of the last transaction handed to capture
        self._open = False  # a Begin was handed over without its Commit yet
        self._reported: dict[int, str] = {}  # tables dropped -> message (``new_table_errors``)

    def read(self, max_messages: int, timeout: float) -> list[tuple[int, Event]]:
        events: list[tuple[int, Event]] = self.inner.read(max_messages, timeout)
        for _pos, ev in events:
            if isinstance(ev, Begin):
                self._open = True
            elif isinstance(ev, Commit):
                self._open = False
                self._sent = max(self._sent, ev.end_lsn)
        moved = int(self.inner.position)
        if not self._open and moved > self._sent:
            events += [(moved, Begin(moved, 0, 0)), (moved, Commit(moved, moved, 0))]
            self._sent = moved
        return events

    def acknowledge(self, pos: int) -> None:
        self.inner.acknowledge(pos)

    def new_table_errors(self) -> dict[int, str]:
        """Tracked tables the binlog dropped since the last call (id -> the message naming the fix), for
        capture to hand to the run loop, which errors each (``run.table_watch``)."""
        for oid in [o for o in self._reported if o not in self.inner.dropped]:
            del self._reported[oid]  # tracked again (resync): a later drop is news again
        new: dict[int, str] = {}
        for oid, at in self.inner.dropped.items():
            if oid in self._reported:
                continue
            shape = self.inner._schemas.get(oid) or self._known().get(oid)
            name = (shape.schema, shape.name) if shape is not None else None
            created = self.inner.created.get(name) if name is not None else None
            label = str(TableName(*name)) if name is not None else f"with id {oid}"
            new[oid] = self._reported[oid] = dropped_message(
                label, format_position(at), format_position(created) if created is not None else None)
        return new

    def close(self) -> None:
        self.inner.close()


def renamed_tables(state_dsn: str | None, pipeline: str) -> dict[int, TableName]:
    """Tables the pipeline tracks whose name now is not the one their id was made from (renamed since
    first tracked): id -> name now, from each table's newest schema (staged, else state's). Empty
    before the first run, or when state cannot be read (then the start-up check says so)."""
    from headrace.state.store import StateStore

    if not state_dsn:
        return {}
    try:
        state = StateStore(state_dsn, pipeline)
        try:
            if not state.installed():
                return {}
            staged = staged_schemas(state)
            newest = {row.oid: staged.get(row.oid, row.schema) for row in state.tables()}
        finally:
            state.close()
    except psycopg.Error:
        return {}
    return {oid: TableName(s.schema, s.name) for oid, s in newest.items()
            if catalog.table_id(s.schema, s.name) != oid}


def _all_databases(conn: Conn) -> list[str]:
    with conn.cursor() as cur:
        cur.execute("SELECT schema_name FROM information_schema.schemata")
        return [r[0] for r in cur.fetchall() if r[0] not in SYSTEM_DATABASES]


def _identity(conn: Conn) -> str:
    from headrace.source.mysql.binlog import server_identity

    return server_identity(conn)
