"""Starting Spark while another thread imports and logs: pyspark's launcher deadlocks, ours does not.

The hang of issue 35 in its smallest form, deterministic: one thread holds the import lock (as an
import in progress does) and then logs; the other starts the Spark JVM meanwhile. Each runs in a
child process, so a hung one is killed at its deadline instead of hanging the suite.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

# The child: a thread holds the import lock, then (a moment later) asks for logging's lock; the main
# thread launches the JVM meanwhile, with pyspark's launcher or ours.
_CHILD = textwrap.dedent("""
    import _imp, logging, sys, threading, time
    from pyspark.java_gateway import launch_gateway as pyspark_launch  # imports done before the race
    from headrace.engines.spark.gateway import launch_gateway as headrace_launch
    held = threading.Event()

    def importer():
        _imp.acquire_lock()  # what an import in progress holds
        held.set()
        time.sleep(1.0)  # the other thread forks meanwhile
        logging.getLogger("an.import").info("a module logging at import time")
        _imp.release_lock()

    threading.Thread(target=importer, daemon=True).start()
    held.wait()
    if sys.argv[1] == "pyspark":
        gateway = pyspark_launch()
    else:
        gateway = headrace_launch({"spark.master": "local[1]", "spark.ui.enabled": "false"})
    gateway.jvm.java.lang.System.currentTimeMillis()
    print("jvm started", flush=True)
    gateway.shutdown()
""")


def _launch(launcher: str, timeout: float) -> str:
    """'started', or 'hung' when the child is still waiting at ``timeout``."""
    child = subprocess.Popen([sys.executable, "-c", _CHILD, launcher], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
    try:
        out, _ = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        return "hung"
    assert child.returncode == 0, f"{launcher}'s child failed (exit {child.returncode})"
    return "started" if "jvm started" in out else "no output"


def test_pyspark_launcher_deadlocks_with_an_import_that_logs() -> None:
    # The reproduction: pyspark's launcher forks with a preexec_fn, taking logging's lock then the
    # import lock; the importer holds the import lock and wants logging's.
    assert _launch("pyspark", timeout=12) == "hung"  # ours starts the JVM in 5-7 s on 2 cores


def test_headrace_launcher_starts_the_jvm_beside_an_import_that_logs() -> None:
    assert _launch("headrace", timeout=120) == "started"
