"""Change events, as decoded from the pgoutput stream.

Small immutable values, dispatched with ``match``. Tuple values are PostgreSQL's text output
(``str``), ``None`` for SQL NULL, or ``UNCHANGED`` for a TOASTed value the update did not touch.
Timestamps are microseconds since the Unix epoch (UTC).

``Insert``, ``Update`` and ``Delete`` are not declared frozen, only treated as immutable: one is made
for every change capture reads, and a frozen dataclass's ``__init__`` (``object.__setattr__`` per
field) cost four times a plain one's, a measurable share of capture's time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


class _Unchanged:
    """Marker for a TOASTed value that an UPDATE left as it was (pgoutput sends no bytes for it)."""

    _instance: _Unchanged | None = None

    def __new__(cls) -> _Unchanged:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED: Final = _Unchanged()

Value = str | None | _Unchanged


@dataclass(frozen=True, slots=True)
class RelationColumn:
    """A column as a RELATION message describes it."""

    name: str
    type_oid: int
    typmod: int
    is_key: bool


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int  # LSN of the commit record; equals Commit.commit_lsn
    commit_ts_us: int
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    commit_lsn: int
    end_lsn: int  # the position to acknowledge once this transaction is durable
    commit_ts_us: int
    # The source's own spelling of end_lsn where the int is not enough to resume from on another server
    # (MySQL/MariaDB: the GTID state, ``source.mysql.gtid.Resume``); registered with the position.
    token: str | None = None


@dataclass(frozen=True, slots=True)
class Relation:
    oid: int
    namespace: str
    name: str
    replica_identity: str  # d, n, f, i
    columns: tuple[RelationColumn, ...]


@dataclass(slots=True)  # immutable by convention (see the module docstring)
class Insert:
    relation_oid: int
    new: tuple[Value, ...]


@dataclass(slots=True)  # immutable by convention (see the module docstring)
class Update:
    relation_oid: int
    new: tuple[Value, ...]
    # Old tuple: the key columns ('K', other positions None) when the key changed under REPLICA
    # IDENTITY DEFAULT/INDEX, the whole old row ('O') under REPLICA IDENTITY FULL, else None.
    old: tuple[Value, ...] | None = None
    old_kind: str | None = None


@dataclass(slots=True)  # immutable by convention (see the module docstring)
class Delete:
    relation_oid: int
    old: tuple[Value, ...]
    old_kind: str  # 'K' (key columns only) or 'O' (whole row)


@dataclass(frozen=True, slots=True)
class Truncate:
    relation_oids: tuple[int, ...]
    cascade: bool = False
    restart_identity: bool = False


@dataclass(frozen=True, slots=True)
class Message:
    """A logical decoding message (``pg_logical_emit_message``); headrace uses them as heartbeats."""

    lsn: int
    transactional: bool
    prefix: str
    content: bytes


# A transaction streamed while in progress (pgoutput protocol 2+, PostgreSQL 14+): its changes
# arrive in blocks between StreamStart and StreamStop, interleaved with other transactions, and it
# ends with StreamCommit or StreamAbort.


@dataclass(frozen=True, slots=True)
class StreamStart:
    """A block of in-progress transaction ``xid``'s changes begins (``first``: its first block)."""

    xid: int
    first: bool


@dataclass(frozen=True, slots=True)
class StreamStop:
    """The block of in-progress changes ends (other transactions may follow)."""


@dataclass(frozen=True, slots=True)
class StreamCommit:
    """Streamed transaction ``xid`` committed: its changes take effect at ``commit_lsn``."""

    xid: int
    commit_lsn: int
    end_lsn: int  # the position to acknowledge once this transaction is durable
    commit_ts_us: int


@dataclass(frozen=True, slots=True)
class StreamAbort:
    """Streamed transaction ``xid`` rolled back its subtransaction ``subxid`` (all of it when equal)."""

    xid: int
    subxid: int


@dataclass(frozen=True, slots=True)
class Streamed:
    """A message inside a block of streamed changes: ``event`` of (sub)transaction ``xid``."""

    xid: int
    event: Event | None


Change = Insert | Update | Delete | Truncate
Event = (Begin | Commit | Relation | Insert | Update | Delete | Truncate | Message
         | StreamStart | StreamStop | StreamCommit | StreamAbort | Streamed)
