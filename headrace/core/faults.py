"""Named crash points for fault-injection tests.

``HEADRACE_CRASH_AT=<point>:<n>`` makes the process die abruptly (``os._exit``, like kill -9: no
flush, no cleanup) the n-th time it passes ``<point>``. Unset in production, it costs one dict
lookup per pass.
"""

from __future__ import annotations

import os
import sys

CRASH_POINTS = (
    "capture.after_write",  # staged files written, not registered
    "capture.after_register",  # files registered, slot not acknowledged
    "apply.after_target_commit",  # target committed, cursor not advanced
    "snapshot.after_chunk",  # a chunk group written to the target, its progress not yet recorded
    "snapshot.after_write",  # copy written to the target, state not yet CATCHUP
    "fanout.after_destination_commit",  # a destination lake committed, its cursor not advanced
)

_passes: dict[str, int] = {}


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
