"""Kill the process (os._exit at a crash point, and SIGKILL at random moments) under load, restart,
and check the target equals the source with no duplicate and no gap."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from headrace.config import parse_config
from headrace.pipeline import Pipeline
from tests.e2e.helpers import assert_same, kill_after_batches
from tests.e2e.test_pipeline import run_caught_up


def _load(dsn: str, stop: threading.Event, seed: int) -> None:
    rng = random.Random(seed)
    next_id = 10_000
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            with conn.transaction():
                for _ in range(rng.randint(1, 10)):
                    roll = rng.random()
                    if roll < 0.35:
                        conn.execute("INSERT INTO items VALUES (%s, 0, 'n')", (next_id,))
                        next_id += 1
                    elif roll < 0.75:
                        conn.execute("UPDATE items SET v = v + 1, note = md5(random()::text) WHERE id = %s",
                                     (rng.randint(1, next_id),))
                    elif roll < 0.9:
                        conn.execute("DELETE FROM items WHERE id = %s", (rng.randint(1, next_id),))
                    else:  # key change
                        conn.execute("UPDATE items SET id = %s WHERE id = %s", (next_id, rng.randint(1, next_id)))
                        next_id += 1
            time.sleep(0.02)


@pytest.mark.parametrize(("target", "crash_passes", "kills"), [("ducklake", (1, 2), 2), ("iceberg", (2,), 1)])
def test_kill_repeatedly_under_load_then_converge(source_dsn: str, tmp_path: Path, spark: Any, target: str,
                                                  crash_passes: tuple[int, ...], kills: int) -> None:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, v int, note text);"
                     "INSERT INTO items SELECT g, 0, 'seed' FROM generate_series(1, 500) g")
    target_cfg: dict[str, Any] = (
        {"ducklake": {"catalog": str(tmp_path / "lake.ducklake"), "data_path": str(tmp_path / "lake")}}
        if target == "ducklake" else {"iceberg": {"warehouse": str(tmp_path / "wh"), "catalog_name": "hrcrash"}}
    )
    raw = {"name": "crash", "source": {"dsn": source_dsn, "tables": ["public.items"]}, "target": target_cfg,
           "staging": {"path": str(tmp_path / "staging"), "flush_seconds": 0.3},
           "apply": {"idle_sleep_seconds": 0.1}, "spark": {"master": "local[1]"}}
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw))
    cmd = [sys.executable, "-m", "headrace.cli", "run", "-c", str(path)]
    stop = threading.Event()
    writer = threading.Thread(target=_load, args=(source_dsn, stop, 3))
    writer.start()
    rng = random.Random(11)
    crashes = 0
    try:
        # Die right after a target commit, before the cursor moves: the next run replays that batch.
        for nth in crash_passes:
            env = {**os.environ, "HEADRACE_CRASH_AT": f"apply.after_target_commit:{nth}"}
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
            assert proc.returncode == 137, proc.stderr[-3000:]
            crashes += 1
        # And plain kill -9 at random moments while the run applies.
        for kill in range(kills):
            kill_after_batches(cmd, tmp_path / f"kill{kill}.log", rng)
            crashes += 1
    finally:
        stop.set()
        writer.join()
    assert crashes == len(crash_passes) + kills
    # The recovering run is the same pipeline in this process (the session's Spark starts no JVM).
    local = Pipeline(parse_config({**raw, "spark": {"master": "local[2]"}}), spark=spark)
    run_caught_up(local)
    try:
        assert assert_same(local, source_dsn, "public.items") > 500
    finally:
        local.target.close()
