"""The Spark JVM, launched without a ``preexec_fn``, so starting it cannot deadlock a threaded process.

pyspark's own ``launch_gateway`` starts ``spark-submit`` with ``Popen(preexec_fn=...)`` (to ignore
SIGINT in the JVM). With a ``preexec_fn`` CPython runs every before-fork handler and takes the import
lock before it forks: the ``logging`` module's handler takes logging's lock first, so a thread of
ours in the middle of an import that logs (it holds the import lock and waits for logging's) and the
thread starting Spark (it holds logging's and waits for the import lock) wait for each other forever.
That hung a DuckLake copy whose first table needing Spark started the JVM while another copy thread
imported pyarrow's pandas shims (issue 35); the copy sessions it held then blocked the source's DDL.

Without a ``preexec_fn`` the child is forked and exec'd in C, with no Python code and no lock of the
parent's: the JVM is put in a session of its own instead (``start_new_session``), which keeps a
terminal's Ctrl-C from reaching it as the SIGINT pyspark ignored did. It still exits when we do (it
reads its stdin, our pipe, until end of file). pyspark then connects to it as it connects to a JVM
that ``spark-submit`` launched (``PYSPARK_GATEWAY_PORT``, ``PYSPARK_GATEWAY_SECRET``).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from py4j.java_gateway import JavaGateway

_environ_lock = threading.Lock()  # the connect below borrows two process-wide variables for a moment


def launch_gateway(conf: Mapping[str, str], timeout: float = 300.0) -> JavaGateway:
    """Start the JVM of a Spark driver with ``conf`` (as ``--conf`` options, as pyspark passes them)
    and return pyspark's gateway to it."""
    from pyspark.find_spark_home import _find_spark_home
    from pyspark.java_gateway import launch_gateway as connect
    from pyspark.serializers import UTF8Deserializer, read_int

    command = [os.path.join(_find_spark_home(), "bin", "spark-submit")]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    command += shlex.split(os.environ.get("PYSPARK_SUBMIT_ARGS", "pyspark-shell"))
    info_dir = tempfile.mkdtemp(prefix="headrace-gateway-")
    try:
        info_file = os.path.join(info_dir, "conn-info")
        env = {**os.environ, "_PYSPARK_DRIVER_CONN_INFO_PATH": info_file}
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, env=env, start_new_session=True)
        deadline = time.monotonic() + timeout
        while proc.poll() is None and not os.path.isfile(info_file) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not os.path.isfile(info_file):
            proc.kill()
            raise RuntimeError(f"the Spark JVM did not start (exit code {proc.poll()}); its output above says why")
        with open(info_file, "rb") as info:
            port = read_int(info)
            secret = UTF8Deserializer().loads(info)
    finally:
        shutil.rmtree(info_dir, ignore_errors=True)
    with _environ_lock:
        os.environ["PYSPARK_GATEWAY_PORT"], os.environ["PYSPARK_GATEWAY_SECRET"] = str(port), secret
        try:
            gateway = connect()
        finally:
            del os.environ["PYSPARK_GATEWAY_PORT"], os.environ["PYSPARK_GATEWAY_SECRET"]
    gateway.proc = proc  # the pipe to its stdin lives as long as the gateway: the JVM's lifeline
    return gateway
