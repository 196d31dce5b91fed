"""A real S3-compatible server for tests: ``moto_server`` (PyPI ``moto[server]``) in a subprocess on a
free loopback port, in memory. It is the one server that Spark's S3A, pyarrow, pyiceberg and DuckDB's
httpfs all worked against here (docs/architecture.md). Every test gets its own bucket.

``TcpCut`` is a TCP proxy in front of it whose forwarding can be stopped (connections hang, no
answer) and resumed: an object store that goes away under load.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import select
import socket
import subprocess
import threading
from typing import Any

from headrace.storage.throwaway import ThrowawayObjectStore

KEY_ID = "headrace-test-key"
SECRET = "headrace-test-secret-3f9c1e"  # the redaction tests look for this in logs, status, metrics
_buckets = itertools.count()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class MotoServer(ThrowawayObjectStore):
    """``moto_server -H 127.0.0.1 -p PORT`` started and stopped by a fixture, with boto3 at hand to
    make buckets and look at what is in them."""

    def client(self, endpoint: str | None = None, key_id: str = KEY_ID, secret: str = SECRET):  # type: ignore[no-untyped-def]
        import boto3

        return boto3.client("s3", endpoint_url=endpoint or self.endpoint, region_name="us-east-1",
                            aws_access_key_id=key_id, aws_secret_access_key=secret)

    def new_bucket(self, prefix: str = "hr") -> str:
        name = f"{prefix}-{os.getpid()}-{next(_buckets)}"
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]


def s3_environment(endpoint: str) -> dict[str, str]:
    """The standard AWS variables for the test server: all a config of ``s3://`` paths needs."""
    return {"AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": endpoint}


class TcpCut:
    """A TCP proxy on a free loopback port to ``target_port``; ``cut()`` stops forwarding (bytes are
    held, new connections accepted but not answered: a store that stopped answering), ``mend()``
    closes what was held up and forwards again."""

    def __init__(self, target_port: int) -> None:
        self.port = free_port()
        self._target = target_port
        self._open = threading.Event()
        self._open.set()
        self._stop = threading.Event()
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", self.port))
        self._thread = threading.Thread(target=self._accept, daemon=True, name="tcp-cut")
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut(self) -> None:
        self._open.clear()

    def mend(self) -> None:
        with self._lock:
            held, self._conns = self._conns, []
        for conn in held:  # what hung during the cut is dropped: clients see a reset and retry
            with contextlib.suppress(OSError):
                conn.close()
        self._open.set()

    def close(self) -> None:
        self._stop.set()
        self._server.close()
        self.mend()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._pipe, args=(client,), daemon=True).start()

    def _pipe(self, client: socket.socket) -> None:
        with self._lock:
            self._conns.append(client)
        try:
            upstream = socket.create_connection(("127.0.0.1", self._target))
        except OSError:
            client.close()
            return
        with self._lock:
            self._conns.append(upstream)
        ends = {client: upstream, upstream: client}
        try:
            while not self._stop.is_set():
                ready, _, _ = select.select(list(ends), [], [], 0.2)
                if not self._open.is_set():
                    continue  # cut: hold everything, answer nothing
                for end in ready:
                    data = end.recv(65536)
                    if not data:
                        return
                    ends[end].sendall(data)
        except (OSError, ValueError):  # ValueError: a socket the proxy closed meanwhile (fd -1)
            return
        finally:
            for end in ends:
                with contextlib.suppress(OSError):
                    end.close()


def stop_process(proc: subprocess.Popen[Any]) -> None:
    """A test server's process ended: terminated, killed after 10 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
