"""mysql-replication's reader of TIME(fsp) in row events, replaced by the server's algorithm at import
(``types`` imports this module, so every reader of row events in the process decodes TIME correctly)."""

from __future__ import annotations

import datetime as dt
from typing import Any


def _read_time2(self: Any, column: Any) -> dt.timedelta:
    """TIME(fsp) from a row event, as the server decodes it (``my_time_packed_from_binary``).

    mysql-replication 1.0.17 reads a negative TIME with a fractional part wrongly (it negates the
    integer part and the fraction separately, so ``-00:00:00.01`` comes out as ``-00:00:00.99``);
    this replaces its reader (``RowsEvent.__read_time2``).
    """
    fsp = column.fsp or 0
    raw = self.packet.read(3 + (fsp + 1) // 2)
    if fsp >= 5:
        packed = int.from_bytes(raw, "big") - 0x800000000000
    else:
        intpart = int.from_bytes(raw[:3], "big") - 0x800000
        frac = int.from_bytes(raw[3:], "big") if fsp else 0
        if intpart < 0 and frac:
            # Negative values store the fraction in reverse order (binary sort order).
            intpart += 1
            frac -= 1 << (8 * len(raw[3:]))
        packed = (intpart << 24) + frac * (10_000 if fsp <= 2 else 100)
    sign = -1 if packed < 0 else 1
    packed = abs(packed)
    hms, micro = packed >> 24, packed & 0xFFFFFF
    return sign * dt.timedelta(hours=(hms >> 12) & 0x3FF, minutes=(hms >> 6) & 0x3F, seconds=hms & 0x3F,
                               microseconds=micro)


def _install_binlog_fixes() -> None:
    from pymysqlreplication.row_event import RowsEvent

    RowsEvent._RowsEvent__read_time2 = _read_time2  # type: ignore[attr-defined]


# At import: every reader of row events in this process (the binlog stream) decodes TIME correctly.
_install_binlog_fixes()
