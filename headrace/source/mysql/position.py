"""Binlog positions (file, offset) as the staged log's int64 order key, and back.

A position is ``(numeric suffix of the binlog file << 32) | offset``: files are numbered in order
and an offset stays below 4 GiB (``max_binlog_size`` is at most 1 GiB), so the integers sort as the
binlog does. A transaction's position is where it starts (its GTID/BEGIN event); its
``Commit.end_lsn`` is where the next one starts, where a restart resumes.
"""

from __future__ import annotations

_OFFSET_BITS = 32
_OFFSET_MASK = (1 << _OFFSET_BITS) - 1


def to_int(file: str, offset: int) -> int:
    """``binlog.000003`` at 1234 -> ``(3 << 32) | 1234``."""
    suffix = file.rsplit(".", 1)[-1]
    if not suffix.isdigit():
        raise ValueError(f"binlog file name {file!r} has no numeric suffix")
    if not 0 <= offset <= _OFFSET_MASK:
        raise ValueError(f"binlog offset {offset} out of range")
    return (int(suffix) << _OFFSET_BITS) | offset


def from_int(pos: int, basename: str) -> tuple[str, int]:
    """The inverse of ``to_int`` for binlog files called ``basename.NNNNNN`` (``basename`` is
    ``log_bin_basename``'s last part, e.g. ``binlog`` or ``mysql-bin``)."""
    return f"{basename}.{pos >> _OFFSET_BITS:06d}", pos & _OFFSET_MASK


def format_position(pos: int, basename: str | None = None) -> str:
    """``000003:1234``, or ``binlog.000003:1234`` with the basename, for logs and messages."""
    file, offset = from_int(pos, basename or "")
    return f"{file if basename else file.lstrip('.')}:{offset}"
