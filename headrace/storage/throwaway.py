"""A throwaway S3-compatible object store for ``headrace demo --storage s3``, the tests and the
benchmarks, as ``ThrowawayPostgres`` is for PostgreSQL: ``moto_server`` (PyPI ``moto[server]``, a
dev dependency that ``make demo`` installs) on a free loopback port, keeping its objects in memory.
It is the one server that Spark's S3A, pyarrow, pyiceberg and DuckDB's httpfs all worked against here.
A user's store (MinIO, S3, ...) is theirs; headrace only points ``storage.endpoint`` at it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import TracebackType

from headrace.core.errors import ConfigError
from headrace.core.ports import free_port

REGION = "us-east-1"


def moto_server_binary() -> str:
    """The ``moto_server`` command beside this Python (a virtualenv's bin), else on PATH."""
    found = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or shutil.which("moto_server")
    if not found:
        raise ConfigError("a local object store needs moto's S3 server and moto_server is not installed:"
                          " run make bootstrap, or pip install 'moto[server]>=5.2,<5.3'")
    return found


class ThrowawayObjectStore:
    """``moto_server -H 127.0.0.1 -p PORT``, started at construction, stopped by ``stop()`` (or on
    leaving a ``with``). Any key id and secret are accepted."""

    def __init__(self, log_dir: Path, env: dict[str, str] | None = None, timeout: float = 30.0) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"moto-{self.port}.log"
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen([moto_server_binary(), "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto_server did not start in {timeout:g} s (log {self.log_path})") from None
                time.sleep(0.1)

    def create_bucket(self, name: str, key_id: str, secret: str) -> None:
        """Create bucket ``name`` (through pyarrow, headrace's own S3 client: no boto3 needed)."""
        import pyarrow.fs as pafs

        fs = pafs.S3FileSystem(access_key=key_id, secret_key=secret, region=REGION, scheme="http",
                               endpoint_override=f"127.0.0.1:{self.port}", allow_bucket_creation=True)
        fs.create_dir(name)

    def stop(self) -> None:
        """Terminate the server (killed after 10 s); its objects are gone with it."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def __enter__(self) -> ThrowawayObjectStore:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
