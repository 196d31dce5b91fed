"""GTID positions: where a stream is in a replication topology, the same on every server of it.

A binlog file:offset means something on one server only; a replica writes the same transactions
(``log_slave_updates``) into its own files at its own offsets. GTIDs name a transaction the same
everywhere, so a pipeline keeps, with each position it registers, the GTID state there (``Resume``),
and continues on another server of the topology from that state (failover, ``source.py``).

- MariaDB: ``domain-server-sequence``; a position is the last GTID of each domain, as
  ``gtid_binlog_pos`` / ``gtid_slave_pos`` spell it (``0-1-100,1-2-7``): what a replica sends as
  ``@slave_connect_state`` to continue after it.
- MySQL: ``uuid:sequence``; a position is the set of transactions executed, as ``gtid_executed``
  spells it (``3e11fa47-...:1-100:102,...``), sent with ``COM_BINLOG_DUMP_GTID``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_MARIADB = re.compile(r"^(\d+)-(\d+)-(\d+)$")
_UUID = re.compile(r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$")


class MariaDbGtidPosition:
    """The last GTID of each replication domain: domain -> (server_id, sequence)."""

    def __init__(self, text: str = "") -> None:
        self.domains: dict[int, tuple[int, int]] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            match = _MARIADB.match(part)
            if match is None:
                raise ValueError(f"{part!r} is not a MariaDB GTID (domain-server-sequence)")
            domain, server, seq = (int(g) for g in match.groups())
            self.domains[domain] = (server, seq)

    def advance(self, domain: int, server: int, seq: int) -> None:
        """Transaction ``domain-server-seq`` committed."""
        self.domains[domain] = (server, seq)

    def behind(self, binlog_state: str) -> list[str]:
        """This position's GTIDs that a server whose ``gtid_binlog_state`` is ``binlog_state`` has not
        logged (that state lists the last sequence of each domain and server); [] when it holds them all."""
        logged: dict[tuple[int, int], int] = {}
        for part in filter(None, (p.strip() for p in binlog_state.split(","))):
            match = _MARIADB.match(part)
            if match is not None:
                domain, server, seq = (int(g) for g in match.groups())
                logged[(domain, server)] = max(seq, logged.get((domain, server), 0))
        return [f"{d}-{s}-{n}" for d, (s, n) in sorted(self.domains.items()) if logged.get((d, s), -1) < n]

    def __str__(self) -> str:
        return ",".join(f"{d}-{s}-{n}" for d, (s, n) in sorted(self.domains.items()))


class MySqlGtidSet:
    """MySQL's executed set: server uuid -> sorted, disjoint, inclusive ``(first, last)`` intervals."""

    def __init__(self, text: str = "") -> None:
        self.sets: dict[str, list[tuple[int, int]]] = {}
        for part in filter(None, (p.strip() for p in text.replace("\n", "").split(","))):
            uuid, *ranges = part.split(":")
            if not _UUID.match(uuid) or not ranges:
                raise ValueError(f"{part!r} is not a MySQL GTID set member (uuid:first-last[:first-last...])")
            for span in ranges:
                first, _, last = span.partition("-")
                if not first.isdigit() or (last and not last.isdigit()):
                    raise ValueError(f"{part!r}: {span!r} is not a sequence or a range of them")
                self._add(uuid.lower(), int(first), int(last or first))

    def add(self, uuid: str, gno: int) -> None:
        """Transaction ``uuid:gno`` committed."""
        self._add(uuid.lower(), gno, gno)

    def _add(self, uuid: str, first: int, last: int) -> None:
        spans = sorted([*self.sets.get(uuid, []), (first, last)])
        merged: list[tuple[int, int]] = []
        for lo, hi in spans:
            if merged and lo <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
            else:
                merged.append((lo, hi))
        self.sets[uuid] = merged

    def contains(self, other: MySqlGtidSet) -> bool:
        """Every transaction of ``other`` is in this set."""
        return all(any(lo <= a and b <= hi for lo, hi in self.sets.get(uuid, [])) for uuid, spans in other.sets.items()
                   for a, b in spans)

    def __str__(self) -> str:
        return ",".join(f"{uuid}:" + ":".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
                        for uuid, spans in sorted(self.sets.items()))


def mysql_gtid(event: Any) -> tuple[str, int]:
    """A MySQL ``GtidEvent``'s (uuid, sequence): its ``gtid`` text is ``uuid:sequence`` (its ``sid`` is
    the UUID's 16 bytes)."""
    uuid, _, gno = str(event.gtid).rpartition(":")
    return uuid.lower(), int(gno)


@dataclass(frozen=True)
class Resume:
    """What a registered position means beyond its int: the GTID state there (MariaDB's position or
    MySQL's set), the server the int's file:offset is on (``binlog.server_identity``) and that
    server's epoch (``position.to_int``: the positions of the n-th server a pipeline read sort after
    all of the servers' before it). Kept in state with each registered position (``Commit.token``)."""

    gtid: str
    server: str
    epoch: int
    flavor: str  # "mariadb" or "mysql"

    def to_token(self) -> str:
        return json.dumps({"gtid": self.gtid, "server": self.server, "epoch": self.epoch, "flavor": self.flavor},
                          separators=(",", ":"))

    @classmethod
    def from_token(cls, token: str | None) -> Resume | None:
        """The token state keeps (None: none recorded, e.g. a pipeline from before GTIDs were kept)."""
        if not token:
            return None
        data = json.loads(token)
        return cls(str(data["gtid"]), str(data["server"]), int(data["epoch"]), str(data.get("flavor", "mariadb")))


class GtidTracker:
    """The GTID state of a stream as it reads (``begin`` a transaction's GTID, ``commit`` it), and its
    ``token`` there: a ``Resume`` on server ``server`` in ``epoch``. ``state`` None: not known (MySQL
    read by file and offset), no token."""

    def __init__(self, state: str | None, server: str, epoch: int) -> None:
        self.mariadb = server.startswith("mariadb:")
        self._state = None if state is None else MariaDbGtidPosition(state) if self.mariadb else MySqlGtidSet(state)
        self._server, self._epoch = server, epoch
        self._open: tuple[Any, ...] | None = None  # the open transaction's GTID
        self._token: str | None = None  # built when first asked after a change

    def begin(self, *gtid: Any) -> None:
        """A transaction's GTID: MariaDB's (domain, server, sequence) or MySQL's (uuid, sequence)."""
        self._open = gtid

    def commit(self) -> None:
        """The open transaction (if it had a GTID) committed."""
        if self._open is not None and self._state is not None:
            if isinstance(self._state, MariaDbGtidPosition):
                self._state.advance(*self._open)
            else:
                self._state.add(*self._open)
            self._token = None
        self._open = None

    @property
    def token(self) -> str | None:
        if self._state is None:
            return None
        if self._token is None:
            self._token = Resume(str(self._state), self._server, self._epoch,
                                 "mariadb" if self.mariadb else "mysql").to_token()
        return self._token
