"""The ways bench/initial_copy.py copies one table, each returning a ``Measurement``.

Raw binary COPY read by psql (the physical limit), the chunk read alone in this process, ``headrace
run --until-caught-up`` into Iceberg or DuckLake at a given Spark master, and dlt's ``sql_database``
into DuckDB with its pyarrow or connectorx backend (in its own virtualenv). Also the table's load and
the disk-space check that comes before it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psycopg
import yaml
from harness import compare_with_source

ROOT = Path(__file__).resolve().parents[1]
DLT_VENV = ROOT / "bench" / ".venv-dlt"
DLT_REQUIREMENTS = ROOT / "bench" / "dlt-requirements.txt"

COLUMNS = ("id bigint NOT NULL, customer integer, amount numeric(12,2), status text, created timestamptz, "
           "note text, flag boolean, ratio double precision")
ROWS_SQL = """
INSERT INTO {table}
SELECT g, g % 100000, (g % 10000) / 100.0, (ARRAY['new','paid','shipped','cancelled'])[1 + g % 4],
       '2024-01-01'::timestamptz + g * interval '1 second', md5(g::text) || '-' || (g % 997),
       g % 3 = 0, g / 7.0
FROM generate_series(1, {rows}) g
"""
# Bytes a row takes on disk, measured (2M rows): heap 114, primary key 22; what the copies write
# (Parquet, DuckDB) stays under 70 a row even with dlt's load files beside its DuckDB file. Only one
# method's output exists at a time: each is removed once measured.
SOURCE_BYTES_PER_ROW = 140
OUTPUT_BYTES_PER_ROW = 100
WAL_ALLOWANCE = 5 * 2**30  # the throwaway server's max_wal_size (4 GB) and some


class MethodFailed(Exception):
    """One method could not copy (or lost rows): recorded as that method's result, the bench goes on."""


@dataclass
class Measurement:
    """One method's copy of one table: wall seconds, and what it read back where it can."""

    method: str  # stable key: raw_copy, read_binary, read_csv, headrace_iceberg, dlt_pyarrow, ...
    label: str
    seconds: float
    master: str | None = None  # headrace's spark.master
    rows_read_back: int | None = None  # rows found at the target; None where there is no target
    end_to_end: bool = True  # False: a component figure (the chunk read alone)
    detail: dict[str, Any] = field(default_factory=dict)


def table_name(rows: int) -> str:
    """Each size gets its own table (and so its own headrace pipelines and dlt tables)."""
    return f"bench_copy_{rows}"


def disk_needed(rows: int) -> int:
    """Bytes one size needs at its peak: the table and its key, the WAL of its load, one copy."""
    return rows * (SOURCE_BYTES_PER_ROW + OUTPUT_BYTES_PER_ROW) + WAL_ALLOWANCE


def check_disk(work: Path, rows: int) -> None:
    """Refuse, before anything is loaded, a size the work folder's file system cannot hold."""
    free = shutil.disk_usage(work).free
    need = disk_needed(rows)
    if free < need:
        raise SystemExit(
            f"not enough disk for {rows:,} rows: about {need / 2**30:.1f} GiB needed (table, its load's WAL "
            f"and one copy at a time), {free / 2**30:.1f} GiB free under {work}: free space, give --work-dir "
            f"on a bigger file system, or leave {rows:,} out of --rows")


def load_table(dsn: str, rows: int) -> tuple[int, float]:
    """Create and fill the size's table (a normal, logged table); its heap bytes and the load seconds.

    One ``INSERT ... SELECT generate_series`` keeps the heap in key order (as a table filled by a
    serial key is), which a key-range reader such as connectorx's partitions relies on; the primary
    key is built afterwards, which is faster than maintaining it row by row.
    """
    table = table_name(rows)
    started = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(f"CREATE TABLE {table} ({COLUMNS})")
        conn.execute(ROWS_SQL.format(table=table, rows=rows))  # type: ignore[arg-type]
        conn.execute("SET maintenance_work_mem = '1GB'")
        conn.execute(f"ALTER TABLE {table} ADD PRIMARY KEY (id)")
        conn.execute(f"VACUUM ANALYZE {table}")  # hint bits and visibility map set before any reader
        size = conn.execute("SELECT pg_table_size(%s::regclass)", (table,)).fetchone()[0]  # type: ignore[index]
    return int(size), time.monotonic() - started


def drop_table(dsn: str, rows: int) -> None:
    """Free the size's disk once every method has copied it."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table_name(rows)}")
        conn.execute("CHECKPOINT")  # lets the server recycle the load's WAL before the next size


def raw_copy(dsn: str, rows: int) -> Measurement:
    """``COPY ... TO STDOUT (FORMAT binary)`` read by psql into /dev/null: what the server can send."""
    started = time.monotonic()
    subprocess.run(["psql", dsn, "-qAt", "-c", f"COPY {table_name(rows)} TO STDOUT (FORMAT binary)"],
                   check=True, stdout=subprocess.DEVNULL)
    return Measurement("raw_copy", "raw `COPY ... TO STDOUT (FORMAT binary)` → psql → /dev/null",
                       time.monotonic() - started)


def chunk_reads(dsn: str, rows: int) -> list[Measurement]:
    """The whole table read as one chunk in this process, by the CSV path and by the binary path.

    CPU seconds (this process, all threads) are kept beside wall seconds: pyarrow's CSV parse is
    multi-threaded, so its wall time alone flatters it on an idle machine.
    """
    from headrace.source.postgres.binary_copy import copy_chunk_binary
    from headrace.source.postgres.catalog import read_table_schema
    from headrace.source.postgres.copy import OPEN_END, copy_chunk

    with psycopg.connect(dsn, autocommit=True) as conn:
        oid = conn.execute("SELECT %s::regclass::oid", (table_name(rows),)).fetchone()[0]  # type: ignore[index]
        table = read_table_schema(conn, oid)
    out = []
    for name, read, label in (
            ("csv", copy_chunk, "chunk read alone: CSV + pyarrow parse (in-process)"),
            ("binary", copy_chunk_binary, "chunk read alone: binary COPY → typed Arrow (headrace._copy_binary)")):
        t0, c0 = time.monotonic(), time.process_time()
        got = sum(b.num_rows for b in read(dsn, None, table, 0, OPEN_END))
        out.append(Measurement(f"read_{name}", label, time.monotonic() - t0, rows_read_back=got,
                               end_to_end=False, detail={"cpu_s": round(time.process_time() - c0, 2)}))
    return out


def slot_safe(master: str) -> str:
    """``local[2]`` → ``local2``, ``local[*]`` → ``localall``: part of a pipeline (and slot) name."""
    return re.sub(r"[^a-z0-9]", "", master.lower().replace("*", "all"))


def headrace_copy(dsn: str, work: Path, rows: int, target: str, master: str, binary: bool,
                  snapshot: dict[str, Any]) -> Measurement:
    """``headrace run --until-caught-up`` from process start: what a user waits for. The copy alone is
    taken from the run's ``snapshot.done`` event; the rows are read back from the target by DuckDB."""
    name = f"copy_{target}_{rows}_{slot_safe(master)}" + ("" if binary else "_csv")  # own state and slot
    folder = work / name
    folder.mkdir()
    target_cfg: dict[str, Any] = (
        {"iceberg": {"warehouse": str(folder / "wh")}} if target == "iceberg"
        else {"ducklake": {"catalog": str(folder / "meta.ducklake"), "data_path": str(folder / "data")}})
    config = {"name": name, "source": {"dsn": dsn, "tables": [f"public.{table_name(rows)}"]},
              "target": target_cfg, "staging": {"path": str(folder / "staging")},
              "api": {"listen": "127.0.0.1:0"}, "spark": {"master": master},
              "snapshot": {**snapshot, "binary_copy": binary}}
    path = folder / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    log = folder / "run.log"
    launched, started = time.time(), time.monotonic()
    with open(log, "w") as run_log:
        done = subprocess.run([sys.executable, "-m", "headrace.cli", "run", "-c", str(path),
                               "--until-caught-up"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=run_log,
                              env={**os.environ, "HEADRACE_LOG_FORMAT": "json"})
    seconds = time.monotonic() - started
    drop_slot(dsn, f"headrace_{name}")  # an inactive slot left behind would hold WAL for the whole run
    if done.returncode != 0:
        tail = " ".join(line.strip() for line in log.read_text().splitlines()[-6:])[-1500:]
        raise MethodFailed(f"headrace run into {target} ({master}) failed (exit code {done.returncode}): {tail} "
                           f"(its log: {log}, kept)")
    events = read_events(log)
    copied = next((e for e in events if e.get("event") == "snapshot.done"), {})
    try:
        checked = compare_with_source(path, dsn, {f"public.{table_name(rows)}": "count(*), sum(id)"})
    except Exception as exc:  # the read-back failing is this method's failure, not the whole run's
        raise MethodFailed(f"reading headrace → {target} ({master}) back with DuckDB failed: {exc}; outputs "
                           f"kept in {folder}") from exc
    seen = next(iter(checked.values()))
    if not seen["equal"]:
        raise MethodFailed(f"headrace → {target} ({master}) lost or duplicated rows: source count, sum(id) "
                           f"{seen['source']}, target {seen['target']}; outputs kept in {folder}")
    output = folder_bytes(folder)
    shutil.rmtree(folder)  # the disk for the next method
    label = f"headrace → {'Iceberg' if target == 'iceberg' else 'DuckLake'}{'' if binary else ' (CSV read)'}"
    return Measurement(f"headrace_{target}" + ("" if binary else "_csv"), label, seconds, master=master,
                       rows_read_back=seen["target"][0],
                       detail={"copy_s": copied.get("seconds"), "startup_s": startup_seconds(events),
                               "process_start_s": process_start_seconds(events, launched),
                               "timeline": copy_timeline(events, launched),
                               "output_mb": round(output / 2**20, 1)})


def drop_slot(dsn: str, slot: str) -> None:
    """Drop a run's replication slot if it made one."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                     "WHERE slot_name = %s", (slot,))


def folder_bytes(folder: Path) -> int:
    """Bytes of the files under ``folder``: what a copy wrote (target files, catalog, staging, logs)."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def read_events(log: Path) -> list[dict[str, Any]]:
    """The JSON events of a headrace run's log (other lines, e.g. the JVM's, skipped)."""
    events = []
    for line in log.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return [e for e in events if isinstance(e, dict) and "event" in e]


def event_time(event: dict[str, Any]) -> float:
    """An event's ``ts`` (UTC, milliseconds) as a POSIX timestamp."""
    return datetime.strptime(event["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()


def process_start_seconds(events: list[dict[str, Any]], launched: float) -> float | None:
    """From the process's launch to its ``run.start`` event: Python, imports, the config."""
    start = next((e for e in events if e["event"] == "run.start"), None)
    return round(event_time(start) - launched, 2) if start else None


def copy_timeline(events: list[dict[str, Any]], launched: float) -> dict[str, Any]:
    """Seconds from the process's launch to each step of the copy (the first of each event), and how
    many chunk groups the driver's threads and Spark's jobs copied (``snapshot.progress``'s lane)."""
    steps = ("run.start", "snapshot.exported", "snapshot.start", "spark.started", "spark.warm", "snapshot.progress",
             "snapshot.done", "table.streaming")
    out: dict[str, Any] = {}
    for e in events:
        if e["event"] in steps and e["event"] not in out:
            out[e["event"]] = round(event_time(e) - launched, 2)
    lanes = [e.get("lane") for e in events if e["event"] == "snapshot.progress"]
    out["driver_groups"], out["spark_groups"] = lanes.count("driver"), lanes.count("spark")
    return out


def startup_seconds(events: list[dict[str, Any]]) -> float | None:
    """From ``run.start`` to the first ``snapshot.start``: Spark start, slot, exported snapshot."""
    start = next((e for e in events if e["event"] == "run.start"), None)
    first = next((e for e in events if e["event"] == "snapshot.start"), None)
    return round(event_time(first) - event_time(start), 2) if start and first else None


def dlt_python() -> Path:
    """dlt's own virtualenv (bench/.venv-dlt), made from the pinned requirements when missing or stale."""
    python = DLT_VENV / "bin" / "python"
    stamp = DLT_VENV / "requirements.txt"
    wanted = DLT_REQUIREMENTS.read_text()
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    print(f"installing dlt into {DLT_VENV} (pinned in {DLT_REQUIREMENTS.name}; once)...", file=sys.stderr,
          flush=True)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(DLT_VENV)], check=True)
    try:
        subprocess.run([str(python), "-m", "pip", "install", "-q", "-r", str(DLT_REQUIREMENTS)], check=True,
                       timeout=1800)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        raise SystemExit(f"cannot install dlt into {DLT_VENV} ({exc}): check PyPI access, or run with "
                         "--skip-dlt") from exc
    stamp.write_text(wanted)
    return python


def dlt_copy(python: Path, dsn: str, work: Path, rows: int, backend: str) -> Measurement:
    """dlt's ``sql_database`` (``backend``) into DuckDB, wall seconds of its process (Python start and
    imports included, as headrace's are); the settings and dlt's own stage times are in ``detail``."""
    folder = work / f"dlt_{backend}_{rows}"
    folder.mkdir()
    started = time.monotonic()
    done = subprocess.run([str(python), str(ROOT / "bench" / "dlt_copy.py"), dsn, table_name(rows),
                           str(folder), backend, str(os.cpu_count() or 1)], capture_output=True, text=True)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise MethodFailed(f"dlt ({backend}) failed with exit code {done.returncode}; outputs kept in "
                           f"{folder}:\n{done.stderr[-3000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if report["rows"] != rows:
        raise MethodFailed(f"dlt ({backend}) read back {report['rows']:,} rows of {rows:,}; outputs kept "
                           f"in {folder}")
    output = folder_bytes(folder)
    shutil.rmtree(folder)
    return Measurement(f"dlt_{backend}", f"dlt `sql_database` ({backend} backend) → DuckDB", seconds,
                       rows_read_back=report["rows"],
                       detail={**{k: report[k] for k in ("pipeline_s", "stages", "settings", "types")},
                               "output_mb": round(output / 2**20, 1)})
