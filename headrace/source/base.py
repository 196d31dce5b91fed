"""The source seam: what the run, capture and the initial copy need from a source database.

A ``Source`` is chosen by the DSN's scheme (``headrace.source.open_source``). Positions are plain
ints in the staged log's order (PostgreSQL: the LSN; MySQL: binlog file number << 32 | offset);
only the source knows their text form (``format_position``). Connections are opaque to the
caller: it gets one from ``connect`` and hands it back to the source's own methods.

Some features exist for one source only (PostgreSQL: the publication, the slot's WAL guard, the
catalog watch for CREATE/DROP/partitions). They are optional capabilities: ``catalog_watch`` and
``wal_watch`` return None when the source has none, and the run skips that step.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from headrace.core.changes import Event, Relation
from headrace.core.names import TableName
from headrace.core.schema import TableSchema
from headrace.core.undecoded import UndecodedCodec

if TYPE_CHECKING:
    import pyarrow as pa

    from headrace.config import PipelineConfig
    from headrace.state.store import StateStore

# The column a chunk reader adds when every chunk has its own snapshot (its position, every row).
POSITION_COLUMN = "_pos"


class ChangeStream(Protocol):
    """The change stream from a position: core.changes events, in commit order."""

    # The most the source may have been told is durable beyond what ``acknowledge`` was given (psycopg2
    # forwards a slot's confirmation on its own: ``ReplicationStream``); 0 for a stream that never does.
    forwardable: int

    def read(self, max_messages: int, timeout: float) -> Sequence[tuple[int, Event | bytes]]:
        """Up to ``max_messages`` (position, event) pairs, waiting up to ``timeout`` seconds; a
        change may come as its undecoded ``bytes`` (only from a source whose ``undecoded`` codec
        stages them)."""

    def acknowledge(self, pos: int) -> None:
        """Everything up to ``pos`` is durable on our side: the source may release it."""

    def new_table_errors(self) -> dict[int, str]:
        """Tables the stream stopped since the last call (id -> the message naming the fix), which the
        run loop errors (MySQL: a tracked table dropped in the binlog); {} for a source that never does."""

    def tables_created(self) -> bool:
        """The stream read a table's creation (or a rename into a name) since the last call: the run's
        catalog watch polls at once (MySQL: a CREATE TABLE in the binlog); False for a source that
        cannot tell."""

    def close(self) -> None:
        """Close the stream's connection."""


class Route(enum.Enum):
    """How a chunk reader delivers one column (see ``engines.spark.copy``, ``engines.chunks``)."""

    BINARY = "binary"  # typed, in the target's type
    SPLIT = "split"  # typed, plus ``t{i}`` text for the values outside the typed range
    TEXT = "text"  # PostgreSQL text output, cast by Spark like the change stream's values


@dataclass(frozen=True)
class ChunkRead:
    """How Spark tasks read chunks of one table: ``read(start, end)`` runs in a task (picklable)
    and yields Arrow batches ``c0..cN`` (plus ``t{i}`` for SPLIT columns, plus ``_pos`` when
    ``per_row_position``)."""

    read: Callable[[int, int], Iterator[pa.RecordBatch]]
    routes: list[Route]
    per_row_position: bool = False


class ChunkSession(Protocol):
    """A source connection on the driver that reads chunk after chunk, of any tables, under one copy
    snapshot (``Source.chunk_session``): a round's small tables then pay one connection, not one each."""

    broken: bool  # a read failed: the session cannot read again and must be closed

    def read(self, table: TableSchema, start: int, end: int) -> list[pa.RecordBatch]:
        """Chunk ``[start, end)`` of ``table``, as the table's ``chunk_reader`` would read it."""
        ...

    def close(self) -> None:
        """Close the connection."""
        ...


@dataclass(frozen=True)
class LockWaiter:
    """A session of the source's that waits for a lock a copy's session holds (a DDL statement, most
    often, with the application's writes queued behind it)."""

    pid: int  # the waiting session (PostgreSQL backend pid; MySQL connection id)
    table: str  # the table it waits for, qualified
    oid: int | None  # that table's id in the pipeline (None: not one the source can tell)
    statement: str  # what it runs, cut to a line
    waiting_seconds: float
    blockers: tuple[int, ...]  # the copy's sessions it waits for

    def as_dict(self) -> dict[str, Any]:
        """For status, the API and the page."""
        return {"pid": self.pid, "table": self.table, "statement": self.statement,
                "waiting_seconds": round(self.waiting_seconds, 1), "blocked_by": list(self.blockers)}


@dataclass(frozen=True)
class CopySnapshot:
    """What a copy round reads under. ``position``: every change after it is in the stream and
    none before it is needed (PostgreSQL: the exported snapshot's LSN; MySQL, where each chunk has
    its own snapshot at a later position carried per row: the binlog position before any chunk).
    ``token`` is the source's handle for tasks (PostgreSQL: the snapshot name)."""

    position: int
    token: str | None = None


@dataclass
class CatalogPoll:
    """One consistent look at the catalog (PostgreSQL's catalog watch)."""

    alive: set[int]  # tracked oids that still exist
    listed: dict[int, str]  # tables found in the discovered schemas (oid -> qualified name)
    successors: dict[int, int | None]  # a gone oid -> the oid its name resolves to now
    leaves: dict[int, dict[int, bool]]  # partitioned table -> its leaf partitions
    position: int  # read after the snapshot: past any drop it shows
    extra: dict[str, Any] = field(default_factory=dict)


class CatalogWatch(ABC):
    """Capability: tables that come and go, seen by polling the catalog (PostgreSQL)."""

    @abstractmethod
    def poll(self, tracked: dict[int, TableName], schemas: list[str] | None, discovers: bool) -> CatalogPoll:
        """Read the catalog under one snapshot (``tracked``: oid -> the name state knows it by)."""

    @abstractmethod
    def existing(self, conn: Any, oids: list[int]) -> set[int]:
        """Those of ``oids`` that still exist."""


class RetainedLog(Protocol):
    """Capability figures: source log the pipeline's position holds back (PostgreSQL: slot WAL)."""

    @property
    def slot(self) -> str: ...

    @property
    def retained_bytes(self) -> int | None: ...

    @property
    def limit_bytes(self) -> int: ...

    @property
    def lost(self) -> bool: ...

    @property
    def over_limit(self) -> bool: ...

    def as_dict(self) -> dict[str, Any]: ...


class LogWatch(ABC):
    """Capability: the retained source log of the pipeline (PostgreSQL: the slot's WAL guard)."""

    @abstractmethod
    def read(self) -> RetainedLog | None:
        """The figures now; None when the source or the slot cannot be seen."""

    @abstractmethod
    def lost_message(self) -> str:
        """The error (with the recovery) for a log position the source has dropped."""

    @abstractmethod
    def warning(self, figures: RetainedLog) -> str | None:
        """A readiness warning for the figures, if any."""


class Source(ABC):
    """One source database for one pipeline (``config``), reached at ``dsn``."""

    kind: str = ""  # "postgresql", "mysql"
    label: str = ""  # what error messages call the server ("PostgreSQL", "MariaDB/MySQL")
    # The driver's errors meaning the server went away (capture retries them like a dropped stream).
    transient_errors: tuple[type[BaseException], ...] = ()

    def __init__(self, config: PipelineConfig, dsn: str) -> None:
        self.config = config
        self.dsn = dsn

    # -- connections and checks --------------------------------------------------------------------
    @abstractmethod
    def connect(self) -> AbstractContextManager[Any]:
        """An autocommit connection to the source (closed on exit)."""

    @abstractmethod
    def user(self) -> str | None:
        """The user headrace connects as (named in GRANT fixes)."""

    @abstractmethod
    def problems(self) -> list[str]:
        """Every problem that would stop ``run`` (server settings, tables, privileges); [] when none."""

    @abstractmethod
    def identity(self, conn: Any) -> str:
        """What identifies the server (PostgreSQL: system identifier; MySQL: server UUID)."""

    @abstractmethod
    def check_same_source(self, conn: Any, state: StateStore) -> None:
        """``SourceError`` (with its remedy) when the server is not the one the state was set up on,
        or its capture position is not where the pipeline left it."""

    @abstractmethod
    def probe(self) -> None:
        """Connect and run a trivial query; raise when the server does not answer."""

    # -- catalog ------------------------------------------------------------------------------------
    @abstractmethod
    def list_tables(self, conn: Any, schemas: list[str] | None) -> dict[int, str]:
        """Replicable-looking tables of ``schemas`` (all when None): oid -> qualified name."""

    @abstractmethod
    def table_problems(self, conn: Any, name: str) -> list[str]:
        """Why a discovered table cannot be replicated ([] when it can)."""

    @abstractmethod
    def read_table_schema(self, conn: Any, table: str | TableName | int) -> TableSchema:
        """A table's schema now (by name or oid)."""

    @abstractmethod
    def assess(self, conn: Any, tables: list[str | TableName]) -> dict[str, Any]:
        """The per-table assessment ``{"tables": [{table, oid, exists, problems...}], "problems": [...]}``."""

    @abstractmethod
    def current_names(self, conn: Any, oids: list[int]) -> list[TableName]:
        """Current names of those oids that still exist."""

    def configured_names(self, names: list[TableName]) -> list[TableName]:
        """The tables the config names, each under its name now: a table the state tracks keeps its
        place when renamed. PostgreSQL's oids follow a table through a rename (name it by its new
        name): ``names`` as they are. MySQL overrides it (its ids are a hash of the first name)."""
        return names

    # -- capture --------------------------------------------------------------------------------------
    @abstractmethod
    def prepare_capture(self, conn: Any, tables: list[TableName]) -> int:
        """Make sure capture can run for ``tables`` (PostgreSQL: publication and slot); the position
        the stream starts from for a new pipeline."""

    def capture_tables(self, conn: Any, tables: list[TableName]) -> None:
        """The captured table set changed (PostgreSQL: the publication's table list)."""

    @abstractmethod
    def check_capture(self, conn: Any, state: StateStore) -> None:
        """At start-up: the capture position recorded in state is still usable (or ``SourceError``)."""

    @abstractmethod
    def open_stream(self, start: int, known: Callable[[], dict[int, TableSchema]]) -> ChangeStream:
        """The change stream from ``start`` (a transaction boundary); ``known``: the tracked tables."""

    def undecoded(self) -> UndecodedCodec | None:
        """The codec of the changes the stream hands over undecoded (``core.undecoded``); None when
        it hands over events only."""
        return None

    @abstractmethod
    def relation_schema(self, conn: Any, stream: ChangeStream, ev: Relation, known: TableSchema) -> TableSchema:
        """The schema a Relation event describes (``known``: the tracked schema)."""

    @abstractmethod
    def heartbeat(self, conn: Any) -> None:
        """Make the stream move (a committed no-op the stream sees), so an idle pipeline advances."""

    @abstractmethod
    def flushed_position(self, conn: Any) -> int:
        """The source's flushed log end now: bounds what a confirmation sent now can carry."""

    def confirmed_position(self, conn: Any) -> int | None:
        """Where the source holds this pipeline's stream confirmed now (a slot's
        ``confirmed_flush_lsn``); None for a source that keeps no such position (MySQL)."""
        return None

    @abstractmethod
    def current_position(self, conn: Any) -> int:
        """The log's insert position now (``--until-caught-up`` waits for it)."""

    @abstractmethod
    def format_position(self, pos: int) -> str:
        """A position's text form, for logs and status."""

    # -- the initial copy ---------------------------------------------------------------------------
    @abstractmethod
    def copy_snapshot(self, name: str) -> AbstractContextManager[CopySnapshot]:
        """The snapshot a copy round reads under (``name``: for a temporary slot or the like)."""

    @abstractmethod
    def schema_at(self, conn: Any, oid: int, snapshot: CopySnapshot) -> TableSchema | None:
        """Table ``oid`` as ``snapshot`` sees it; None when it does not exist there."""

    @abstractmethod
    def plan_chunks(self, conn: Any, table: TableSchema) -> list[tuple[int, int]]:
        """Chunks ``(start, end)`` covering ``table`` (at least one)."""

    @abstractmethod
    def chunk_reader(self, table: TableSchema, snapshot: CopySnapshot, binary: bool) -> ChunkRead:
        """How Spark tasks read chunks of ``table``."""

    def chunk_session(self, snapshot: CopySnapshot, binary: bool) -> Callable[[], ChunkSession] | None:
        """Opens driver sessions reading chunks under ``snapshot`` as ``chunk_reader(..., binary)``
        does; None: none, each chunk read on the driver opens its own connection."""
        return None

    def copy_lock_waiters(self, conn: Any) -> list[LockWaiter]:
        """Sessions waiting now for a lock that a copy's session (any pipeline's) holds; [] where the
        source cannot tell."""
        return []

    def end_copy_reads(self, conn: Any, blockers: tuple[int, ...] = (), table_oid: int | None = None) -> int:
        """End the copy's reads in the sessions ``blockers`` and, with ``table_oid``, every copy read of
        that table: their transactions end and their locks go (the read fails in its copy, which is
        retried). Returns how many were ended."""
        return 0

    # -- optional capabilities -------------------------------------------------------------------
    def catalog_watch(self) -> CatalogWatch | None:
        """Tables that come and go (discovery, drops, recreations, partitions); None: not followed."""
        return None

    def log_watch(self) -> LogWatch | None:
        """The retained source log (warn, stop when lost); None: not watched."""
        return None

    def text_columns_watch(self, conn: Any, tracked: list[int]) -> set[int]:
        """Tracked oids alive now (for ``source.columns_as_text`` changes); all by default."""
        return set(tracked)
