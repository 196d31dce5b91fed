"""MariaDB's UUID, INET4 and INET6: fixed-size binary values a TABLE_MAP cannot tell from BINARY(n), and
the text MariaDB prints for them (``CAST(col AS CHAR)``), rebuilt from the binlog's row image."""

from __future__ import annotations

from typing import Final

# MariaDB's fixed-size binary types (10.5+, 10.10+) and their stored size: a TABLE_MAP describes
# each as BINARY(size), so the stream learns them from the catalog (``catalog.fixed_binary_types``).
FIXED_BINARY_TYPES: Final = {"uuid": 16, "inet6": 16, "inet4": 4}


def fixed_binary_text(base: str, stored: bytes) -> str:
    """What MariaDB prints (``CAST(col AS CHAR)``) for a UUID, INET4 or INET6 ``stored`` as the binlog's
    row image holds it (in text order on 10.11, verified by the types test; trailing zero bytes dropped)."""
    data = stored.ljust(FIXED_BINARY_TYPES[base], b"\0")
    if base == "uuid":
        h = data.hex()
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    if base == "inet4":
        return ".".join(map(str, data))
    return _inet6_text(data)


def _inet6_text(data: bytes) -> str:
    """MariaDB's INET6 text (``Inet6::to_string``, from MySQL's INET6_NTOA): the first longest run of zero
    words, even a single one, is ``::``; IPv4-compatible (``::a.b.c.d``, the run being six words) and
    IPv4-mapped (``::ffff:a.b.c.d``) addresses end in dotted IPv4. Not Python's ``ipaddress`` (RFC 5952
    leaves a single zero word alone and, before 3.13, prints mapped addresses in hex)."""
    words = [int.from_bytes(data[i:i + 2], "big") for i in range(0, 16, 2)]
    gap_pos, gap_len, run_pos, run_len = -1, -1, -1, -1
    for i, word in enumerate([*words, 1]):  # a sentinel word ends a trailing run
        if word == 0:
            run_pos, run_len = (run_pos, run_len + 1) if run_pos >= 0 else (i, 1)
        elif run_pos >= 0:
            if run_len > gap_len:
                gap_pos, gap_len = run_pos, run_len
            run_pos, run_len = -1, -1
    if gap_pos == 0 and (gap_len == 6 or (gap_len == 5 and words[5] == 0xFFFF)):
        return ("::ffff:" if gap_len == 5 else "::") + ".".join(map(str, data[12:]))
    parts: list[str] = []
    i = 0
    while i < 8:
        if i == gap_pos:
            parts.append("" if i else ":")  # "::" at the start, ":" + ":" of the join elsewhere
            i += gap_len
            if i == 8:
                parts.append("")
            continue
        parts.append(format(words[i], "x"))
        i += 1
    return ":".join(parts)
