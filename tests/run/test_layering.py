"""The package layout holds: the run never imports the control plane, the control plane sees the run
only through ``run.view``, and no import cycle runs through either (lazy imports included)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "headrace"


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in ROOT.rglob("*.py")}


def _imports(module: str) -> set[str]:
    """Every headrace module ``module`` imports, at the top, under TYPE_CHECKING or inside a function."""
    out = set()
    tree = ast.parse(MODULES[module].read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("headrace")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("headrace"):
            for alias in node.names:  # ``from headrace.run import startup`` imports the submodule
                sub = f"{node.module}.{alias.name}"
                out.add(sub if sub in MODULES else node.module)
    return {m for m in out if m in MODULES}


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_run_never_imports_the_control_plane() -> None:
    offenders = {m: sorted(i for i in _imports(m) if _under(i, "headrace.control") or i == "headrace.pipeline")
                 for m in MODULES if _under(m, "headrace.run")}
    assert not {m: i for m, i in offenders.items() if i}


def test_the_control_plane_sees_the_run_through_its_view() -> None:
    reached = {i for m in MODULES if _under(m, "headrace.control") for i in _imports(m) if _under(i, "headrace.run")}
    assert reached <= {"headrace.run.view"}


def test_no_import_cycle_through_the_run_or_the_control_plane() -> None:
    graph = {m: _imports(m) for m in MODULES}
    ours = [m for m in MODULES if _under(m, "headrace.run") or _under(m, "headrace.control")
            or m in ("headrace.pipeline", "headrace.outage_signs")]
    for start in ours:
        # Depth-first from ``start``: a path back to it is a cycle. A package's own __init__
        # importing its modules is how packages work, not a cycle.
        seen: set[str] = set()
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == start and not (start == "headrace.run" or _is_parent(nxt, node)):
                    raise AssertionError("import cycle: " + " -> ".join([*path, nxt]))
                if nxt not in seen and not _is_parent(nxt, node):
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))


def _is_parent(package: str, module: str) -> bool:
    return module.startswith(package + ".")


def test_the_run_capture_and_copy_reach_a_source_only_through_its_interface() -> None:
    """run/, capture/ and the initial copy use ``source.base.Source`` (chosen by ``source.open_source``),
    never a source's own modules: a second source plugs in behind the same interface."""
    users = [m for m in MODULES if _under(m, "headrace.run") or _under(m, "headrace.capture")
             or m == "headrace.materialize.initial_copy"]
    allowed = {"headrace.source", "headrace.source.base"}
    offenders = {m: sorted(i for i in _imports(m) if _under(i, "headrace.source") and i not in allowed)
                 for m in users}
    assert not {m: i for m, i in offenders.items() if i}


# What each engine may import: the shared definitions, the staged log's format, the object store's
# settings, a source's chunk interface, the chunk work both engines do, and its own package.
_BELOW_THE_ENGINES = ("headrace.core", "headrace.log", "headrace.logs", "headrace.storage", "headrace.source.base",
                      "headrace.engines.chunks")


def test_each_engine_imports_only_what_lies_below_it_never_the_other_engine() -> None:
    """``engines.spark`` and ``engines.driver`` never import each other, the materializer, the run, a
    target or a source's own modules: the lane decision (``materialize.lanes``) is the one place
    that knows both."""
    offenders = {}
    # A copy chunk's rows (``engines.chunks``) are built with the driver's casts wherever they run,
    # in a driver thread or inside a Spark task.
    extra = {"headrace.engines.chunks": ("headrace.engines.driver.casts",)}
    for engine in ("headrace.engines.spark", "headrace.engines.driver", "headrace.engines.chunks"):
        allowed = (*_BELOW_THE_ENGINES, engine, *extra.get(engine, ()))
        for m in MODULES:
            if _under(m, engine):
                bad = sorted(i for i in _imports(m) if not any(_under(i, a) for a in allowed))
                if bad:
                    offenders[m] = bad
    assert not offenders


def test_targets_import_core_and_the_engines_not_the_materializer_or_the_run() -> None:
    """A target sees the row shape and the interfaces (``core``), the engines' batch and key helpers,
    the history modes' rules (which themselves import only ``core``, the engines and the staged
    log), the object store's settings and the log helper: never the materializer, the run, capture,
    a source or the control plane."""
    allowed = ("headrace.core", "headrace.engines", "headrace.targets", "headrace.history", "headrace.storage",
               "headrace.logs")
    offenders = {m: sorted(i for i in _imports(m) if not any(_under(i, a) for a in allowed))
                 for m in MODULES if _under(m, "headrace.targets")}
    assert not {m: i for m, i in offenders.items() if i}
    history = ("headrace.core", "headrace.engines", "headrace.history", "headrace.log", "headrace.logs")
    below = {m: sorted(i for i in _imports(m) if not any(_under(i, a) for a in history))
             for m in MODULES if _under(m, "headrace.history")}
    assert not {m: i for m, i in below.items() if i}
