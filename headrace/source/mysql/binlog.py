"""Change capture from a MariaDB/MySQL binary log, as the events of ``core.changes``.

``BinlogStream`` reads the binlog with mysql-replication (as a replica would, with the caller's
``server_id``) and hands the capture loop what pgoutput would: per transaction one ``Begin``, a
``Relation`` when a table's shape is first seen or changes, the row changes as text, ``Commit``.
Row events of tables whose column types C spells are read whole in C from the replication packets
(``row_events.py``, ``rows_native.py``), and with ``staged`` handed over as bytes (``staged.py``).

Positions (``position.to_int``): a transaction's position (``Begin.final_lsn`` =
``Commit.commit_lsn``) is where it starts in the binlog (its GTID event); ``Commit.end_lsn`` is
where its last event ends, which is where the next one starts and where a restart resumes. A
consistent snapshot's binlog position (``copy.snapshot_position``) therefore sorts after every
transaction in the snapshot and at or before every later one.

Shapes come from each TABLE_MAP event (``binlog_row_metadata=FULL``), never from the catalog,
which may already be newer than the event. Transactions that touch no tracked table are skipped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from functools import partial
from typing import Any

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.constants import FIELD_TYPE
from pymysqlreplication.event import (
    GtidEvent,
    HeartbeatLogEvent,
    MariadbGtidEvent,
    QueryEvent,
    RotateEvent,
    XidEvent,
)
from pymysqlreplication.row_event import DeleteRowsEvent, TableMapEvent, UpdateRowsEvent, WriteRowsEvent

from headrace.core.changes import (
    Begin,
    Commit,
    Event,
    Relation,
    RelationColumn,
    Truncate,
)
from headrace.core.errors import SourceError, TransientError
from headrace.core.schema import TableSchema
from headrace.core.settings import redacted_dsn
from headrace.source.mysql import rows_native
from headrace.source.mysql import staged as staged_changes
from headrace.source.mysql.catalog import (
    column_defaults,
    fixed_binary_types,
    schema_from_table_map,
    with_fills,
)
from headrace.source.mysql.connect import connect, parse_dsn
from headrace.source.mysql.ddl import parse, truncated_table
from headrace.source.mysql.gtid import GtidTracker, mysql_gtid
from headrace.source.mysql.identity import Identities, Known
from headrace.source.mysql.position import format_position, from_int, to_int
from headrace.source.mysql.row_events import RowEvents
from headrace.source.mysql.rows_native import BinlogConnection, NativeEvent, NativeRows
from headrace.source.mysql.server import gtid_at, server_identity
from headrace.source.mysql.table_maps import CachedTableMapEvent

TableFilter = Callable[[str, str], bool]
Converter = Callable[[Any], str | None]
_FL_STANDALONE = 1  # MariaDB GTID event flag: a statement outside a transaction (DDL)
_LOG_GONE = 1236  # ER_MASTER_FATAL_ERROR_READING_BINLOG: the position was purged or does not exist
_UNREACHABLE = (2003, 2006, 2013)  # cannot connect, server gone, connection lost (errmsg.h)
_EVENTS = [RotateEvent, MariadbGtidEvent, GtidEvent, QueryEvent, XidEvent, CachedTableMapEvent, WriteRowsEvent,
           UpdateRowsEvent, DeleteRowsEvent, HeartbeatLogEvent]


class BinlogStream(RowEvents):
    """The binlog from position ``start`` (``position.to_int``), for the tables ``tables`` selects.

    ``tables`` is a set of ``(database, table)`` or a callable answering whether one is tracked
    (tables added while running). ``server_id`` must be unique among the server's replicas; ``tag``
    is the host name the client registers under (``SHOW SLAVE HOSTS``), telling its id apart.
    ``known`` is the schemas state has (``{oid: TableSchema}``, or a callable returning them, which
    must return the same objects until a table is tracked again): the stream continues from their
    names (a table renamed earlier) and column ids (``attnum``); see ``identity.Identities``.

    DDL the adapter acts on (``identity.Identities``): ``renamed`` (name -> id of a renamed table),
    ``dropped`` (id -> position of its DROP; its rows stop until it is tracked again),
    ``created`` (name -> position of a table created under a name a tracked table left).

    Each ``Commit`` carries the GTID state after it (``Commit.token``, ``gtid.Resume``); ``gtid_start``
    reads from a GTID state instead of ``start``, which is on another server (failover), in ``epoch``.

    ``native=False`` decodes every row in Python (mysql-replication); ``staged=True`` hands over the
    changes C reads as ``staged`` bytes (what capture stages in C) instead of events.
    """

    def __init__(self, dsn: str, server_id: int, start: int,
                 tables: Collection[tuple[str, str]] | TableFilter, heartbeat: float = 0.1,
                 known: Known | Mapping[int, TableSchema] | None = None, tag: str | None = None,
                 native: bool = True, epoch: int = 0, gtid_start: str | None = None, staged: bool = False) -> None:
        self._dsn = dsn
        if callable(tables):
            self._tracked: TableFilter = tables
        else:
            tracked = set(tables)
            self._tracked = lambda database, table: (database, table) in tracked
        self.identities = Identities(self._tracked, known)
        self.renamed, self.dropped, self.created = (self.identities.renamed, self.identities.dropped,
                                                    self.identities.created)
        self.tables_created = 0  # CREATE TABLE and RENAME TABLE statements read (PositionStream resets it)
        self._epoch = epoch
        with connect(dsn) as conn, conn.cursor() as cur:
            cur.execute("SELECT @@log_bin_basename")
            basename = cur.fetchone()[0]
            self.server_uuid = server_identity(conn)
            if basename is None:
                raise SourceError(f"{redacted_dsn(dsn)}: the binary log is off; set log_bin in my.cnf and restart"
                                  " the server")
            self._basename = str(basename).rsplit("/", 1)[-1]
            file, offset = from_int(start, self._basename)
            mariadb = self.server_uuid.startswith("mariadb:")
            gtid_text = gtid_start if gtid_start is not None else gtid_at(cur, mariadb, file, offset)
        self._gtid = GtidTracker(gtid_text, self.server_uuid, epoch)
        # From a GTID state the server names the file and offset with its first events (a Rotate, then
        # the first transaction after the state): until then the position stays the given one.
        self._file = file if gtid_start is None else ""
        self._base: tuple[str | None, int] = (None, 0)  # (file, its position 0) for _at
        self._seeking = gtid_start is not None
        # A heartbeat makes read() return on an idle server. By file and offset is_mariadb stays False
        # (with it mysql-replication 1.0.17 dumps from the first binlog; MariaDB still sends GTID events).
        # From a GTID state: @slave_connect_state (strict mode), MySQL's COM_BINLOG_DUMP_GTID.
        by_gtid = {"auto_position": gtid_start, "is_mariadb": mariadb} if gtid_start is not None else {
            "log_file": file, "log_pos": offset, "is_mariadb": False}
        self.native = native  # row events decoded in C where the table's types allow (rows_native)
        # binlog table id -> its C plan (rows_native.plan), for the tables whose row events C reads whole;
        # with ``staged`` their changes are handed over as ``staged`` bytes (capture stages them in C).
        self._plans: dict[int, rows_native.Plan] = {}
        self.staged = staged and native and staged_changes.CODEC is not None
        self._reader = BinLogStreamReader(
            connection_settings=parse_dsn(dsn).settings(), server_id=server_id, resume_stream=True,
            blocking=True, slave_heartbeat=heartbeat, only_events=_EVENTS, enable_logging=False,
            report_slave=tag, pymysql_wrapper=partial(BinlogConnection, plans=self._plans if native else None,
                                                                 staged=self.staged),
            **by_gtid)
        self._from_gtid = gtid_start
        self.position = start  # where a restart would resume if nothing is in flight
        self._schemas: dict[int, TableSchema] = {}  # headrace oid -> shape of its last TABLE_MAP
        self._shapes: dict[Any, TableSchema] = {}  # a TABLE_MAP body (and its UUID/INET columns) -> its shape
        self._keys: dict[int, tuple[TableSchema, list[int], Callable[[Any], Any]]] = {}  # oid -> key places
        self._sent: dict[int, TableSchema] = {}  # oid -> shape last sent as a Relation
        self._maps: dict[int, int] = {}  # binlog table id -> headrace oid
        self._txn: tuple[int, int, int] | None = None  # (start position, commit ts us, xid) of the open one
        self._begun = False  # Begin sent for the open transaction (only once it touches a tracked table)
        self._standalone = False  # the open transaction is one statement (DDL) without XID
        self._catalog: Any = None  # a connection for column defaults and MariaDB types, opened when needed
        # Tracked tables renamed, (id, new name, position of the statement), for the adapter to keep in
        # state: a table without rows since the stream started has no Relation to send (``names.py``).
        self.renames: list[tuple[int, tuple[str, str], int]] = []
        self._fixed: dict[tuple[int, str, str], dict[str, str]] = {}  # (binlog table id, name) -> UUID/INET columns (_declared)
        # oid -> (shape, *types.binlog_converters(its columns)), rebuilt when the shape object changes.
        self._converters: dict[int, tuple[TableSchema, list[str], list[Converter | None], list[Converter]]] = {}
        self._native: dict[int, tuple[TableSchema, list[rows_native.Spec] | None]] = {}  # binlog table id ->

    def schema(self, oid: int) -> TableSchema:
        """The shape of table ``oid`` as its latest TABLE_MAP described it (for the last Relation)."""
        return self._schemas[oid]

    def read(self, max_messages: int, timeout: float) -> list[tuple[int, Event]]:
        """Up to ``max_messages`` events with their transaction's position, within about ``timeout`` s.

        Raises SourceError when the start position was purged from the server (the fix: a resync).
        """
        out: list[tuple[int, Event]] = []
        deadline = time.monotonic() + timeout
        while len(out) < max_messages and time.monotonic() < deadline:
            try:
                event = self._reader.fetchone()
            except NativeRows as native:
                self._native_rows(*native.decoded, out)
                continue
            except NativeEvent as native:
                self._native_event(native, out)
                continue
            except pymysql.err.OperationalError as exc:
                if exc.args and exc.args[0] == _LOG_GONE and self._seeking:
                    raise SourceError(
                        f"{redacted_dsn(self._dsn)} cannot continue from GTID position {self._from_gtid}, where the"
                        f" pipeline left the server it read before ({exc.args[1]}): this server's binlog does not"
                        " hold it (purged, behind, or another replication topology). Point source.dsn at a"
                        " server that does, or copy every table again: `headrace reset -c <pipeline file> --yes`"
                    ) from exc
                if exc.args and exc.args[0] == _LOG_GONE:
                    raise SourceError(
                        f"{redacted_dsn(self._dsn)}: the binlog at {format_position(self.position, self._basename)}"
                        f" is no longer on the server ({exc.args[1]}); raise binlog_expire_logs_seconds"
                        " (or expire_logs_days) so the binlog outlives outages, and run `headrace resync`"
                        " for the tables to copy them again") from exc
                if exc.args and exc.args[0] in _UNREACHABLE:
                    raise TransientError(f"{redacted_dsn(self._dsn)}: the binlog connection failed ({exc.args[-1]});"
                                         " it is opened again from the last saved position") from exc
                raise
            if event is None or isinstance(event, HeartbeatLogEvent):
                if event is not None and self._txn is None and self._file:
                    self._seeking = False  # idle at the binlog's end: past the GTID state asked for
                    # Idle at the binlog's end: everything before the heartbeat's position is read
                    # (after a rotation the new file's header events are no transaction to end at).
                    self.position = max(self.position, to_int(self._file, int(event.packet.log_pos), self._epoch))
                break
            self._handle(event, out)
        return out

    @property
    def token(self) -> str | None:
        """Where the stream is (``position``) as a ``gtid.Resume`` token; None when the GTID state is
        not known (MySQL read by file and offset)."""
        return self._gtid.token

    def _at(self, log_pos: int, size: int) -> tuple[int, int]:
        """(start, end) positions of the event of ``size`` bytes ending at ``log_pos`` in the current file."""
        if self._base[0] != self._file:  # the file's position 0, once per file (not twice an event)
            self._base = (self._file, to_int(self._file, 0, self._epoch))
        end = self._base[1] + log_pos
        return end - size, end

    def _native_event(self, native: NativeEvent, out: list[tuple[int, Event]]) -> None:
        """An XID or MariaDB GTID event read from its packet (``rows_native.NativeEvent``)."""
        timestamp, kind, server_id, size, log_pos = native.head
        self._reader.log_pos = log_pos  # where mysql-replication resumes if it reconnects by itself
        start, end = self._at(log_pos, size)
        if native.gtid is None:
            self._commit(end, out)
        else:
            seq, domain, flags = native.gtid
            self._mariadb_gtid(start, timestamp, seq, domain, server_id, flags)

    def _mariadb_gtid(self, start: int, timestamp: int, seq: int, domain: int, server_id: int, flags: int) -> None:
        """A MariaDB transaction (or standalone statement) starts at ``start`` with GTID domain-server-seq."""
        self._seeking = False
        self._open(start, timestamp, seq, bool(flags & _FL_STANDALONE))
        self._gtid.begin(domain, server_id, seq)

    def _handle(self, event: Any, out: list[tuple[int, Event]]) -> None:
        if isinstance(event, RotateEvent):
            self._file = event.next_binlog
            if self._txn is None and not self._seeking:
                self.position = to_int(self._file, int(event.position), self._epoch)
            return
        start, end = self._at(int(event.packet.log_pos), int(event.packet.event_size))
        if isinstance(event, MariadbGtidEvent):
            self._mariadb_gtid(start, int(event.timestamp), int(event.gtid_seq_no), int(event.domain_id),
                               int(event.server_id), int(event.flags))
            return
        if isinstance(event, GtidEvent):
            # MySQL: a transaction's GTID is followed by a BEGIN query, a DDL statement's is not.
            self._seeking = False
            self._open(start, int(event.timestamp), int(event.gno), True)
            self._gtid.begin(*mysql_gtid(event))
            return
        if isinstance(event, TableMapEvent):
            oid = self.identities.oid_of(event.schema, event.table)
            if oid is not None:
                self._maps[event.table_id] = oid
                declared = self._declared(event)
                key = (event.raw_key, tuple(sorted(declared.items()))) if hasattr(event, "raw_key") else None
                shape = self._shapes.get(key) if key is not None else None
                if shape is None:
                    shape = schema_from_table_map(event, declared)
                    if key is not None:
                        if len(self._shapes) > 1024:
                            self._shapes.clear()
                        self._shapes[key] = shape
                self._schemas[oid] = self.identities.label(oid, shape)
                self._plan(event.table_id, event.columns, self._schemas[oid])
            else:
                self._maps.pop(event.table_id, None)
                self._plans.pop(event.table_id, None)
            return
        if isinstance(event, WriteRowsEvent | UpdateRowsEvent | DeleteRowsEvent):
            mapped = self._maps.get(event.table_id)
            if mapped is not None:
                self._rows(event, mapped, out)
            return
        if isinstance(event, QueryEvent):
            query = event.query.strip()
            if query.upper() == "BEGIN":
                if self._txn is None:  # MySQL without GTIDs (its anonymous GTID event is not decoded)
                    self._open(start, int(event.timestamp), 0, False)
                self._standalone = False
                return
            if query.upper() not in ("COMMIT", "ROLLBACK"):
                if self._txn is None:
                    self._open(start, int(event.timestamp), 0, True)
                self._statement(event, query, start, out)
                if not self._standalone:
                    return
        # XID (InnoDB commit), COMMIT/ROLLBACK query (other engines), or the end of a standalone statement.
        self._commit(end, out)

    def _declared(self, event: Any) -> dict[str, str]:
        """The catalog's UUID/INET4/INET6 columns of the table a TABLE_MAP describes, when it has columns
        that could be one (BINARY(4) or BINARY(16)): read once per binlog table id, which the server
        renews whenever the table's definition changes (an ALTER), so it is read again after one.
        The catalog is the table as it is now: a stream far behind a later ALTER between BINARY(16)
        and UUID of the same column would read the event with the newer type (docs/mysql.md)."""
        candidates = [c for c in event.columns if c.type == FIELD_TYPE.STRING and c.max_length in (4, 16)
                      and (c.collation_name or "binary") == "binary"]
        if not candidates:
            return {}
        key = (event.table_id, event.schema, event.table)  # ids restart with the server: the name too
        declared = self._fixed.get(key)
        if declared is None:
            if self._catalog is None:
                self._catalog = connect(self._dsn)
            declared = self._fixed[key] = fixed_binary_types(self._catalog, event.schema, event.table)
        return declared

    def _open(self, start: int, timestamp: int, xid: int, standalone: bool) -> None:
        """A transaction starts at ``start`` (its GTID event, or its first statement without one)."""
        self._txn = (start, timestamp * 1_000_000, xid)
        self._begun = False
        self._standalone = standalone

    def _begin(self, out: list[tuple[int, Event]]) -> int:
        assert self._txn is not None, "row event outside a transaction"
        start, ts, xid = self._txn
        if not self._begun:
            out.append((start, Begin(start, ts, xid)))
            self._begun = True
        return start

    def _relation(self, oid: int, start: int, out: list[tuple[int, Event]]) -> None:
        shape, sent = self._schemas[oid], self._sent.get(oid)
        if sent is shape:
            return
        if sent == shape:  # the shape sent last (a new TABLE_MAP object): keep one object, per-shape plans hold
            self._schemas[oid] = sent
        else:
            # What rows older than an added column hold: the TABLE_MAP has no defaults, so the
            # catalog's, read now (as the PostgreSQL source reads attmissingval).
            if self._catalog is None:
                self._catalog = connect(self._dsn)
            shape = self._schemas[oid] = with_fills(shape, column_defaults(self._catalog, shape.schema, shape.name))
            columns = tuple(RelationColumn(c.name, c.type_oid, c.typmod, c.name in shape.key) for c in shape.columns)
            out.append((start, Relation(oid, shape.schema, shape.name, shape.replica_identity, columns)))
            self._sent[oid] = shape

    def _statement(self, event: Any, query: str, at: int, out: list[tuple[int, Event]]) -> None:
        """TRUNCATE of a tracked table becomes ``Truncate`` (after a Relation, state's shape if no TABLE_MAP came
        yet: capture stages no change of a table without one); renames and drops change identities."""
        default_db = event.schema.decode() if isinstance(event.schema, bytes) else str(event.schema)
        target = truncated_table(query, default_db)
        if target is not None:
            oid = self.identities.oid_of(*target)
            if oid is not None:
                if (shape := self._schemas.get(oid) or self.identities.adopted(oid)) is not None:
                    self._schemas[oid] = shape
                    self._relation(oid, self._begin(out), out)
                out.append((self._begin(out), Truncate((oid,))))
            return
        ddl = parse(query, default_db)
        self.tables_created += len(ddl.created_tables) + len(ddl.replaced_tables) + len(ddl.renamed_tables)
        for oid, (database, table) in self.identities.apply(ddl, at):
            self.renames.append((oid, (database, table), at))
            shape = self._schemas.get(oid)
            if shape is not None:
                self._schemas[oid] = replace(shape, schema=database, name=table)
                self._relation(oid, self._begin(out), out)

    def _commit(self, end: int, out: list[tuple[int, Event]]) -> None:
        self._gtid.commit()
        if self._txn is not None and self._begun:
            start, ts, _xid = self._txn
            out.append((start, Commit(start, end, ts, self.token)))
        self._txn, self._begun = None, False
        self.position = end

    def acknowledge(self, pos: int) -> None:
        """Nothing to tell the server: a MySQL replica keeps its own position (retention is by time)."""

    def close(self) -> None:
        """Close the replication connection."""
        self._reader.close()
        if self._catalog is not None:
            self._catalog.close()
            self._catalog = None
