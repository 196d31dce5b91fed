"""Publication, slot, exported snapshot and the change stream itself.

Set-up (publication, slot, heartbeat) uses an ordinary psycopg 3 connection. The stream and the
exported snapshot need the replication protocol, which only psycopg2 speaks
(``LogicalReplicationConnection``).
"""

from __future__ import annotations

import os
import re
import secrets
import select
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import psycopg
import psycopg2
import psycopg2.extras
from psycopg import sql

from headrace.core.changes import Event
from headrace.core.errors import HeadraceError, SourceError, TransientError
from headrace.core.names import TableName
from headrace.core.position import format_lsn, parse_lsn
from headrace.source.postgres.catalog import find_relation, missing_table
from headrace.source.postgres.pgoutput import UNDECODED, UNDECODED_KINDS, decode
from headrace.source.postgres.standby import in_recovery

Conn = psycopg.Connection[Any]

# pgoutput renders values with the walsender's settings: pin the ones that change the text so the
# materializer's casts see one format (timestamptz in UTC, ISO dates, postgres intervals, shortest
# exact floats, hex bytea, UTF-8).
SESSION_OPTIONS = (
    "-c TimeZone=UTC -c DateStyle=ISO,MDY -c IntervalStyle=postgres -c extra_float_digits=1"
    " -c bytea_output=hex -c client_encoding=UTF8"
)
# The first PostgreSQL whose pgoutput can send (stored) generated columns.
GENERATED_COLUMNS_VERSION = 180000
# The first PostgreSQL whose logical slots can be synchronized to standbys (failover slots).
FAILOVER_SLOTS_VERSION = 170000
# The first PostgreSQL whose pgoutput streams large transactions while in progress (protocol 2).
STREAMING_VERSION = 140000
_SLOT_NAME = re.compile(r"^[a-z0-9_]{1,63}$")
_STREAM_START, _STREAM_STOP = ord("S"), ord("E")
_BLOCK_EDGES = frozenset((_STREAM_START, _STREAM_STOP))


def _resolve_tables(conn: Conn, tables: Sequence[str | TableName]) -> dict[int, sql.Composable]:
    """oid → quoted ``schema.table`` for each name; SourceError for a missing table."""
    resolved: dict[int, sql.Composable] = {}
    for table in tables:
        row = find_relation(conn, table)
        if row is None:
            raise SourceError(missing_table(conn, table, "create it or remove it from the table list"))
        resolved[row[0]] = sql.Identifier(row[1], row[2])
    return resolved


def ensure_publication(conn: Conn, name: str, tables: Sequence[str | TableName]) -> None:
    """Make publication ``name`` publish exactly ``tables`` (create it, or SET TABLE if it differs).

    Idempotent. A publication FOR ALL TABLES is left alone: it already covers every table.

    Always an explicit table list, even when the config names whole schemas: FOR TABLES IN SCHEMA and
    FOR ALL TABLES need a superuser, and would publish tables headrace refuses (a table without a key
    and REPLICA IDENTITY DEFAULT in a publication makes the application's own UPDATE and DELETE on it
    fail). Discovered tables are added here one by one. ``publish_via_partition_root`` makes a
    partitioned table's changes, from every partition present or future, arrive under its own oid.
    On PostgreSQL 18+, ``publish_generated_columns = stored`` streams stored generated columns, which
    the copy then includes too (``catalog._COLUMNS``); before 18 both leave them out.
    """
    generated = conn.info.server_version >= GENERATED_COLUMNS_VERSION
    with conn.transaction():
        wanted = _resolve_tables(conn, tables)
        row = conn.execute("SELECT oid, puballtables, pubviaroot FROM pg_publication WHERE pubname = %s",
                           (name,)).fetchone()
        table_list = sql.SQL(", ").join(wanted.values())
        via_root = sql.SQL("WITH (publish_via_partition_root = true{})").format(
            sql.SQL(", publish_generated_columns = stored" if generated else ""))
        if row is None:
            if wanted:
                conn.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {} {}").format(
                    sql.Identifier(name), table_list, via_root))
            else:
                conn.execute(sql.SQL("CREATE PUBLICATION {} {}").format(sql.Identifier(name), via_root))
            return
        pub_oid, all_tables, pubviaroot = row
        if not pubviaroot:
            conn.execute(sql.SQL("ALTER PUBLICATION {} SET (publish_via_partition_root = true)").format(
                sql.Identifier(name)))
        # A publication made by hand may lack it. Changed only when it differs: a publication that is
        # already right is not written to (a hot standby sees it, and cannot write).
        if generated and _generated_columns(conn, pub_oid) != "s":
            conn.execute(sql.SQL("ALTER PUBLICATION {} SET (publish_generated_columns = stored)").format(
                sql.Identifier(name)))
        if all_tables:
            return
        current = {
            oid for (oid,) in conn.execute("SELECT prrelid FROM pg_publication_rel WHERE prpubid = %s", (pub_oid,))
        }
        if current == set(wanted):
            return
        if wanted:
            conn.execute(sql.SQL("ALTER PUBLICATION {} SET TABLE {}").format(sql.Identifier(name), table_list))
        else:
            # SET TABLE needs at least one table; emptying means dropping the current ones.
            gone = sql.SQL(", ").join(sql.SQL("{}::regclass").format(oid) for oid in current)
            drop = sql.SQL("ALTER PUBLICATION {} DROP TABLE {}").format(sql.Identifier(name), gone)
            conn.execute(drop)


def _generated_columns(conn: Conn, pub_oid: int) -> str:
    row = conn.execute("SELECT pubgencols::text FROM pg_publication WHERE oid = %s", (pub_oid,)).fetchone()
    return str(row[0]) if row else ""


def ensure_slot(conn: Conn, slot: str, failover: bool = False) -> int:
    """Create logical slot ``slot`` (pgoutput) if missing; return its confirmed_flush_lsn.

    ``failover`` (PostgreSQL 17+, on a primary): create it as a failover slot, which standbys with
    ``sync_replication_slots = on`` keep a copy of, so a promoted standby has it.
    """
    failover = failover and conn.info.server_version >= FAILOVER_SLOTS_VERSION and not in_recovery(conn)
    create = ("SELECT lsn::text FROM pg_create_logical_replication_slot(%s, 'pgoutput', false, false, true)"
              if failover else "SELECT lsn::text FROM pg_create_logical_replication_slot(%s, 'pgoutput')")
    query = (
        "SELECT plugin, database = current_database(), confirmed_flush_lsn::text"
        " FROM pg_replication_slots WHERE slot_name = %s"
    )
    with conn.transaction():
        row = conn.execute(query, (slot,)).fetchone()
        if row is None:
            try:
                with conn.transaction():
                    created = conn.execute(create, (slot,)).fetchone()
                    assert created is not None
                    return parse_lsn(created[0])
            except psycopg.errors.DuplicateObject:
                row = conn.execute(query, (slot,)).fetchone()  # created concurrently
    if row is None or row[2] is None:
        raise SourceError(f"replication slot {slot} exists but is not a logical slot: drop it or choose another name")
    plugin, same_database, confirmed = row
    if plugin != "pgoutput" or not same_database:
        raise SourceError(
            f"replication slot {slot} belongs to another database or uses plugin {plugin}:"
            " drop it (pg_drop_replication_slot) or choose another slot name"
        )
    return parse_lsn(confirmed)


def emit_heartbeat(conn: Conn, prefix: str = "headrace") -> int:
    """Write a transactional logical message in its own committed transaction; return its LSN.

    Capture sees it come back as a ``Message`` and can acknowledge past it, so the slot advances
    even when the replicated tables are idle while the rest of the server writes WAL.
    """
    if not conn.autocommit and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise ValueError("emit_heartbeat needs its own transaction: call it on an idle connection")
    payload = str(time.time_ns() // 1000)
    with conn.transaction():
        row = conn.execute("SELECT pg_logical_emit_message(true, %s, %s)::text", (prefix, payload)).fetchone()
    assert row is not None
    return parse_lsn(row[0])


def _translate(exc: psycopg2.Error, what: str) -> HeadraceError:
    """A psycopg2 error as headrace's vocabulary: connection trouble is transient, the rest is not."""
    # A connection the server dropped mid-COPY (e.g. after wal_sender_timeout) surfaces as a bare
    # DatabaseError without SQLSTATE ("error with status PGRES_COPY_BOTH and no message").
    lost = exc.pgcode is None and not isinstance(exc, psycopg2.ProgrammingError)
    if lost or isinstance(exc, psycopg2.OperationalError | psycopg2.InterfaceError):
        return TransientError(f"{what}: {str(exc).strip()} (the connection will be retried)")
    return SourceError(f"{what}: {str(exc).strip()}")


def _replication_connection(dsn: str, what: str) -> Any:
    try:
        return psycopg2.connect(
            dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection, options=SESSION_OPTIONS
        )
    except psycopg2.Error as exc:
        raise _translate(exc, what) from exc


class ExportedSnapshot:
    """A temporary slot whose snapshot other sessions can import with ``SET TRANSACTION SNAPSHOT``.

    ``lsn`` is the slot's consistent point: the snapshot shows every transaction committed before
    it, and the stream from ``lsn`` on carries every one after. The replication connection stays
    open and idle until exit, which is what keeps the snapshot importable; exit drops the slot.
    """

    def __init__(self, dsn: str, slot_name: str | None = None) -> None:
        self.slot_name = slot_name or f"headrace_snap_{os.getpid()}_{secrets.token_hex(4)}"
        if not _SLOT_NAME.match(self.slot_name):
            raise ValueError(f"slot name {self.slot_name!r}: use lower-case letters, digits and _ only")
        self._dsn = dsn
        self._conn: Any = None
        self.lsn = 0
        self.snapshot_name = ""

    def __enter__(self) -> ExportedSnapshot:
        what = f"exporting a snapshot through temporary slot {self.slot_name}"
        self._conn = _replication_connection(self._dsn, what)
        try:
            with self._conn.cursor() as cur:
                cur.execute(f"CREATE_REPLICATION_SLOT {self.slot_name} TEMPORARY LOGICAL pgoutput EXPORT_SNAPSHOT")
                _slot, consistent_point, snapshot_name, _plugin = cur.fetchone()
        except psycopg2.Error as exc:
            self._conn.close()
            raise _translate(exc, what) from exc
        self.lsn = parse_lsn(consistent_point)
        self.snapshot_name = snapshot_name
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class ReplicationStream:
    """The pgoutput change stream of one slot, read in batches.

    Call ``read`` (or ``acknowledge``) at least every ``wal_sender_timeout / 2``: keepalives and
    status updates are only sent from inside those calls. ``raw_changes``: INSERT, UPDATE and DELETE
    come as their message's ``bytes`` (for capture to stage with ``pgoutput.UNDECODED``) when that
    is built; every other message, and every message without it, is decoded.

    ``forwardable``: the most the slot may have been confirmed to without ``acknowledge`` saying so.
    psycopg2 forwards its flush position to a keepalive's ``wal_end`` when every message read has
    been acknowledged, and sends it with the next status message: the one ``acknowledge`` sends, or
    its own answer to a keepalive asking for one (the server asks when shutting down, and after
    ``wal_sender_timeout / 2`` without news). Capture records this bound before it can be sent, so
    start-up can tell such advances from someone else's.

    ``streaming`` (PostgreSQL 14+; ignored before): protocol 2 with ``streaming 'on'``, so a
    transaction larger than the server's ``logical_decoding_work_mem`` arrives in blocks while it
    runs (``StreamStart`` ... ``StreamStop``, then ``StreamCommit`` or ``StreamAbort``); inside a
    block, changes come as ``Streamed`` events, or as their bytes (xid first) with ``raw_changes``.
    ``protocol`` says which version was asked for.
    """

    def __init__(self, dsn: str, slot: str, publication: str, start_lsn: int, status_interval: float = 10.0,
                 raw_changes: bool = False, streaming: bool = False) -> None:
        self.slot = slot
        self._in_block = False  # between a Stream Start and its Stop
        self.forwardable = 0
        self._acknowledged = 0  # the most ``acknowledge`` was given (psycopg2's explicitly_flushed_lsn)
        self._last_data = 0  # data_start of the last message read (psycopg2's last_msg_data_start)
        self._raw_kinds = UNDECODED_KINDS if raw_changes and UNDECODED is not None else frozenset()
        self._status_interval = status_interval
        self._what = f"replication stream of slot {slot}"
        self._conn = _replication_connection(dsn, self._what)
        self.protocol = 2 if streaming and self._conn.server_version >= STREAMING_VERSION else 1
        options = {"proto_version": str(self.protocol), "publication_names": publication, "messages": "true"}
        if self.protocol >= 2:
            options["streaming"] = "on"
        try:
            self._cur = self._conn.cursor()
            self._cur.start_replication(slot_name=slot, decode=False, start_lsn=start_lsn, options=options,
                                        status_interval=status_interval)
        except psycopg2.Error as exc:
            self._conn.close()
            raise _translate(exc, f"starting the {self._what} at {format_lsn(start_lsn)}") from exc
        self._fd = self._conn.fileno()

    def read(self, max_messages: int, timeout: float) -> list[tuple[int, Event | bytes]]:
        """Up to ``max_messages`` events with their message's data_start LSN, waiting up to ``timeout`` s.

        Returns when ``max_messages`` are read, when messages were read and no more are buffered
        (a quiet stream's change reaches capture at once, not at the end of ``timeout``), or when
        ``timeout`` has passed with none (an empty list); the process only sleeps in ``select``
        while it has read nothing.
        """
        events: list[tuple[int, Event | bytes]] = []
        append = events.append
        read_message = self._cur.read_message
        raw_kinds = self._raw_kinds
        deadline = time.monotonic() + timeout
        # psycopg2 forwards on a keepalive only while the last message read starts at or before what
        # was acknowledged (a RELATION message starts at 0): at the start of this read, or after any
        # message of it.
        acknowledged = self._acknowledged
        forwards = acknowledged >= self._last_data
        try:
            while len(events) < max_messages:
                msg = read_message()  # also answers keepalives and sends periodic status updates
                if msg is not None:
                    self._last_data = msg.data_start
                    if msg.data_start <= acknowledged:
                        forwards = True
                    payload = msg.payload
                    if len(payload) > 9 and payload[0] in raw_kinds and type(payload) is bytes:
                        append((msg.data_start, payload))  # in a streamed block: its xid first
                        continue
                    kind = payload[0] if payload else 0
                    if kind in _BLOCK_EDGES:
                        self._in_block = kind == _STREAM_START
                    event = decode(payload, self._in_block and kind != _STREAM_START)
                    if event is not None:
                        append((msg.data_start, event))
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0 or events:
                    break
                # Wake for the next status update even if the server stays silent.
                select.select([self._fd], [], [], min(remaining, self._status_interval))
        except psycopg2.Error as exc:
            raise _translate(exc, self._what) from exc
        finally:
            if forwards:  # at most the last wal_end seen, a message's or a keepalive's
                self.forwardable = max(self.forwardable, self._cur.wal_end)
        return events

    def new_table_errors(self) -> dict[int, str]:
        """None: PostgreSQL's catalog watch learns of dropped tables (``ChangeStream``)."""
        return {}

    def tables_created(self) -> bool:
        """False: pgoutput says nothing of CREATE TABLE (the catalog watch polls)."""
        return False

    def acknowledge(self, flush_lsn: int) -> None:
        """Tell the server everything up to ``flush_lsn`` is durable (write = flush = apply); what it
        is told may be ``forwardable``."""
        self._acknowledged = max(self._acknowledged, flush_lsn)
        try:
            self._cur.send_feedback(write_lsn=flush_lsn, flush_lsn=flush_lsn, apply_lsn=flush_lsn, force=True)
        except psycopg2.Error as exc:
            raise _translate(exc, f"acknowledging {format_lsn(flush_lsn)} on the {self._what}") from exc

    def close(self) -> None:
        """Close the replication connection (the slot stays, at its last acknowledged position)."""
        if not self._conn.closed:
            self._conn.close()

    def __enter__(self) -> ReplicationStream:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
