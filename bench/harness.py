"""Shared harness of the end-to-end benches: `headrace run` as a child process, its events, and what
it costs (CPU and memory of the driver and Spark's JVM, read from /proc), plus the source-side probes
(WAL position, slot lag, staged backlog). Imported as a sibling module: run benches as `python bench/x.py`.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import yaml
from psycopg.rows import dict_row

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from headrace.config import load_config  # noqa: E402
from headrace.control.status import pipeline_status  # noqa: E402
from headrace.core.position import parse_lsn  # noqa: E402
from headrace.log.index import LogIndex  # noqa: E402
from headrace.source.postgres.throwaway import free_port  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


# -- the process tree's cost ---------------------------------------------------------------------
def tree_pids(pid: int) -> list[int]:
    """``pid`` and all its descendants (the JVM Spark starts)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as fh:
                    todo += [int(c) for c in fh.read().split()]
        except OSError:
            continue
    return out


def cpu_seconds(pids: list[int]) -> dict[int, float]:
    """utime + stime of each of ``pids`` (all its threads), seconds."""
    out = {}
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            out[p] = (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14, 15 of stat)
        except (OSError, IndexError):
            continue
    return out


def thread_cpu(pids: list[int]) -> collections.Counter[str]:
    """CPU seconds so far of every thread of ``pids``, by kind: the process's name and the thread's,
    digits folded (``java/C# CompilerThre``: the JIT; ``java/Executor task l``: Spark's tasks)."""
    out: collections.Counter[str] = collections.Counter()
    for pid in pids:
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
            process = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue  # the process ended
        for task in tasks:
            try:
                name = (task / "comm").read_text().strip()
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # the thread ended
            out[f"{process}/{re.sub(r'[0-9]+', '#', name)}"] += (int(fields[11]) + int(fields[12])) / TICK
    return out


def cpu_used(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds the tree used between two samples: per process alive at both, its growth; a
    process started meanwhile, all of it (one that ended meanwhile is left out: a small undercount)."""
    return sum(t - before.get(p, 0.0) for p, t in after.items())


def tree_rss_mib(pid: int, children: bool = True) -> float:
    """Resident memory of ``pid`` and (with ``children``) all its descendants (Spark's JVM), MiB."""
    total = 0
    for p in tree_pids(pid) if children else [pid]:
        try:
            with open(f"/proc/{p}/status") as fh:
                total += next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            continue
    return total / 1024


def load_average() -> float:
    """The 1-minute load average (the machine is shared: every result notes it)."""
    return round(os.getloadavg()[0], 2)


# -- the source side -----------------------------------------------------------------------------
def insert_lsn(conn: psycopg.Connection[Any]) -> int:
    """The WAL insert position (under asynchronous commit the flush position lags behind it)."""
    return parse_lsn(conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])  # type: ignore[index]


def slot_lag_mib(dsn: str, slot: str) -> float | None:
    """WAL the slot holds back (current WAL - confirmed_flush_lsn), MiB; None when the server is down."""
    try:
        with psycopg.connect(dsn, connect_timeout=2) as conn:
            row = conn.execute("SELECT pg_current_wal_lsn() - confirmed_flush_lsn FROM pg_replication_slots"
                               " WHERE slot_name = %s", (slot,)).fetchone()
    except psycopg.OperationalError:
        return None
    return float(row[0]) / 2**20 if row and row[0] is not None else None


def staged_mib(path: Path) -> float:
    """Bytes of staged Parquet files on disk (applied ones go when staging GC runs), MiB."""
    return sum(f.stat().st_size for f in path.rglob("*.parquet") if f.exists()) / 2**20


def pending_staged(dsn: str, pipeline: str) -> tuple[int, int]:
    """Staged changes (rows, bytes) registered but not yet applied, from headrace's own log index."""
    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        try:
            return LogIndex(lambda: conn, pipeline).pending_totals()
        except psycopg.errors.UndefinedTable:
            return 0, 0


def caught_up(config: Path, lsn: int) -> bool:
    """headrace captured past ``lsn`` and every table streams with nothing staged left to apply."""
    try:
        status = pipeline_status(load_config(config))
    except psycopg.Error:
        return False
    return "captured_lsn" in status and parse_lsn(status["captured_lsn"]) >= lsn and all(
        t["state"] == "STREAMING" and t["pending_changes"] == 0 for t in status["tables"])


def table_states(dsn: str, pipeline: str) -> dict[str, tuple[str, int | None]]:
    """Each table's (state, applied_lsn) from ``_headrace.tables`` (empty before headrace made it)."""
    try:
        with psycopg.connect(dsn) as conn:
            rows = conn.execute("SELECT schema_name || '.' || table_name, state, applied_lsn FROM _headrace.tables"
                                " WHERE pipeline = %s", (pipeline,)).fetchall()
    except psycopg.Error:
        return {}
    return {r[0]: (r[1], r[2]) for r in rows}


# -- headrace as a child process ------------------------------------------------------------------
def target_config(kind: str, work: Path, root: str | None = None) -> dict[str, Any]:
    """The ``target:`` section for ``kind`` (iceberg or ducklake) with its files under ``work``, or
    under ``root`` (``s3://bucket``: the warehouse or data path; a DuckLake's catalog file stays in ``work``)."""
    files = root or str(work)
    if kind == "iceberg":
        return {"iceberg": {"warehouse": f"{files}/warehouse"}}
    return {"ducklake": {"catalog": str(work / "lake.ducklake"), "data_path": f"{files}/lake" + ("/" if root else "")}}


class ObjectStore:
    """A throwaway S3-compatible store for the benches (``moto_server`` on loopback, in memory: the
    tests' store; no network or disk in between, so a ratio against local disk shows the clients'
    costs, not a real store's latency). While open, the standard AWS variables of this process (and
    of the ``headrace run`` children it starts) point at it: all a config of ``s3://`` paths needs."""

    KEY_ID, SECRET = "bench", "bench-secret"

    def __init__(self, work: Path) -> None:
        from headrace.storage.throwaway import ThrowawayObjectStore

        self._store = ThrowawayObjectStore(work / "objectstore")
        self._saved = {name: os.environ.get(name) for name in self._variables()}
        os.environ.update(self._variables())
        self._buckets = 0

    def _variables(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": self.KEY_ID, "AWS_SECRET_ACCESS_KEY": self.SECRET, "AWS_REGION": "us-east-1",
                "AWS_ENDPOINT_URL": self._store.endpoint}

    def new_root(self, name: str) -> str:
        """A fresh bucket named after ``name``: its ``s3://`` root."""
        self._buckets += 1
        bucket = f"{name.replace('_', '-').lower()[:50]}-{self._buckets}"
        self._store.create_bucket(bucket, self.KEY_ID, self.SECRET)
        return f"s3://{bucket}"

    @property
    def pid(self) -> int:
        """The store's server process (its CPU is the bench machine's too)."""
        return self._store.proc.pid

    def requests(self) -> int:
        """Requests the store has answered so far (the lines of its access log)."""
        with self._store.log_path.open() as log:
            return sum(1 for line in log if '" ' in line and "HTTP/1.1" in line)

    def close(self) -> None:
        self._store.stop()
        for name, value in self._saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    def __enter__(self) -> ObjectStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_config(work: Path, name: str, dsn: str, source: dict[str, Any], kind: str,
                 **sections: dict[str, Any]) -> Path:
    """A pipeline YAML for ``headrace run`` (``local[2]``, its own API port); ``sections`` override."""
    raw: dict[str, Any] = {"name": name, "source": {"dsn": dsn, **source}, "target": target_config(kind, work),
                           "staging": {"path": str(work / "staging")}, "spark": {"master": "local[2]"},
                           "api": {"listen": f"127.0.0.1:{free_port()}"}}
    for key, value in sections.items():
        raw[key] = {**raw.get(key, {}), **value}
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@dataclass(frozen=True)
class BatchEvent:
    """One ``apply.batch`` event of the child's log: the target committed ``table`` up to ``applied_lsn``."""

    at: float  # wall clock (time.time()) of the log line
    table: str
    applied_lsn: int
    rows: int
    seconds: float


class Headrace:
    """``headrace run`` as a child process in its own session (SIGKILL takes the JVM with it), logging
    JSON lines to ``log`` so the benches read its events."""

    def __init__(self, config: Path, log: Path) -> None:
        self.config, self.log = config, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *args: str) -> None:
        """Start ``headrace run -c config *args`` (e.g. ``--until-caught-up``)."""
        env = {**os.environ, "HEADRACE_LOG_FORMAT": "json", "PYTHONPATH": str(ROOT)}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "headrace.cli", "run", "-c", str(self.config), *args],
                                         stdout=out, stderr=out, start_new_session=True, cwd=ROOT, env=env)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def check_alive(self) -> None:
        """Raise when the child has exited (a bench must not wait on a dead pipeline)."""
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"headrace exited with {self.proc.returncode}: see {self.log}")

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def kill9(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> int:
        """SIGTERM and wait (SIGKILL to the group after two minutes)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.kill9()
            return -9

    def events(self, name: str) -> list[dict[str, Any]]:
        """Every event called ``name`` in the log so far (JSON lines; other lines are skipped)."""
        out = []
        with self.log.open(errors="replace") as fh:
            for line in fh:
                if f'"{name}"' not in line:
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if record.get("event") == name:
                    out.append(record)
        return out

    def batches(self) -> list[BatchEvent]:
        """The ``apply.batch`` events so far, in log order."""
        return [BatchEvent(parse_ts(e["ts"]), e["table"], parse_lsn(e["applied_lsn"]), int(e["rows"]),
                           float(e["seconds"])) for e in self.events("apply.batch")]

    def wait_streaming(self, dsn: str, pipeline: str, tables: int, timeout: float = 1800) -> float:
        """Wait until ``tables`` tables are STREAMING; seconds waited."""
        return wait_for(lambda: _all_streaming(dsn, pipeline, tables), timeout, f"{tables} tables STREAMING",
                        self.check_alive)


def _all_streaming(dsn: str, pipeline: str, tables: int) -> bool:
    got = table_states(dsn, pipeline)
    return len(got) == tables and all(state == "STREAMING" for state, _ in got.values())


def parse_ts(ts: str) -> float:
    """A log line's ``ts`` (``2026-11-23T23:50:01.123Z``, UTC) as a time.time() value."""
    import calendar

    whole, ms = ts.rstrip("Z").split(".")
    return calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) + int(ms) / 1000


def wait_for(predicate: Callable[[], bool], timeout: float, what: str,
             check: Callable[[], None] | None = None, poll: float = 0.5) -> float:
    """Poll ``predicate`` until true; seconds waited. ``check`` raises to stop early (a dead child)."""
    start = time.monotonic()
    while not predicate():
        if check is not None:
            check()
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"waited {timeout:.0f} s for {what}")
        time.sleep(poll)
    return time.monotonic() - start


# -- sampling over time --------------------------------------------------------------------------
@dataclass
class Sampler:
    """Samples the child's CPU (% of one core since the previous sample) and RSS every ``every`` seconds
    in a thread, plus whatever ``extra`` returns (e.g. slot lag, staged backlog)."""

    pid: int
    every: float = 2.0
    extra: Callable[[], dict[str, Any]] | None = None
    samples: list[dict[str, Any]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[dict[str, Any]]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self.samples

    def _run(self) -> None:
        start = time.monotonic()
        before, t_before = cpu_seconds(tree_pids(self.pid)), start
        while not self._stop.wait(self.every):
            now, after = time.monotonic(), cpu_seconds(tree_pids(self.pid))
            sample = {"t": round(now - start, 2), "core_pct": round(100 * cpu_used(before, after) / (now - t_before), 1),
                      "rss_mib": round(tree_rss_mib(self.pid)), "driver_rss_mib": round(tree_rss_mib(self.pid, False))}
            if self.extra is not None:
                sample.update(self.extra())
            self.samples.append(sample)
            before, t_before = after, now

    def summary(self) -> dict[str, float]:
        """Mean CPU (% of one core) and peak RSS over the samples."""
        if not self.samples:
            return {}
        return {"cpu_core_pct_mean": round(sum(s["core_pct"] for s in self.samples) / len(self.samples), 1),
                "rss_mib_peak": max(s["rss_mib"] for s in self.samples),
                "driver_rss_mib_peak": max(s["driver_rss_mib"] for s in self.samples)}


def pct(values: list[float], p: float) -> float:
    """The ``p``-th percentile (nearest rank) of ``values``; NaN when empty."""
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, png: str | Path, *axes: Any, legend: bool = True) -> None:
    """Grid (and legend) on ``axes``, then the figure written as a PNG: every bench's plots look alike."""
    for ax in axes:
        ax.grid(alpha=.3)
        if legend:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def compare_with_source(config: Path, dsn: str, checks: dict[str, str]) -> dict[str, Any]:
    """Per table (``schema.table``), ``SELECT <expressions>`` on the source and on the target read by
    DuckDB (iceberg_scan of the current metadata file, or the DuckLake attached): equal or not.

    ``checks`` maps a table to SQL expressions both engines spell alike, e.g. ``count(*), sum(v)``.
    A bench must not report a speed bought with lost rows.
    """
    from headrace import storage
    from headrace.readers import duckdb_with, iceberg_metadata_location
    from headrace.readers import ducklake as attach_ducklake

    settings = load_config(config).target
    out: dict[str, Any] = {}
    if settings.kind == "iceberg":
        con = duckdb_with("avro", "iceberg")
        if storage.is_object_store(settings.settings.warehouse):
            storage.access().create_duckdb_secret(con)  # httpfs (from its wheel) and the store's secret
    else:
        con = attach_ducklake(settings.settings)
    try:
        with psycopg.connect(dsn) as conn:
            for table, exprs in checks.items():
                schema, name = table.split(".")
                source = conn.execute(f"SELECT {exprs} FROM {table}").fetchone()
                relation = (f"iceberg_scan('{iceberg_metadata_location(settings.settings, schema, name)}')"
                            if settings.kind == "iceberg" else f"lake.{schema}.{name}")
                target = con.execute(f"SELECT {exprs} FROM {relation}").fetchone()
                out[table] = {"equal": [int(v or 0) for v in source or ()] == [int(v or 0) for v in target or ()],
                              "source": [int(v or 0) for v in source or ()], "target": [int(v or 0) for v in target or ()]}
    finally:
        con.close()
    return out
