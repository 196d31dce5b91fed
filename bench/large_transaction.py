"""One huge transaction, streamed while in progress (pgoutput protocol 2) against sent at its commit
(protocol 1), into DuckLake and Iceberg: peak resident memory of headrace's process tree and the time
from the source's commit to the change visible in the target.

For each target and protocol, in the same run, on a fresh database of a throwaway PostgreSQL (the
server's defaults: ``logical_decoding_work_mem`` 64MB):
1. ``--rows`` rows are loaded, a pipeline (``headrace run``) copies them and streams;
2. a transaction inserts ``--rollback-rows`` rows and is rolled back;
3. one transaction updates every row (``UPDATE big SET v = v + 1``), and inside it a savepoint's
   insert of ``--savepoint-rows`` rows is rolled back; it commits;
4. visible: every staged row of the table applied (nothing pending) and its ``applied_lsn`` at the
   commit; also when the first batch of it was (``first_batch``: a table's batches become visible
   one by one) and when the pipeline's ``captured_lsn`` passed it (staged: registered);
5. peak RSS of the process tree (driver and Spark's JVM) from step 2 to visible, sampled every
   second; the target is compared with the source (count, sum of v) read back by DuckDB.

    .venv/bin/python bench/large_transaction.py --rows 1000000 --rollback-rows 400000
    .venv/bin/python bench/large_transaction.py --rows 5000000 --rollback-rows 2000000
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from harness import (
    ROOT,
    Headrace,
    Sampler,
    compare_with_source,
    insert_lsn,
    load_average,
    pending_staged,
    table_states,
    wait_for,
    write_config,
)

from headrace.source.postgres.throwaway import ThrowawayPostgres


def _captured(dsn: str, pipeline: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT captured_lsn FROM _headrace.pipeline_meta WHERE pipeline = %s",
                           (pipeline,)).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def _transactions(dsn: str, rows: int, rollback_rows: int, savepoint_rows: int) -> tuple[int, float]:
    """The rolled-back insert, then the big update with its savepoint; (WAL position before the
    commit, time.time() when the commit returned)."""
    with psycopg.connect(dsn) as conn:
        conn.execute("INSERT INTO big SELECT g, -1, 'rolled back' FROM generate_series(%s::bigint, %s::bigint) g",
                     (rows + 1, rows + rollback_rows))
        conn.rollback()
        conn.execute("UPDATE big SET v = v + 1")
        conn.execute("SAVEPOINT s")
        conn.execute("INSERT INTO big SELECT g, -2, 'savepoint' FROM generate_series(%s::bigint, %s::bigint) g",
                     (rows + 1, rows + savepoint_rows))
        conn.execute("ROLLBACK TO SAVEPOINT s")
        before = insert_lsn(conn)
        conn.commit()
        return before, time.time()


def run_one(server: ThrowawayPostgres, work: Path, target: str, protocol: int, args: argparse.Namespace) -> dict[str, Any]:
    name = f"big_{target}_v{protocol}"
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    dsn = server.dsn_for(name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE big (id bigint PRIMARY KEY, v int NOT NULL, note text)")
        conn.execute("INSERT INTO big SELECT g, 0, md5(g::text) FROM generate_series(1, %s::bigint) g", (args.rows,))
        conn.execute("VACUUM ANALYZE big")
        work_mem = conn.execute("SHOW logical_decoding_work_mem").fetchone()[0]  # type: ignore[index]
    folder = work / name
    folder.mkdir()
    apply = {} if args.driver_batch_rows is None else {"driver_batch_rows": args.driver_batch_rows}
    config = write_config(folder, name, dsn, {"tables": ["public.big"],
                                              "stream_transactions": protocol >= 2}, target, apply=apply)
    headrace = Headrace(config, folder / "run.log")
    headrace.start()
    result: dict[str, Any] = {"target": target, "protocol": protocol, "rows": args.rows,
                              "logical_decoding_work_mem": work_mem}
    try:
        result["copy_s"] = round(headrace.wait_streaming(dsn, name, 1), 1)
        sampler = Sampler(headrace.pid, every=1.0).start()
        load_before = load_average()
        started = time.time()
        before, committed = _transactions(dsn, args.rows, args.rollback_rows, args.savepoint_rows)
        result["transactions_s"] = round(committed - started, 1)
        seen: dict[str, float] = {}

        def visible() -> bool:
            now = time.time()
            if "staged" not in seen and _captured(dsn, name) > before:
                seen["staged"] = now
            applied = table_states(dsn, name).get("public.big", ("", None))[1]
            if "first" not in seen and applied is not None and int(applied) >= before:
                seen["first"] = now  # the first batch of the transaction's rows committed in the target
            return "first" in seen and "staged" in seen and pending_staged(dsn, name) == (0, 0)

        wait_for(visible, args.timeout, "the update visible in the target", headrace.check_alive, poll=0.2)
        result["visible_after_commit_s"] = round(time.time() - committed, 1)  # every row of it applied
        result["first_batch_after_commit_s"] = round(seen["first"] - committed, 1)
        result["staged_after_commit_s"] = round(seen["staged"] - committed, 1)
        result["apply_batches"] = [{k: b.get(k) for k in ("rows", "seconds", "build_lane", "apply_lane")}
                                   for b in headrace.events("apply.batch")]
        samples = sampler.stop()
        result.update(sampler.summary())
        result["load_average"] = [load_before, load_average()]
        result["samples"] = samples
    finally:
        headrace.stop()
    with psycopg.connect(dsn) as conn:  # what the server did: streamed (v2), or spilled to its disk (v1)
        row = conn.execute("SELECT stream_txns, stream_bytes, spill_txns, spill_bytes FROM pg_stat_replication_slots"
                           " WHERE slot_name = %s", (f"headrace_{name}",)).fetchone()
    result["server"] = dict(zip(("stream_txns", "stream_bytes", "spill_txns", "spill_bytes"), row or (), strict=False))
    # After the stop: a DuckDB file catalog takes one process at a time.
    result["check"] = compare_with_source(config, dsn, {"public.big": "count(*), sum(v)"})
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                     " WHERE database = current_database() AND NOT active")
    if args.keep_logs:
        Path(args.keep_logs).mkdir(parents=True, exist_ok=True)
        shutil.copy(folder / "run.log", Path(args.keep_logs) / f"{name}.log")
    shutil.rmtree(folder, ignore_errors=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--rollback-rows", type=int, default=2_000_000)
    ap.add_argument("--savepoint-rows", type=int, default=100_000)
    ap.add_argument("--targets", default="ducklake,iceberg")
    ap.add_argument("--protocols", default="2,1")
    ap.add_argument("--pg", type=int, default=15, help="the source's major version (15: Debian's, 18: the wheel's)")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--keep-logs", help="copy each run's log into this folder")
    ap.add_argument("--driver-batch-rows", type=int, help="apply.driver_batch_rows (unset: the default)")
    ap.add_argument("--json", default=str(ROOT / "docs" / "large_transaction.json"))
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hr-bigtx-"))
    results = []
    server = ThrowawayPostgres(version=None if args.pg == 15 else args.pg).start()
    try:
        for target in args.targets.split(","):
            for protocol in (int(p) for p in args.protocols.split(",")):
                one = run_one(server, work, target, protocol, args)
                results.append(one)
                print(json.dumps({k: v for k, v in one.items() if k != "samples"}), flush=True)
                Path(args.json).parent.mkdir(parents=True, exist_ok=True)
                Path(args.json).write_text(json.dumps(results, indent=1))
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
