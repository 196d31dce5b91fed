"""A throwaway MariaDB server for the tests and the benchmarks, started like ``ThrowawayPostgres``.

It uses the system's server binaries (``mariadb-install-db``, ``mariadbd``), a temporary data
directory and a free port on the loopback interface, with the binary log set up the way headrace
needs it (``SERVER_SETTINGS``). Two accounts: ``root`` (no password, for setting up tests) and
``repl`` (password ``repl``) with exactly the grants ``headrace check`` asks for.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from headrace.core.errors import ConfigError
from headrace.core.ports import free_port

# What replication from the binlog needs (checked by ``check.check_server``), then speed settings
# a throwaway server can afford (no fsync of the redo log or the binlog).
SERVER_SETTINGS = {
    "log_bin": "binlog",
    "binlog_format": "ROW",
    "binlog_row_image": "FULL",
    "binlog_row_metadata": "FULL",
    "server_id": "1",
    "expire_logs_days": "7",
    "character_set_server": "utf8mb4",
    "collation_server": "utf8mb4_unicode_ci",
    "innodb_flush_log_at_trx_commit": "2",
    "sync_binlog": "0",
    "innodb_buffer_pool_size": "64M",
    "innodb_log_file_size": "48M",
    "max_connections": "200",
    "skip_name_resolve": "ON",
    "performance_schema": "OFF",
}

REPL_USER, REPL_PASSWORD = "repl", "repl"  # noqa: S105 (a throwaway server's test account)


def find_mariadb_bin(name: str) -> str:
    """Locate a MariaDB binary (PATH, then /usr/sbin for the server)."""
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")
    if found:
        return found
    raise ConfigError(f"MariaDB binary {name!r} not found: install the server (`apt-get install mariadb-server`)"
                      " or give source.dsn of an existing server")


class ThrowawayMariaDB:
    """Start with ``start()``, stop and delete everything with ``stop()``; usable as a context."""

    def __init__(self, base_dir: str | None = None, settings: dict[str, str] | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="headrace-mariadb-", dir=base_dir))
        self.data = self.dir / "data"
        # A socket path must stay under 108 bytes: a deep base_dir (pytest's per-worker temp dirs)
        # would pass it, so the socket gets a short directory of its own.
        self._socket_dir = Path(tempfile.mkdtemp(prefix="hr-my-"))
        self.socket = self._socket_dir / "mysqld.sock"
        self.port = free_port()
        self.settings = {**SERVER_SETTINGS, **(settings or {})}
        self._proc: subprocess.Popen[bytes] | None = None
        # mariadbd refuses to run as root unless told to: a throwaway server may.
        self._user = "root" if os.geteuid() == 0 else None

    @property
    def dsn(self) -> str:
        """The replication account (``repl``) with no default database."""
        return self.dsn_for("")

    @property
    def root_dsn(self) -> str:
        """The administrator account (``root``, no password)."""
        return f"mysql://root@127.0.0.1:{self.port}/"

    def dsn_for(self, database: str) -> str:
        """The replication account with default database ``database``."""
        return f"mysql://{REPL_USER}:{REPL_PASSWORD}@127.0.0.1:{self.port}/{database}"

    def _config(self) -> Path:
        path = self.dir / "my.cnf"
        lines = ["[mariadbd]", f"datadir = {self.data}", f"socket = {self.socket}", f"port = {self.port}",
                 "bind_address = 127.0.0.1", f"log_error = {self.dir / 'server.log'}",
                 f"pid_file = {self.dir / 'mariadbd.pid'}",
                 # Its own temporary directory: two servers bootstrapping at once (parallel test
                 # workers) name their temporary tables alike in a shared /tmp and fail.
                 f"tmpdir = {self.dir / 'tmp'}"]
        lines += [f"{k} = {v}" for k, v in self.settings.items()]
        if self._user:
            lines.append(f"user = {self._user}")
        (self.dir / "tmp").mkdir(exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
        return path

    def start(self) -> ThrowawayMariaDB:
        """Create the data directory, start the server, wait until it accepts connections, add users."""
        config = self._config()
        install = [find_mariadb_bin("mariadb-install-db"), f"--defaults-file={config}", "--skip-test-db",
                   "--auth-root-authentication-method=normal", "--skip-name-resolve"]
        proc = subprocess.run(install, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed: {proc.stderr.strip() or proc.stdout.strip()}")
        self.start_server()
        try:
            self._add_users()
        except BaseException:
            self.stop()
            raise
        return self

    def _add_users(self) -> None:
        with contextlib.closing(self._socket_connection()) as conn, conn.cursor() as cur:
            for sql in (
                "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1'",
                "GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION",
                f"CREATE USER '{REPL_USER}'@'%' IDENTIFIED BY '{REPL_PASSWORD}'",
                f"GRANT SELECT, PROCESS, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO '{REPL_USER}'@'%'",
            ):
                cur.execute(sql)

    def start_server(self) -> None:
        """Start ``mariadbd`` on the existing data directory and wait until it accepts connections."""
        log = open(self.dir / "stdout.log", "ab")  # noqa: SIM115 (kept open for the child)
        self._proc = subprocess.Popen([find_mariadb_bin("mariadbd"), f"--defaults-file={self.dir / 'my.cnf'}"],
                                      stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + 60
        while True:
            try:
                self._socket_connection().close()
                return
            except Exception:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    tail = (self.dir / "server.log").read_text(errors="replace")[-2000:] \
                        if (self.dir / "server.log").exists() else ""
                    raise RuntimeError(f"mariadbd did not start: {tail}") from None
                time.sleep(0.1)

    def _socket_connection(self):  # type: ignore[no-untyped-def]
        import pymysql

        return pymysql.connect(unix_socket=str(self.socket), user="root", autocommit=True, connect_timeout=2)

    def stop_server(self) -> None:
        """A clean shutdown; the data stays."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            self._proc.wait(timeout=60)
        self._proc = None

    def crash(self) -> None:
        """``kill -9`` the server (recovery runs at the next ``start_server``)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGKILL)
            self._proc.wait(timeout=60)
        self._proc = None

    def replicate_from(self, primary: ThrowawayMariaDB) -> ThrowawayMariaDB:
        """Make this server a replica of ``primary`` by GTID (``MASTER_USE_GTID=slave_pos``), from
        ``primary``'s position now (each server created its own accounts). Start this server with its
        own ``server_id`` and ``log_slave_updates = ON`` for its binlog to hold what it replicates."""
        with contextlib.closing(primary._socket_connection()) as conn, conn.cursor() as cur:
            cur.execute("SELECT @@gtid_binlog_pos")
            position = cur.fetchone()[0]
        with contextlib.closing(self._socket_connection()) as conn, conn.cursor() as cur:
            cur.execute("SET GLOBAL gtid_slave_pos = %s", (position,))
            cur.execute(f"CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = {primary.port},"
                        f" MASTER_USER = '{REPL_USER}', MASTER_PASSWORD = '{REPL_PASSWORD}',"
                        " MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = 1")
            cur.execute("START SLAVE")
        return self

    def caught_up_with(self, primary: ThrowawayMariaDB) -> bool:
        """This replica has applied everything ``primary`` logged."""
        with contextlib.closing(primary._socket_connection()) as conn, conn.cursor() as cur:
            cur.execute("SELECT @@gtid_binlog_pos")
            logged = cur.fetchone()[0]
        with contextlib.closing(self._socket_connection()) as conn, conn.cursor() as cur:
            cur.execute("SELECT @@gtid_slave_pos")
            return bool(cur.fetchone()[0] == logged)

    def promote(self) -> None:
        """Stop replicating and forget the primary: this server takes writes of its own."""
        with contextlib.closing(self._socket_connection()) as conn, conn.cursor() as cur:
            cur.execute("STOP SLAVE")
            cur.execute("RESET SLAVE ALL")

    def create_database(self, name: str) -> str:
        """Create database ``name`` (utf8mb4) and return the replication account's DSN for it."""
        with contextlib.closing(self._socket_connection()) as conn, conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        return self.dsn_for(name)

    def drop_database(self, name: str) -> None:
        """Drop database ``name`` if it exists, ending the sessions using it first (a failed test may
        leave one in a transaction, whose metadata locks would block the drop)."""
        with contextlib.closing(self._socket_connection()) as conn, conn.cursor() as cur:
            cur.execute("SELECT id FROM information_schema.processlist WHERE db = %s AND id <> CONNECTION_ID()",
                        (name,))
            for (session,) in cur.fetchall():
                with contextlib.suppress(Exception):
                    cur.execute(f"KILL {int(session)}")
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")

    def stop(self) -> None:
        """Stop the server and delete its directory."""
        with contextlib.suppress(Exception):
            self.stop_server()
        shutil.rmtree(self.dir, ignore_errors=True)
        shutil.rmtree(self._socket_dir, ignore_errors=True)

    def __enter__(self) -> ThrowawayMariaDB:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
