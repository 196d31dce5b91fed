"""The many-small-tables case of bench/initial_copy.py: a schema of N small tables to STREAMING.

From process start until every table is STREAMING (``run --until-caught-up``), per target, with a
breakdown from the run's JSON log events (tables added, copy round, per-table copy seconds, the last
table's switch to streaming). The issue's goal: 200 tables of 1,000 rows within 30 s, both targets.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import yaml
from copy_methods import ROOT, event_time, read_events

GOAL_S = 30.0

SMALL_DDL = """
CREATE TABLE small.t{i} (id bigint PRIMARY KEY, customer integer, amount numeric(12,2), status text,
                         created timestamptz, note text);
INSERT INTO small.t{i} SELECT g, g % 1000, (g % 10000) / 100.0, (ARRAY['new','paid','shipped'])[1 + g % 3],
       '2024-01-01'::timestamptz + g * interval '1 second', md5(g::text) FROM generate_series(1, {rows}) g;
"""



def load_small_tables(dsn: str, tables: int, rows: int) -> float:
    """Create schema ``small`` with ``tables`` tables of ``rows`` rows; the seconds it took."""
    started = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA small")
        for i in range(tables):
            conn.execute(SMALL_DDL.format(i=i, rows=rows))  # type: ignore[arg-type]
        conn.execute("VACUUM ANALYZE")
    return time.monotonic() - started


def timed(cmd: list[str], **kw: Any) -> float:
    """Wall seconds of a command that must succeed."""
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, **kw)
    return time.monotonic() - t0


def small_tables(dsn: str, work: Path, target: str, master: str, tables: int, extra: dict[str, Any]
                 ) -> dict[str, Any]:
    """Start to every table STREAMING for the ``small`` schema, and where the time went (log events)."""
    folder = work / f"small-{target}"
    folder.mkdir()
    target_cfg: dict[str, Any] = (
        {"iceberg": {"warehouse": str(folder / "wh")}} if target == "iceberg"
        else {"ducklake": {"catalog": str(folder / "meta.ducklake"), "data_path": str(folder / "data")}}
    )
    name = f"small_{target}"
    config = {"name": name, "source": {"dsn": dsn, "schemas": ["small"]}, "target": target_cfg,
              "staging": {"path": str(folder / "staging")}, "api": {"listen": "127.0.0.1:0"},
              "spark": {"master": master}, **extra}
    path = folder / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    t0 = time.time()
    with open(folder / "run.log", "w") as run_log:
        seconds = timed([sys.executable, "-m", "headrace.cli", "run", "-c", str(path), "--until-caught-up"],
                        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=run_log,
                        env={**os.environ, "HEADRACE_LOG_FORMAT": "json"})
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (f"headrace_{name}",))
        streaming = conn.execute(
            "SELECT count(*) FILTER (WHERE state = 'STREAMING'), count(*) FROM _headrace.tables "
            "WHERE pipeline = %s", (name,)).fetchone()
    events = read_events(folder / "run.log")

    def at(ev: dict[str, Any]) -> float:
        return event_time(ev) - t0

    def first(name: str) -> float | None:
        return next((round(at(e), 2) for e in events if e["event"] == name), None)

    def last(name: str) -> float | None:
        times = [at(e) for e in events if e["event"] == name]
        return round(max(times), 2) if times else None

    per_table = sorted(e["seconds"] for e in events if e["event"] == "snapshot.done")
    out: dict[str, Any] = {
        "total_s": round(seconds, 2), "streaming": f"{streaming[0]}/{streaming[1]}" if streaming else None,
        "run_start_at": first("run.start"), "first_added_at": first("table.added"),
        "last_added_at": last("table.added"), "first_copy_start_at": first("snapshot.start"),
        "last_copy_done_at": last("snapshot.done"), "first_streaming_at": first("table.streaming"),
        "last_streaming_at": last("table.streaming"), "caught_up_at": first("run.caught_up"),
        "copied_tables": len(per_table)}
    if per_table:
        out["copy_table_s_median"] = per_table[len(per_table) // 2]
        out["copy_table_s_p90"] = per_table[int(len(per_table) * 0.9)]
        out["copy_table_s_sum"] = round(sum(per_table), 1)
    out["load_avg"] = [round(x, 2) for x in os.getloadavg()]
    if streaming and streaming[0] == streaming[1] == tables:
        shutil.rmtree(folder)  # kept (with its run.log) only when a table did not get there
    return out


def small_markdown(result: dict[str, Any]) -> str:
    """One line per target: seconds until every table is STREAMING, against the goal."""
    lines = [f"#### {result['tables']} tables of {result['rows_per_table']:,} rows, to every table STREAMING "
             f"(goal ≤ {GOAL_S:.0f} s; Spark {result['spark_master']})", "",
             "| target | seconds | streaming | first copy starts | last copy done "
             "| per-table copy median / p90 | load average |", "|---|---|---|---|---|---|---|"]
    for target in ("iceberg", "ducklake"):
        if (r := result.get(target)) is not None:
            lines.append(f"| {target} | {r['total_s']} | {r['streaming']} | {r['first_copy_start_at']} s | "
                         f"{r['last_copy_done_at']} s | {r.get('copy_table_s_median')} / "
                         f"{r.get('copy_table_s_p90')} s | {r['load_avg'][0]} |")
    return "\n".join(lines)
