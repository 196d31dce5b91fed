"""Binlog positions (file, offset) as the staged log's int64 order key, and back.

A position is ``(epoch << 52) | (numeric suffix of the binlog file << 32) | offset``: files are
numbered in order (suffixes stay below 2**20: MySQL and MariaDB use six digits) and an offset stays
below 4 GiB (``max_binlog_size`` is at most 1 GiB), so the integers sort as the binlog does. The
epoch counts the servers a pipeline has read (0: the one it was set up on): after a failover to a
replica, whose binlog has its own files and offsets, its positions sort after every position read
from the servers before (``gtid.Resume``). A transaction's position is where it starts (its
GTID/BEGIN event); its ``Commit.end_lsn`` is where the next one starts, where a restart resumes.
"""

from __future__ import annotations

_OFFSET_BITS = 32
_OFFSET_MASK = (1 << _OFFSET_BITS) - 1
_FILE_BITS = 20
_EPOCH_SHIFT = _OFFSET_BITS + _FILE_BITS
_EPOCH_MAX = (1 << (63 - _EPOCH_SHIFT)) - 1  # 2047 servers in a row


def to_int(file: str, offset: int, epoch: int = 0) -> int:
    """``binlog.000003`` at 1234 -> ``(3 << 32) | 1234`` (plus ``epoch << 52``)."""
    suffix = file.rsplit(".", 1)[-1]
    if not suffix.isdigit() or int(suffix) >= 1 << _FILE_BITS:
        raise ValueError(f"binlog file name {file!r} has no numeric suffix below {1 << _FILE_BITS}")
    if not 0 <= offset <= _OFFSET_MASK:
        raise ValueError(f"binlog offset {offset} out of range")
    if not 0 <= epoch <= _EPOCH_MAX:
        raise ValueError(f"server epoch {epoch} out of range (0..{_EPOCH_MAX})")
    return (epoch << _EPOCH_SHIFT) | (int(suffix) << _OFFSET_BITS) | offset


def epoch_of(pos: int) -> int:
    """Which server (in the order the pipeline read them) position ``pos`` is on."""
    return pos >> _EPOCH_SHIFT


def from_int(pos: int, basename: str) -> tuple[str, int]:
    """The inverse of ``to_int`` (the epoch left out) for binlog files called ``basename.NNNNNN``
    (``basename`` is ``log_bin_basename``'s last part, e.g. ``binlog`` or ``mysql-bin``)."""
    return f"{basename}.{(pos >> _OFFSET_BITS) & ((1 << _FILE_BITS) - 1):06d}", pos & _OFFSET_MASK


def format_position(pos: int, basename: str | None = None) -> str:
    """``000003:1234``, or ``binlog.000003:1234`` with the basename, for logs and messages; a position
    on a later server than the first is prefixed with its epoch, ``2/000003:1234``."""
    file, offset = from_int(pos, basename or "")
    text = f"{file if basename else file.lstrip('.')}:{offset}"
    return f"{epoch_of(pos)}/{text}" if epoch_of(pos) else text
