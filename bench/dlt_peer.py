"""dlt's ``pg_replication`` verified source as a peer in bench/backlog.py, run in its own Python.

The source is not in the dlt wheel: it lives in github.com/dlt-hub/verified-sources (``sources/
pg_replication``). The bench takes a checkout's ``sources`` folder (``--dlt-sources``) and puts it on
the peer's PYTHONPATH; nothing of it is copied into this repository. Two variants drain the same
backlog, each from its own slot created beside headrace's: as shipped (``target_batch_size`` 1000,
dlt's default load files) and tuned (the whole backlog in one batch, Parquet load files).
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VARIANTS = {"shipped": "dict(target_batch_size=1000)", "tuned": "dict(target_batch_size=100_000_000)"}
FILE_FORMAT = {"shipped": "None", "tuned": "'parquet'"}

PREPARE = """
import sys
from pg_replication.helpers import init_replication
dsn, tables, slot = sys.argv[1], sys.argv[2].split(","), sys.argv[3]
init_replication(slot_name=slot, pub_name="bench_dlt", schema_name="backlog", table_names=tables,
                 credentials=dsn)
"""

DRAIN = """
import sys, time, dlt
from pg_replication import replication_resource
dsn, slot, out = sys.argv[1], sys.argv[2], sys.argv[3]
started = time.monotonic()
pipe = dlt.pipeline(pipeline_name=slot, destination=dlt.destinations.duckdb(out + "/" + slot + ".duckdb"),
                    dataset_name="backlog", pipelines_dir=out + "/dlt-pipelines")
retries = 0
while True:  # each batch opens a new replication connection; the last one's walsender may still hold the slot
    try:
        pipe.run(replication_resource(slot, "bench_dlt", credentials=dsn, **{options}), loader_file_format={fmt})
        break
    except Exception as exc:
        if "is active for PID" not in str(exc) or retries >= 200:
            raise
        retries += 1
        time.sleep(0.5)
print(time.monotonic() - started, retries)
"""


@dataclass(frozen=True)
class DltPeer:
    """Where the peer runs: its Python, the verified sources, the server and a folder for its files."""

    python: str
    sources: str
    dsn: str
    work: Path

    def run(self, script: str, *args: str) -> str:
        env = {**os.environ, "PYTHONPATH": self.sources, "RUNTIME__LOG_LEVEL": "WARNING"}
        out = subprocess.run([self.python, "-c", script, *args], capture_output=True, text=True, env=env,
                             timeout=7200)
        if out.returncode != 0:
            raise RuntimeError(f"dlt peer failed ({self.python}, sources {self.sources}):\n{out.stderr[-3000:]}")
        return out.stdout


def dlt_prepare(python: str, sources: str | None, dsn: str, work: Path, tables: int,
                variants: list[str] | None = None) -> DltPeer:
    """Create each variant's slot now (before the backlog is written), as dlt's own helper does
    (``variants``: names from ``VARIANTS``; all of them by default)."""
    if not sources or not (Path(sources) / "pg_replication").is_dir():
        raise SystemExit(f"--dlt-sources must be the sources/ folder of a dlt-hub/verified-sources checkout"
                         f" (with pg_replication/ in it); got {sources!r}")
    peer = DltPeer(python, sources, dsn, work)
    names = ",".join(f"t{i}" for i in range(tables))
    unknown = set(variants or ()) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown dlt variant(s) {sorted(unknown)}: choose from {sorted(VARIANTS)}")
    for variant in variants or VARIANTS:
        peer.run(PREPARE, dsn, names, f"bench_dlt_{variant}")
    return peer


def dlt_drain(peer: DltPeer, changes: int, variants: list[str] | None = None) -> dict[str, Any]:
    """Each variant (all by default) drains its slot into DuckDB; seconds (process start included)
    and changes/s."""
    out: dict[str, Any] = {}
    for variant, options in VARIANTS.items():
        if variants is not None and variant not in variants:
            continue
        started = time.monotonic()
        try:
            printed = peer.run(DRAIN.format(options=options, fmt=FILE_FORMAT[variant]), peer.dsn,
                               f"bench_dlt_{variant}", str(peer.work))
        except RuntimeError as exc:  # the peer's failure is a result, not the end of the bench
            out[variant] = {"error": str(exc)[-500:]}
            continue
        seconds = time.monotonic() - started
        out[variant] = {"seconds": round(seconds, 1), "changes_per_s": round(changes / seconds),
                        "slot_busy_retries": int(printed.split()[-1])}
    return out
