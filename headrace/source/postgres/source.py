"""PostgreSQL behind the ``Source`` interface: a thin wrapper over this package's functions.

Logical replication (pgoutput) through a publication and a slot; copies under a snapshot exported
by a temporary slot; the catalog watch and the slot's WAL guard as the optional capabilities.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from headrace.core.changes import Relation
from headrace.core.errors import SourceError
from headrace.core.names import TableName
from headrace.core.position import format_lsn
from headrace.core.schema import TableSchema
from headrace.core.undecoded import UndecodedCodec
from headrace.source.base import (
    CatalogPoll,
    CatalogWatch,
    ChangeStream,
    ChunkRead,
    ChunkSession,
    CopySnapshot,
    LockWaiter,
    LogWatch,
    RetainedLog,
    Route,
    Source,
)
from headrace.source.postgres import binary_copy, catalog, copy_locks, pgoutput, standby, tables
from headrace.source.postgres import copy as text_copy
from headrace.source.postgres import wal_guard as wal
from headrace.source.postgres.assess import assess
from headrace.source.postgres.replication import (
    ExportedSnapshot,
    ReplicationStream,
    emit_heartbeat,
    ensure_publication,
    ensure_slot,
)
from headrace.source.postgres.types import TypeCatalog

if TYPE_CHECKING:
    from headrace.state.store import StateStore

Conn = psycopg.Connection[Any]

HEARTBEAT_PREFIX = "headrace"
# Effectively never: only capture's flush and server pings send status (see capture.loop).
STATUS_INTERVAL_S = 24 * 3600.0


class PostgresSource(Source):
    """A PostgreSQL source (logical replication, pgoutput v1)."""

    kind = "postgresql"
    label = "PostgreSQL"

    def types(self, conn: Conn) -> TypeCatalog:
        """The type mapping of this pipeline (its ``source.columns_as_text``) on ``conn``."""
        return TypeCatalog(conn, self.config.source.text_columns)

    # -- connections and checks --------------------------------------------------------------------
    def connect(self) -> AbstractContextManager[Any]:
        return psycopg.connect(self.dsn, autocommit=True)

    def user(self) -> str | None:
        return conninfo_to_dict(self.dsn).get("user")  # type: ignore[return-value]

    def problems(self) -> list[str]:
        from headrace.config import redacted_dsn

        try:
            with psycopg.connect(self.dsn, connect_timeout=10) as conn:
                source = self.config.source
                return (catalog.check_source(conn, list(source.tables), self.config.publication_name)
                        + catalog.columns_as_text_problems(conn, sorted(source.text_columns))
                        + self.standby_problems(conn, list(source.tables)))
        except psycopg.OperationalError as exc:
            return [f"cannot connect to the source {redacted_dsn(self.dsn)}: {str(exc).strip()}"]

    def standby_problems(self, conn: Conn, names: list[str]) -> list[str]:
        """What the settings lack when the source is a hot standby (``standby.config_problems``)."""
        if not standby.in_recovery(conn) or conn.info.server_version < standby.STANDBY_DECODING_VERSION:
            return []  # a standby before 16 is refused by the server check
        source = self.config.source
        return standby.config_problems(conn, source.state_dsn, source.primary_dsn, self.config.publication_name, names)

    def identity(self, conn: Conn) -> str:
        row = conn.execute("SELECT system_identifier::text FROM pg_control_system()").fetchone()
        return str(row[0]) if row else ""

    def check_same_source(self, conn: Conn, state: StateStore) -> None:
        from headrace.outage_signs import check_same_source

        check_same_source(conn, state, self.config.slot_name)

    def probe(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=5) as conn:
            conn.execute("SELECT 1")

    # -- catalog ------------------------------------------------------------------------------------
    def list_tables(self, conn: Conn, schemas: list[str] | None) -> dict[int, str]:
        return tables.list_tables(conn, schemas)

    def table_problems(self, conn: Conn, name: str) -> list[str]:
        return catalog.table_problems(conn, name, self.config.publication_name)

    def read_table_schema(self, conn: Conn, table: str | TableName | int) -> TableSchema:
        return catalog.read_table_schema(conn, table, self.types(conn))

    def assess(self, conn: Conn, names: list[str | TableName]) -> dict[str, Any]:
        return assess(conn, names, self.config.publication_name)

    def current_names(self, conn: Conn, oids: list[int]) -> list[TableName]:
        return tables.current_names(conn, oids)

    # -- capture --------------------------------------------------------------------------------------
    def prepare_capture(self, conn: Conn, names: list[TableName]) -> int:
        self.capture_tables(conn, names)
        slot = self.config.slot_name
        try:
            return standby.nudged(self._primary(conn), lambda: ensure_slot(conn, slot, self.config.source.failover_slot))
        except psycopg.errors.ObjectNotInPrerequisiteState as exc:  # e.g. a standby of a primary without logical WAL
            fix = (": set wal_level = logical in the primary's postgresql.conf and restart it"
                   if "on the primary" in str(exc) else "")
            raise SourceError(f"cannot create replication slot {slot}: {str(exc).strip()}{fix}") from exc

    def capture_tables(self, conn: Conn, names: list[TableName]) -> None:
        publication = self.config.publication_name
        if not standby.in_recovery(conn):
            ensure_publication(conn, publication, names)
            return
        # A standby cannot write its catalog: the publication is changed on the primary, or must be right.
        primary = self._primary(conn)
        if primary:
            standby.on_primary(primary, conn, lambda p: ensure_publication(p, publication, names))
        elif gaps := standby.publication_gaps(conn, publication, names):
            raise SourceError(f"{gaps} on the standby, which cannot change it: create it on the primary"
                              f" ({standby.publication_sql(conn, publication, names)}), or set source.primary_dsn")

    def _primary(self, conn: Conn) -> str | None:
        """``source.primary_dsn`` when the source is a standby, else None."""
        return self.config.source.primary_dsn if standby.in_recovery(conn) else None

    def check_capture(self, conn: Conn, state: StateStore) -> None:
        from headrace.state.invariants import check_slot

        check_slot(conn, state, self.config.slot_name)

    def open_stream(self, start: int, known: Callable[[], dict[int, TableSchema]]) -> ChangeStream:
        # No periodic status updates from psycopg2: it forwards the confirmed position to the
        # keepalives' wal_end on its own, and each confirmation must be bounded in state first
        # (acked_lsn) so start-up can tell our advances from someone else's. Capture's flush confirms.
        return ReplicationStream(self.dsn, self.config.slot_name, self.config.publication_name, start,
                                 status_interval=STATUS_INTERVAL_S, raw_changes=self.undecoded() is not None,
                                 streaming=self.config.source.stream_transactions)

    def undecoded(self) -> UndecodedCodec | None:
        return pgoutput.UNDECODED

    def relation_schema(self, conn: Conn, stream: ChangeStream, ev: Relation, known: TableSchema) -> TableSchema:
        return catalog.relation_to_schema(ev, self.types(conn), known, conn=conn)

    def heartbeat(self, conn: Conn) -> None:
        if not standby.in_recovery(conn):
            emit_heartbeat(conn, HEARTBEAT_PREFIX)
        elif primary := self.config.source.primary_dsn:  # the message reaches the standby's stream by replay
            with psycopg.connect(primary, autocommit=True, connect_timeout=10) as primary_conn:
                emit_heartbeat(primary_conn, HEARTBEAT_PREFIX)

    def flushed_position(self, conn: Conn) -> int:
        row = conn.execute("SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()"
                           " ELSE pg_current_wal_flush_lsn() END) - '0/0'::pg_lsn").fetchone()
        assert row is not None
        return int(row[0])

    def confirmed_position(self, conn: Conn) -> int | None:
        row = conn.execute("SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
                           (self.config.slot_name,)).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def current_position(self, conn: Conn) -> int:
        # The insert position, not pg_current_wal_lsn() (the write position): under asynchronous
        # commit the latter can lag a commit that already returned. On a standby: the replayed one.
        row = conn.execute(f"SELECT {standby.POSITION_SQL} - '0/0'::pg_lsn").fetchone()
        assert row is not None
        return int(row[0])

    def format_position(self, pos: int) -> str:
        return format_lsn(pos)

    # -- the initial copy ---------------------------------------------------------------------------
    @contextmanager
    def copy_snapshot(self, name: str) -> Iterator[CopySnapshot]:  # type: ignore[override]
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            primary = self._primary(conn)
        exported = ExportedSnapshot(self.dsn, name[:63])
        snap = standby.nudged(primary, exported.__enter__)  # a standby waits for the primary's record
        try:
            yield CopySnapshot(snap.lsn, snap.snapshot_name)
        finally:
            exported.__exit__(None, None, None)

    def schema_at(self, conn: Conn, oid: int, snapshot: CopySnapshot) -> TableSchema | None:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        try:
            if snapshot.token is not None:
                conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot.token)))
            if conn.execute("SELECT 1 FROM pg_class WHERE oid = %s", (oid,)).fetchone() is None:
                return None
            return catalog.read_table_schema(conn, oid, self.types(conn))
        finally:
            conn.execute("ROLLBACK")

    def plan_chunks(self, conn: Conn, table: TableSchema) -> list[tuple[int, int]]:
        return text_copy.plan_chunks(conn, table, self.config.snapshot.chunk_pages)

    def chunk_reader(self, table: TableSchema, snapshot: CopySnapshot, binary: bool) -> ChunkRead:
        return chunk_reader(self.dsn, snapshot.token, table, binary)

    def chunk_session(self, snapshot: CopySnapshot, binary: bool) -> Callable[[], ChunkSession] | None:
        if not binary:
            return None  # the CSV path reads as it always did, a connection per chunk
        return partial(binary_copy.SnapshotSession, self.dsn, snapshot.token, "a copy round")

    def copy_lock_waiters(self, conn: Conn) -> list[LockWaiter]:
        return copy_locks.lock_waiters(conn, self.dsn)

    def end_copy_reads(self, conn: Conn, blockers: tuple[int, ...] = (), table_oid: int | None = None) -> int:
        return copy_locks.end_copy_reads(conn, self.dsn, blockers, table_oid)

    # -- optional capabilities -------------------------------------------------------------------
    def catalog_watch(self) -> CatalogWatch | None:
        return PostgresCatalogWatch(self.dsn)

    def log_watch(self) -> LogWatch | None:
        return SlotWalWatch(self.dsn, self.config.name, self.config.slot_name, self.config.source.max_retained_wal)

    def text_columns_watch(self, conn: Conn, tracked: list[int]) -> set[int]:
        return tables.existing_oids(conn, tracked)


class PostgresCatalogWatch(CatalogWatch):
    """pgoutput sends nothing on CREATE or DROP TABLE: poll ``pg_class`` (see ``run.table_watch``)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def poll(self, tracked: dict[int, TableName], schemas: list[str] | None, discovers: bool) -> CatalogPoll:
        with psycopg.connect(self.dsn, autocommit=True) as conn, conn.transaction():
            # One snapshot for every read: a DROP + CREATE committing between two of them would
            # otherwise look like a new table beside a live one, then like a drop of the old.
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            alive = tables.existing_oids(conn, list(tracked))
            listed = tables.list_tables(conn, schemas) if discovers else {}
            successors = {oid: tables.oid_of(conn, name.schema, name.name)
                          for oid, name in tracked.items() if oid not in alive}
            leaves = tables.leaf_partitions(conn, [oid for oid in tracked if oid in alive])
            # Read after the snapshot was taken: a drop it shows committed before this position.
            row = conn.execute(f"SELECT {standby.POSITION_SQL} - '0/0'::pg_lsn").fetchone()
            assert row is not None
        return CatalogPoll(alive, listed, successors, leaves, int(row[0]))

    def existing(self, conn: Conn, oids: list[int]) -> set[int]:
        return tables.existing_oids(conn, oids)


class SlotWalWatch(LogWatch):
    """The slot's WAL against ``source.max_retained_wal`` (``source.postgres.wal_guard``)."""

    def __init__(self, dsn: str, pipeline: str, slot: str, limit_bytes: int) -> None:
        self.dsn, self.pipeline, self.slot, self.limit_bytes = dsn, pipeline, slot, limit_bytes

    def read(self) -> RetainedLog | None:
        try:
            with psycopg.connect(self.dsn, autocommit=True, connect_timeout=10) as conn:
                return wal.read_slot_wal(conn, self.slot, self.limit_bytes)
        except psycopg.Error:
            return None  # the source is away: capture and the state store report that

    def lost_message(self) -> str:
        return wal.lost_message(self.pipeline, self.slot)

    def warning(self, figures: RetainedLog) -> str | None:
        return wal.warning(figures)  # type: ignore[arg-type]


def chunk_reader(dsn: str, snapshot_name: str | None, table: TableSchema, binary: bool) -> ChunkRead:
    """Tasks COPY a page range under exported snapshot ``snapshot_name`` (None: each its own view):
    binary COPY into typed Arrow (``binary_copy``), or CSV text (``copy``)."""
    if binary:
        routes = [Route(r.value) for r in binary_copy.column_routes(table)]
        return ChunkRead(partial(binary_copy.copy_chunk_binary, dsn, snapshot_name, table), routes)
    return ChunkRead(partial(text_copy.copy_chunk, dsn, snapshot_name, table), [Route.TEXT] * len(table.columns))
