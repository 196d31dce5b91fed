"""TABLE_MAP events parsed once per distinct event, not once per transaction.

The server writes a TABLE_MAP before each transaction's rows of a table, the same bytes each time
until the table's definition changes (then it gets a new table id). mysql-replication parses each
one in Python, optional metadata included: measured a third of ``BinlogStream``'s time on
``bench/mysql.py``'s changes (transactions of 100 rows). ``CachedTableMapEvent`` keeps the parse of
each distinct event body and gives a repeated one its attributes at once; the event is otherwise the
library's own (the row events find their table in the reader's ``table_map`` as before).

The library builds events from a class-level map of event types; this module points its TABLE_MAP
entry at the subclass (at import), and the stream asks for the subclass in ``only_events``.
"""

from __future__ import annotations

from typing import Any

from pymysqlreplication.constants.BINLOG import TABLE_MAP_EVENT
from pymysqlreplication.event import BinLogEvent
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import TableMapEvent

_LIMIT = 4096  # distinct TABLE_MAP bodies kept (a table's body changes only with its definition)
# What each event sets for itself (BinLogEvent.__init__); the rest of a parse is the body's.
_OWN = ("packet", "table_map", "event_type", "timestamp", "event_size", "_ctl_connection")


class CachedTableMapEvent(TableMapEvent):
    """A TABLE_MAP whose parse is shared with earlier events of the same body (``raw_key``)."""

    _parsed: dict[tuple[Any, ...], dict[str, Any]] = {}  # noqa: RUF012 -- the cache, shared by streams

    def __init__(self, from_packet: Any, event_size: int, table_map: dict[int, Any], ctl_connection: Any,
                 **kwargs: Any) -> None:
        packet = from_packet.packet  # pymysql's packet: the event body follows the 20 header bytes read
        body = bytes(packet._data[packet._position:packet._position + event_size])
        self.raw_key = (getattr(ctl_connection, "host", None), getattr(ctl_connection, "port", None), body)
        parsed = self._parsed.get(self.raw_key)
        if parsed is None:
            super().__init__(from_packet, event_size, table_map, ctl_connection, **kwargs)
            if getattr(self, "_processed", True) and hasattr(self, "table_obj"):
                if len(self._parsed) >= _LIMIT:
                    self._parsed.clear()
                self._parsed[self.raw_key] = {k: v for k, v in self.__dict__.items() if k not in _OWN}
            return
        BinLogEvent.__init__(self, from_packet, event_size, table_map, ctl_connection, **kwargs)
        own = {k: self.__dict__[k] for k in _OWN if k in self.__dict__}
        self.__dict__.update(parsed)
        self.__dict__.update(own)
        table_map[self.table_id] = self.table_obj


BinLogPacketWrapper._BinLogPacketWrapper__event_map[TABLE_MAP_EVENT] = CachedTableMapEvent  # type: ignore[attr-defined]
