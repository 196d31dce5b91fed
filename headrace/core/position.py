"""Positions in the source's write-ahead log.

A change is ordered by (commit LSN of its transaction, ordinal inside the transaction). LSNs are
kept as plain ``int`` everywhere inside headrace and formatted as PostgreSQL's ``X/Y`` text only at
the edges (logs, status, SQL parameters).
"""

from __future__ import annotations

from dataclasses import dataclass


def parse_lsn(text: str) -> int:
    """Turn PostgreSQL's ``16/B374D848`` notation into an integer."""
    high, _, low = text.partition("/")
    if not low:
        raise ValueError(f"not an LSN: {text!r}")
    return (int(high, 16) << 32) | int(low, 16)


def format_lsn(lsn: int) -> str:
    """Turn an integer LSN into PostgreSQL's ``16/B374D848`` notation."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


@dataclass(frozen=True, order=True, slots=True)
class Position:
    """Where a change sits in the source's history: commit LSN, then ordinal in the transaction."""

    lsn: int
    seq: int = 0

    def __str__(self) -> str:
        return f"{format_lsn(self.lsn)}#{self.seq}"
