"""Helpers for end-to-end tests: build a pipeline config, run it, compare target with source."""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import itertools
import os
import random
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import yaml

from headrace.capture.loop import Capture
from headrace.config import PipelineConfig, parse_config
from headrace.core.names import quote_spark
from headrace.core.schema import TableSchema, TypeKind
from headrace.pipeline import Pipeline
from headrace.source.postgres.catalog import read_table_schema
from headrace.source.postgres.copy import APPLICATION_NAME

_catalogs = itertools.count()
# HEADRACE_TEST_DUCKLAKE_CATALOG=sqlite runs every e2e test written for "ducklake" on a SQLite
# catalog instead of a DuckDB file: the whole behaviour suite on the other catalog kind, on demand
# (CI runs the SQLite catalog through the contract suite and the tests that name "ducklake-sqlite").
SQLITE_EVERYWHERE = os.environ.get("HEADRACE_TEST_DUCKLAKE_CATALOG") == "sqlite"

TEXT_KINDS = {TypeKind.STRING, TypeKind.UUID, TypeKind.JSON, TypeKind.INTERVAL, TypeKind.TIME}


Target = str | dict[str, Any]


def make_config(dsn: str, tmp: Path, tables: list[str], target: Target = "iceberg", **overrides: Any) -> PipelineConfig:
    """A pipeline writing under ``tmp``; each config gets its own Spark catalog name."""
    return parse_config(raw_config(dsn, tmp, tables, target, **overrides))


def raw_config(dsn: str, tmp: Path, tables: list[str], target: Target = "iceberg", **overrides: Any) -> dict[str, Any]:
    """``make_config``'s settings as the dict a YAML file holds (for ``headrace run`` subprocesses).

    ``target``: ``iceberg`` (Hadoop catalog), ``ducklake`` (DuckDB-file catalog), ``ducklake-sqlite``
    (SQLite catalog), or a whole ``target`` section.
    """
    if isinstance(target, dict):
        target_cfg: dict[str, Any] = target
    elif target == "iceberg":
        target_cfg = {"iceberg": {"warehouse": str(tmp / "warehouse"), "catalog_name": f"hr{next(_catalogs)}"}}
    elif target == "ducklake-sqlite" or (target == "ducklake" and SQLITE_EVERYWHERE):
        target_cfg = {"ducklake": {"catalog": f"sqlite:{tmp / 'lake' / 'meta.sqlite'}",
                                   "data_path": str(tmp / "lake" / "data")}}
    else:
        target_cfg = {"ducklake": {"catalog": str(tmp / "lake" / "meta.ducklake"),
                                   "data_path": str(tmp / "lake" / "data")}}
    raw: dict[str, Any] = {
        "name": "t",
        "source": {"dsn": dsn, "tables": tables},
        "target": target_cfg,
        "staging": {"path": str(tmp / "staging"), "flush_seconds": 0.3, "heartbeat_seconds": 1.0},
        "apply": {"idle_sleep_seconds": 0.1},
    }
    for key, value in overrides.items():
        raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value
    return raw


def _norm(value: Any) -> Any:
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.timezone.utc).replace(tzinfo=None)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, list):
        return [_norm(v) for v in value]
    if isinstance(value, float) and value != value:
        return "NaN"
    if isinstance(value, decimal.Decimal):
        return value.normalize() if value.is_finite() else str(value)
    return value


def source_rows(dsn: str, table: str) -> tuple[TableSchema, list[tuple[Any, ...]]]:
    """The source table's rows, sorted, with text-kept kinds read as PostgreSQL text."""
    with psycopg.connect(dsn) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        schema = read_table_schema(conn, table)
        exprs = []
        for col in schema.columns:
            quoted = '"' + col.name.replace('"', '""') + '"'
            kind = col.type.kind
            elem = col.type.element.kind if col.type.element else None
            if kind in TEXT_KINDS:
                # format() calls the output function, so char(n) keeps its padding (::text drops it)
                exprs.append(f"CASE WHEN {quoted} IS NOT NULL THEN format('%s', {quoted}) END")
            elif kind is TypeKind.LIST and elem in TEXT_KINDS:
                exprs.append(f"{quoted}::text[]")
            else:
                exprs.append(quoted)
        rows = conn.execute(f"SELECT {', '.join(exprs)} FROM {table}").fetchall()
    floats = {i for i, c in enumerate(schema.columns) if c.type.kind is TypeKind.FLOAT}
    out = [tuple(_norm(_float32(v) if i in floats and isinstance(v, float) else v) for i, v in enumerate(r))
           for r in rows]
    return schema, sorted(out, key=repr)


def _float32(value: float) -> float:
    """``real`` values as the float32 they are (psycopg widens the decimal text to a double)."""
    return float(struct.unpack("f", struct.pack("f", value))[0])


def target_rows(pipeline: Any, schema: TableSchema) -> list[tuple[Any, ...]]:
    """The target table's source columns, sorted and normalised like ``source_rows``."""
    df = pipeline.target.read_table(schema).select(*[quote_spark(c) for c in schema.column_names])
    out = []
    for row in df.collect():
        values = []
        for col, value in zip(schema.columns, row, strict=True):
            if col.type.kind is TypeKind.FLOAT and isinstance(value, float):
                value = _float32(value)
            if col.type.kind in TEXT_KINDS and value is not None and not isinstance(value, str):
                value = str(value)
            values.append(_norm(value))
        out.append(tuple(values))
    return sorted(out, key=repr)


def assert_same(pipeline: Any, dsn: str, table: str) -> int:
    """Assert target == source row by row; return the row count."""
    schema, expected = source_rows(dsn, table)
    actual = target_rows(pipeline, schema)
    if actual != expected:
        missing = [r for r in expected if r not in actual][:5]
        extra = [r for r in actual if r not in expected][:5]
        raise AssertionError(f"{table}: {len(expected)} source rows, {len(actual)} target rows;\n"
                             f"missing in target: {missing}\nunexpected in target: {extra}")
    return len(expected)


def run_command(raw: dict[str, Any], tmp: Path) -> list[str]:
    """Write ``raw`` to ``tmp/pipeline.yaml``; the ``headrace run`` command line for it."""
    path = tmp / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw))
    return [sys.executable, "-m", "headrace.cli", "run", "-c", str(path)]


def wait_until(condition: Callable[[], object], seconds: float, what: str, every: float = 0.1) -> None:
    """Poll ``condition`` until it is true; fail naming ``what`` after ``seconds``.

    A condition that raises AssertionError counts as not yet true (so ``assert_same`` can be polled).
    """
    deadline = time.monotonic() + seconds
    last: AssertionError | None = None
    while True:
        try:
            if condition():
                return
        except AssertionError as exc:
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} (after {seconds:g} s)") from last
        time.sleep(every)


def changes_in_flight(dsn: str, state: Any) -> Callable[[], bool]:
    """A ``wait_until`` condition: the source committed changes since this call and the staged log
    holds changes not applied yet (buffered, staged, being applied), the moment a fault is meant to
    hit. ``state`` is the pipeline's StateStore."""
    start = wal_insert_lsn(dsn)
    return lambda: wal_insert_lsn(dsn) > start and state.log_index.pending_totals()[0] > 0


def log_count(path: Path, text: str) -> Callable[[], int]:
    """How many times ``text`` (e.g. an event name) occurs in the log file at ``path`` so far."""
    return lambda: path.read_text().count(text) if path.exists() else 0


def kill_after_batches(cmd: list[str], log_path: Path, rng: random.Random, timeout: float = 180) -> None:
    """Run ``cmd`` (a ``headrace run``) logging to ``log_path`` and kill -9 it after its 1st or 2nd
    apply batch plus up to 1 s: a random moment of applying, whatever the machine's speed (a fixed
    delay could end in the JVM's start-up on a loaded machine)."""
    with log_path.open("w") as log, subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log) as proc:
        try:
            batches = rng.randint(1, 2)
            wait_until(lambda: log_count(log_path, "apply.batch ")() >= batches, timeout,
                       f"the run did not apply {batches} batches")
            time.sleep(rng.uniform(0, 1))  # the random part of the moment, not a wait
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)


def wal_insert_lsn(dsn: str) -> int:
    """The LSN after everything committed so far (the insert position: commits are asynchronous)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


def slot_position(dsn: str, slot: str) -> tuple[int | None, int]:
    """The slot's walsender pid (None when no one streams it) and its confirmed_flush_lsn."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT active_pid, confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots"
                           " WHERE slot_name = %s", (slot,)).fetchone()
    assert row is not None, f"slot {slot} is missing"
    return row[0], int(row[1])


@contextlib.contextmanager
def running(pipeline: Any) -> Iterator[threading.Event]:
    """Run ``pipeline`` in a thread (streaming, not until caught up) for the ``with`` block.

    Yields the stop event. Leaving the block stops the run and re-raises what it raised; a run
    that ended on its own before that fails the test.
    """
    stop = threading.Event()
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["code"] = pipeline.run(stop=stop)
        except BaseException as exc:  # surfaced below
            outcome["exc"] = exc

    thread = threading.Thread(target=target, name="pipeline-under-test")
    thread.start()
    try:
        yield stop
        assert thread.is_alive() or stop.is_set(), f"the pipeline stopped on its own: {outcome}"
    finally:
        stop.set()
        thread.join(120)
        if "exc" in outcome:  # shown even when the block itself failed first
            traceback.print_exception(outcome["exc"], file=sys.stderr)
    assert not thread.is_alive(), "the pipeline did not stop within 120 s"
    if "exc" in outcome:
        raise outcome["exc"]
    assert outcome["code"] == 0


def create_items_and_lines(dsn: str, rows: int) -> None:
    """The two tables ``test_crash_points._workload`` changes, with ``rows`` orders of two lines."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, v int, note text);"
                     "CREATE TABLE lines (order_id bigint, line int, qty int, PRIMARY KEY (order_id, line))")
        conn.execute("INSERT INTO items SELECT g, 0, repeat('x', 200) FROM generate_series(1, %s) g", (rows,))
        conn.execute("INSERT INTO lines SELECT g, l, l FROM generate_series(1, %s) g, generate_series(1, 2) l",
                     (rows,))


@contextlib.contextmanager
def workload(dsn: str, seed: int) -> Iterator[None]:
    """``test_crash_points._workload`` (inserts, updates, deletes, key changes over items and lines)
    running in a thread for the ``with`` block."""
    from tests.e2e.test_crash_points import _workload

    stop = threading.Event()
    writer = threading.Thread(target=_workload, args=(dsn, stop, seed), name="workload")
    writer.start()
    try:
        yield
    finally:
        stop.set()
        writer.join()


def capture_while(config: PipelineConfig, dsn: str, work: list[str], pause: float = 0.0, wait: bool = True) -> None:
    """Run capture only (nothing applied) while ``work`` statements commit one by one, ``pause``
    seconds apart; with ``wait``, until all their changes are registered (30 s at most)."""
    state = Pipeline(config).setup()
    capture = Capture(config, dsn, dsn, {r.oid: r.schema for r in state.tables()})
    stop = threading.Event()
    thread = threading.Thread(target=capture.run, args=(stop,))
    thread.start()
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement in work:
                conn.execute(statement)
                time.sleep(pause)
        end = wal_insert_lsn(dsn)
        deadline = time.monotonic() + 30
        while wait and capture.captured_lsn < end and time.monotonic() < deadline:
            capture.request_heartbeat()
            time.sleep(0.2)
        assert capture.captured_lsn >= end or not wait, "capture did not register the changes"
    finally:
        stop.set()
        thread.join(30)
        state.close()


# A copy session the source counts as held: in a statement or a transaction, or idle after a
# statement of the copy's own (a session just opened, its settings made). Not held: one idle after its
# ROLLBACK (released: the backend takes a while to see the close and exit, 20-30 ms on a loaded
# machine), nor the short connection ADBC's driver opens and closes before each session to read the
# server's type catalog (seen exiting, idle after a catalog query, the count went one over).
# (Its % are doubled: the queries it goes into take parameters.)
HELD = ("NOT (state = 'idle' AND (query = 'ROLLBACK' OR query NOT LIKE ALL (ARRAY['SET %%', 'BEGIN%%', 'COPY %%'])))"
        " AND state IS NOT NULL")


class Samples(list[int]):
    """Counts sampled over time; ``sessions``: the copy's sessions as the source saw them at the highest."""

    sessions: list[Any] | None = None
    highest = 0


@contextlib.contextmanager
def copy_connections(source_dsn: str) -> Iterator[Samples]:
    """While the block runs, sample every 5 ms the source connections a copy holds: its chunk reads
    and the session holding its exported snapshot. A read closes its connection right after its
    ROLLBACK and the backend takes a while to exit (shown idle after that ROLLBACK): released, not
    held, so not counted."""
    dbname = psycopg.conninfo.conninfo_to_dict(source_dsn)["dbname"]
    seen = Samples()
    done = threading.Event()

    def sample() -> None:
        with psycopg.connect(source_dsn, autocommit=True) as conn:
            while not done.is_set():
                seen.append(conn.execute(
                    "SELECT (SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND application_name = %s"
                    f" AND {HELD}) + (SELECT count(*) FROM"
                    " pg_replication_slots WHERE database = %s AND slot_name LIKE %s AND active)",
                    (dbname, APPLICATION_NAME, dbname, "%\\_copy")).fetchone()[0])  # type: ignore[index]
                if seen[-1] > seen.highest and seen[-1] >= 3:
                    seen.highest = seen[-1]
                    # What the connections were doing at the highest count yet, for a failure's message.
                    seen.sessions = conn.execute(
                        "SELECT pid, state, left(query, 50), now() - state_change FROM pg_stat_activity"
                        " WHERE datname = %s AND application_name = %s", (dbname, APPLICATION_NAME)).fetchall()
                done.wait(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        yield seen
    finally:
        done.set()
        sampler.join()


def batch_lanes(pipeline: Any) -> set[tuple[str, str]]:
    """The (build lane, apply lane) pairs of the batches ``pipeline`` applied, from its metrics."""
    lanes = set()
    for metric in pipeline.metrics.registry.collect():
        if metric.name == "headrace_apply_batches":
            for sample in metric.samples:
                if sample.name.endswith("_total") and sample.value:
                    lanes.add((sample.labels["build_lane"], sample.labels["apply_lane"]))
    return lanes


def assert_built_by_spark(pipeline: Any) -> None:
    """``engine: spark``: every batch the pipeline applied was built by Spark jobs, and there was one."""
    built = {build for build, _ in batch_lanes(pipeline)}
    assert built == {"spark"}, f"batches built by {built or 'nothing'}, expected spark only (engine: spark)"
