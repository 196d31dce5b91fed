"""Sizes as people write them in config files: ``10GB``, ``512 MB``, ``1.5TiB``, or plain bytes."""

from __future__ import annotations

import re

_UNITS = {"": 1, "b": 1, "kb": 1 << 10, "kib": 1 << 10, "mb": 1 << 20, "mib": 1 << 20, "gb": 1 << 30,
          "gib": 1 << 30, "tb": 1 << 40, "tib": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: int | str) -> int:
    """Bytes in ``value``. Units are binary, as in PostgreSQL's settings (1GB = 1024 MB)."""
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a size cannot be negative, got {value}")
        return value
    match = _SIZE_RE.match(str(value))
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise ValueError(f"{value!r} is not a size: write bytes or a number with kB, MB, GB or TB, e.g. 10GB")
    return int(float(match.group(1)) * _UNITS[unit])


def format_size(n: int) -> str:
    """``n`` bytes for people: 1.5 GB, 512 MB, 100 bytes."""
    for unit, factor in (("TB", 1 << 40), ("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if n >= factor:
            return f"{n / factor:.1f} {unit}".replace(".0 ", " ")
    return f"{n} bytes"
