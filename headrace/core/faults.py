"""Named crash and hold points for fault-injection tests.

``HEADRACE_CRASH_AT=<point>:<n>`` makes the process die abruptly (``os._exit``, like kill -9: no
flush, no cleanup) the n-th time it passes ``<point>``. ``HEADRACE_HOLD_AT=<point>:<seconds>[:<n>]``
makes the first n passes (all, without n) of a hold point wait ``seconds`` where the caller says
(a copy's read: in a server statement, holding its lock, as a long read would). Unset in production,
each costs one dict lookup per pass.
"""

from __future__ import annotations

import os
import sys

CRASH_POINTS = (
    "capture.after_write",  # staged files written, not registered
    "capture.after_register",  # files registered, slot not acknowledged
    "apply.after_target_commit",  # target committed, cursor not advanced
    "apply.after_history_commit",  # history tables committed, the mirror not
    "snapshot.after_chunk",  # a chunk group written to the target, its progress not yet recorded
    "snapshot.after_write",  # copy written to the target, state not yet CATCHUP
    "fanout.after_destination_commit",  # a destination lake committed, its cursor not advanced
)

HOLD_POINTS = (
    "snapshot.read",  # a copy's read, inside its transaction, after the table's lock is taken
)

_passes: dict[str, int] = {}
_held: dict[str, int] = {}


def reset() -> None:
    """Count passes from zero again (a test setting a point in a process that passed it before)."""
    _passes.clear()
    _held.clear()


def hold_seconds(name: str) -> float:
    """How long the test setting asks this pass of hold point ``name`` to wait (0: not at all)."""
    setting = os.environ.get("HEADRACE_HOLD_AT")
    if not setting:
        return 0.0
    point, _, rest = setting.partition(":")
    if point != name:
        return 0.0
    seconds, _, times = rest.partition(":")
    _held[name] = _held.get(name, 0) + 1
    return float(seconds or 0) if not times or _held[name] <= int(times) else 0.0


def crash_point(name: str) -> None:
    """Die here if the test setting asks for it."""
    setting = os.environ.get("HEADRACE_CRASH_AT")
    if not setting:
        return
    point, _, nth = setting.partition(":")
    if point != name:
        return
    _passes[name] = _passes.get(name, 0) + 1
    if _passes[name] >= int(nth or 1):
        sys.stderr.write(f"headrace: crash point {name} reached (pass {_passes[name]}), exiting\n")
        sys.stderr.flush()
        os._exit(137)
