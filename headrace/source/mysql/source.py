"""MySQL/MariaDB behind the ``Source`` interface: the binlog for changes, per-chunk snapshots for the copy.

Positions are binlog (file number << 32 | offset) ints (``position.py``). State stays in PostgreSQL
(``source.state_dsn``). What PostgreSQL has and MySQL does not, the run skips: no publication (the
binlog client filters the tracked tables itself), no slot (the server keeps binlog files for
``binlog_expire_logs_seconds``; a purged position is refused at start-up). DDL arrives in the
binlog (the next TABLE_MAP of a changed table is a Relation; drops and renames are followed by the
stream); the catalog watch (``watch.py``) only finds new tables and copies recreated ones again.

The copy: each chunk (a primary-key range) is read under its own ``START TRANSACTION WITH
CONSISTENT SNAPSHOT`` and carries that snapshot's binlog position on every row (``copy.py``); the
round's position, read before any chunk starts, is at or before every chunk's, so the apply pass
replays the binlog after it and the position rule keeps each row's newer state.
"""

from __future__ import annotations

import contextlib
import logging
import zlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

import pymysql

from headrace.core.changes import Relation
from headrace.core.errors import SourceError, TableNotFound, TransientError
from headrace.core.names import TableName
from headrace.core.schema import TableSchema
from headrace.core.settings import redacted_dsn
from headrace.source.base import (
    CatalogWatch,
    ChangeStream,
    ChunkRead,
    CopySnapshot,
    LockWaiter,
    Route,
    Source,
)
from headrace.source.mysql import catalog, check, copy_locks, staged
from headrace.source.mysql import copy as chunked
from headrace.source.mysql.connect import connect, parse_dsn
from headrace.source.mysql.names import TableNames
from headrace.source.mysql.newest import NewestSchemas, staged_in_state
from headrace.source.mysql.position import epoch_of, format_position, to_int
from headrace.source.mysql.server import StreamStart, server_identity, stream_start
from headrace.source.mysql.stream import PositionStream, renamed_tables

if TYPE_CHECKING:
    from headrace.state.store import StateStore

log = logging.getLogger("headrace.source.mysql")
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
    _stream: PositionStream | None = None  # the running capture's stream (open_stream)
    _epoch: int | None = None  # this server's epoch in the positions (``_epoch_of``)

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
        """The server the pipeline read, or another of its replication topology whose binlog holds the
        GTID state recorded with the captured position (``server.stream_start``: a failover)."""
        if state.meta() is None:
            return
        self.check_capture(conn, state)

    def _start(self, conn: Conn, meta: dict[str, Any]) -> StreamStart:
        """Where the stream continues on this server (``server.stream_start``); keeps its epoch."""
        start = stream_start(conn, self.dsn, self.config.name, str(meta["system_identifier"]),
                             int(meta["captured_lsn"]), meta.get("captured_token"))
        self._epoch = start.epoch
        return start

    def _epoch_of(self, conn: Conn) -> int:
        """This server's epoch in the positions (``position.to_int``): 0 until a pipeline reads a
        second server; read from state once."""
        if self._epoch is None:
            meta = self._meta()
            self._epoch = 0 if meta is None else self._start(conn, meta).epoch
        return self._epoch

    def _record_token(self, position: int, token: str) -> None:
        """Keep ``token`` as the resume token of captured ``position`` if state has none for it (a token
        comes with each registered transaction; a pipeline that registered none has none)."""
        import psycopg

        assert self.config.source.state_dsn
        with psycopg.connect(self.config.source.state_dsn, autocommit=True) as conn:
            conn.execute("UPDATE _headrace.pipeline_meta SET captured_token = %s WHERE pipeline = %s"
                         " AND captured_lsn = %s AND captured_token IS NULL", (token, self.config.name, position))

    def _meta(self) -> dict[str, Any] | None:
        """State's pipeline row (None before the first run, or without a state database)."""
        from headrace.state.store import StateStore

        if not self.config.source.state_dsn:
            return None
        state = StateStore(self.config.source.state_dsn, self.config.name)
        try:
            return state.meta() if state.installed() else None
        finally:
            state.close()

    def probe(self) -> None:
        with self.connect() as conn, conn.cursor() as cur:
            cur.execute("SELECT 1")

    # -- catalog ------------------------------------------------------------------------------------
    def _schemas(self) -> list[str] | None:
        return list(self.config.source.schemas) or None

    def list_tables(self, conn: Conn, schemas: list[str] | None) -> dict[int, str]:
        """Tables of ``schemas`` (every database when None) by id: a tracked table renamed keeps the id
        of its first name (the stream's, else state's), so discovery does not take it for a new one."""
        databases = schemas or _all_databases(conn)
        stream = self._stream
        if stream is None:  # before capture runs (start-up): state's names
            self._renamed = renamed_tables(self.config.source.state_dsn, self.config.name)
        renamed = ({TableName(*name): oid for name, oid in stream.inner.renamed.items()} if stream is not None
                   else {name: oid for oid, name in self._renamed.items()})
        return {renamed.get(t, catalog.table_id(t.schema, t.name)): str(t)
                for t in catalog.list_tables(conn, databases)}

    def table_problems(self, conn: Conn, name: str) -> list[str]:
        return check.table_problems(conn, TableName.parse(name))  # keyless tables are fine: full-row identity

    def configured_names(self, names: list[TableName]) -> list[TableName]:
        """``names`` with each table state tracks under its name now: a renamed table keeps the id of its
        first name (``identity.Identities``), so the config may go on naming it by that name, or by its
        new one (as for PostgreSQL, whose oids follow a table). Reads state's renamed tables
        (``renamed_tables``) for ``read_table_schema`` and ``current_names`` too."""
        self._renamed = renamed_tables(self.config.source.state_dsn, self.config.name)
        return [self._renamed.get(catalog.table_id(n.schema, n.name), n) for n in names]

    def _watched(self, conn: Conn) -> list[str]:
        """The databases a pipeline's tables can be in: the config's, or every one for ``all_tables``."""
        return _all_databases(conn) if self.config.source.all_tables else self.databases()

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
            problems = check.table_problems(conn, name)  # the same sentences as `problems` (one line each)
            try:
                schema = catalog.read_table_schema(conn, name.schema, name.name)
            except SourceError as exc:
                assessed.append({"table": str(name), "oid": None, "exists": False, "ready": False,
                                 "problems": problems or [str(exc)]})
                continue
            assessed.append({"table": str(name), "oid": schema.oid, "exists": True, "ready": not problems,
                             "problems": problems, "key": list(schema.key), "columns": len(schema.columns),
                             "replica_identity": "primary key" if schema.key else "full row (no primary key)",
                             "kept_as_text": []})
        server = check.server_problems(conn)
        return {"server_problems": server, "tables": assessed,
                "problems": server + [p for t in assessed for p in t["problems"]]}

    def current_names(self, conn: Conn, oids: list[int]) -> list[TableName]:
        """Tables' names now: a renamed table keeps the id of its first name (``identity.Identities``),
        so the running stream's name for an id comes first, then state's, then the ``table_id`` of a
        table of the watched databases. Lists only the databases those names are in."""
        stream = self._stream
        wanted: dict[int, TableName | None] = {}
        for oid in oids:
            if stream is not None and oid in stream.inner.dropped:
                continue
            current = stream.inner.identities.name_of(oid) if stream is not None else None
            wanted[oid] = TableName(*current) if current is not None else self._renamed.get(oid)
        databases = {n.schema for n in wanted.values() if n is not None}
        if any(n is None for n in wanted.values()):
            databases.update(self._watched(conn))
        listed = catalog.list_tables(conn, sorted(databases))
        found = {catalog.table_id(t.schema, t.name): t for t in listed}
        if any(known is None and oid not in found for oid, known in wanted.items()):
            listed = catalog.list_tables(conn, _all_databases(conn))  # e.g. added through the API from elsewhere
            found = {catalog.table_id(t.schema, t.name): t for t in listed}
        present = set(listed)
        names = [name for oid, known in wanted.items() if (name := known or found.get(oid)) is not None]
        return [n for n in names if n in present]

    # -- capture --------------------------------------------------------------------------------------
    def prepare_capture(self, conn: Conn, tables: list[TableName]) -> int:
        return self.current_position(conn)  # a new pipeline streams from now; its copies start after

    def check_capture(self, conn: Conn, state: StateStore) -> None:
        meta = state.meta()
        if meta is None:
            return
        start = self._start(conn, meta)
        if start.gtid is not None:
            return  # on another server: its binlog holds the GTID state (checked); the dump refuses a purged one
        captured = int(meta["captured_lsn"])
        with conn.cursor() as cur:
            cur.execute("SHOW BINARY LOGS")
            files = [to_int(row[0], 0, start.epoch) for row in cur.fetchall()]
        if files and captured < min(files):
            raise SourceError(
                f"the binlog at {format_position(captured)}, where pipeline {state.pipeline} resumes, was purged"
                " from the source (binlog_expire_logs_seconds, or PURGE BINARY LOGS), so the changes since are gone:"
                " the target can no longer be kept exact. Copy every table again: `headrace reset -c <pipeline"
                " file> --yes`, then run; keep binlogs longer than headrace may stop (binlog_expire_logs_seconds)")

    def undecoded(self) -> Any:
        return staged.CODEC  # the changes of the tables whose rows C reads (``staged.py``)

    def open_stream(self, start: int, known: Callable[[], dict[int, TableSchema]]) -> ChangeStream:
        from headrace.source.mysql.binlog import BinlogStream

        names = TableNames(self.config.source.state_dsn, self.config.name) if self.config.source.state_dsn else None
        if names is not None:
            names.open()  # holds the running lock that `headrace drop` / `reset` look for

        def tracked(database: str, table: str) -> bool:
            return catalog.table_id(database, table) in newest()  # state's ids; rebuilt only when they change

        try:
            # Column ids given by schema changes staged but not applied yet, read here (not by a check),
            # and the names recorded on the connection that records them.
            newest = NewestSchemas(known, staged_in_state(self.config.source.state_dsn, self.config.name),
                                   names.recorded() if names is not None else {})
            meta = self._meta()
            with self.connect() as conn:
                begin = self._start(conn, meta) if meta is not None else StreamStart(start, epoch_of(start))
            if begin.position != start:  # state moved since (another process): its start, not ours
                begin = StreamStart(start, epoch_of(start))
            inner = BinlogStream(self.dsn, self.server_id, start, tracked, known=newest, tag=self.replica_tag,
                                 epoch=begin.epoch, gtid_start=begin.gtid, staged=True)
            if begin.gtid is not None:
                log.info("reading %s from GTID position %s (the pipeline read another server before)",
                         redacted_dsn(self.dsn), begin.gtid)
            elif meta is not None and not meta.get("captured_token") and inner.token is not None:
                self._record_token(start, inner.token)  # a pipeline idle since set-up: failover needs it too
        except BaseException:
            if names is not None:
                names.close()  # capture opens the stream again: no connection (and lock) left per attempt
            raise
        stream = self._stream = PositionStream(inner, start, newest, names)
        return stream

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
        return to_int(row[0], int(row[1]), self._epoch_of(conn))

    def format_position(self, pos: int) -> str:
        return format_position(pos)

    # -- the initial copy ---------------------------------------------------------------------------
    @contextmanager
    def copy_snapshot(self, name: str) -> Iterator[CopySnapshot]:  # type: ignore[override]
        with self.connect() as conn:
            position = self.current_position(conn)  # before any chunk's snapshot: at or before all of them
        yield CopySnapshot(position, None)

    def schema_at(self, conn: Conn, oid: int, snapshot: CopySnapshot) -> TableSchema | None:
        """Table ``oid`` now (each chunk reads its own later snapshot). A table the binlog dropped and
        that exists again under its name is tracked again by the running stream here, under its lock:
        from now on its rows are staged, and the chunks' snapshots are taken later (no row between)."""
        stream = self._stream
        with stream.lock if stream is not None else contextlib.nullcontext():
            names = self.current_names(conn, [oid])
            if not names and stream is not None and oid in stream.inner.identities.dropped_names:
                names = [TableName(*stream.inner.identities.dropped_names[oid])]  # created again, maybe
            try:
                schema = (replace(catalog.read_table_schema(conn, names[0].schema, names[0].name), oid=oid)
                          if names else None)
            except SourceError:
                schema = None  # dropped, and not there (yet)
            if schema is not None and stream is not None:
                stream.inner.identities.copied(oid, schema, snapshot.position)
                stream.record_name(oid, schema.table_name, snapshot.position)
        return schema

    def recreated(self) -> dict[int, str]:
        """Tracked tables the running stream saw dropped and then created again under the same name
        (id -> that name), for the catalog watch to copy again (``schema_changes.recreated_table``)."""
        stream = self._stream
        if stream is None:
            return {}
        identities = stream.inner.identities
        return {oid: str(TableName(*name)) for oid, name in list(identities.dropped_names.items())
                if name in identities.created and oid in identities.dropped}

    def plan_chunks(self, conn: Conn, table: TableSchema) -> list[tuple[int, int]]:
        if not table.key:
            return [chunked.WHOLE_TABLE]  # keyless: one snapshot, one position for every row
        return chunked.plan_chunks(conn, table, self.config.snapshot.chunk_pages * ROWS_PER_PAGE)

    def chunk_reader(self, table: TableSchema, snapshot: CopySnapshot, binary: bool) -> ChunkRead:
        return ChunkRead(partial(chunked.copy_chunk, self.dsn, table, epoch=epoch_of(snapshot.position)),
                         [Route.TEXT] * len(table.columns),
                         per_row_position=True)

    def copy_lock_waiters(self, conn: Conn) -> list[LockWaiter]:
        return copy_locks.lock_waiters(conn)

    def end_copy_reads(self, conn: Conn, blockers: tuple[int, ...] = (), table_oid: int | None = None) -> int:
        return copy_locks.end_copy_reads(conn, blockers, table_oid)

    def text_columns_watch(self, conn: Conn, tracked: list[int]) -> set[int]:
        return set()  # columns_as_text is PostgreSQL's

    def catalog_watch(self) -> CatalogWatch | None:
        from headrace.source.mysql.watch import MySqlCatalogWatch

        return MySqlCatalogWatch(self)


def _all_databases(conn: Conn) -> list[str]:
    with conn.cursor() as cur:
        cur.execute("SELECT schema_name FROM information_schema.schemata")
        return [r[0] for r in cur.fetchall() if r[0] not in SYSTEM_DATABASES]


def _identity(conn: Conn) -> str:
    return server_identity(conn)
