"""Fan-out against real DuckLake lakes with DuckDB-file catalogs: routing, rules, seeding, pool, partitions."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from headrace.cli import main
from headrace.fanout import commands
from headrace.fanout.runner import FanoutRunner
from tests.fanout.helpers import Setup, lake, run_caught_up

TENANTS = {"acme-lake": "acme", "beta-lake": "beta", "gamma-lake": "gamma"}

HISTORY = [
    "UPDATE l.main.events SET payload = 'a2' WHERE event_id = 1",  # same-tenant update
    "UPDATE l.main.events SET company = 'beta', payload = 'moved' WHERE event_id = 2",  # acme -> beta
    "BEGIN; INSERT INTO l.main.events VALUES (20, 'gamma', 'brief'); COMMIT",
    "DELETE FROM l.main.events WHERE event_id = 20",  # insert + delete in one range: cancels
    "UPDATE l.main.events SET payload = 'doomed' WHERE event_id = 3",
    "DELETE FROM l.main.events WHERE event_id = 3",  # update shadowed by the delete
    "INSERT INTO l.main.events VALUES (30, NULL, 'no tenant'), (31, 'nobody', 'unknown tenant')",
    "UPDATE l.main.events SET company = 'acme' WHERE event_id = 4",  # gamma -> acme
    "INSERT INTO l.main.events VALUES (40, 'gamma', 'g')",
]


def seed_rows(setup: Setup) -> None:
    setup.write(
        "INSERT INTO l.main.events VALUES (1, 'acme', 'a'), (2, 'acme', 'b'), (3, 'beta', 'c'), "
        "(4, 'gamma', 'd'), (5, NULL, 'e')"
    )


def assert_converged(setup: Setup, tenants: dict[str, str]) -> None:
    for dest, value in tenants.items():
        assert setup.held(dest) == setup.expected(value), dest


def test_routing_moves_cancel_shadow_and_unrouted(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    seed_rows(setup)
    config = setup.config(TENANTS)
    first = run_caught_up(config)  # seeds by a scan pinned to one snapshot
    assert first["unrouted_rows"] == 1  # event 5's insert
    assert_converged(setup, TENANTS)
    setup.write(*HISTORY)
    metrics = run_caught_up(config)
    assert_converged(setup, TENANTS)
    assert setup.held("beta-lake") == [(2, "beta", "moved")]
    assert setup.held("acme-lake") == [(1, "acme", "a2"), (4, "acme", "d")]
    assert metrics["unrouted_rows"] == 2
    assert metrics["cancelled_rows"] == 1
    assert metrics["change_reads"] == 1  # all three destinations at one cursor share one read
    beta = metrics["destinations"]["beta-lake"]
    assert beta["rows_deleted"] == 1 and beta["rows_upserted"] == 1  # event 3 gone, event 2 arrived
    assert all(d["lag_snapshots"] == 0 for d in metrics["destinations"].values())
    with lake(setup.dest_catalog("gamma-lake"), setup.dest_data("gamma-lake")) as con:
        applied = con.execute("SELECT source_snapshot FROM l._headrace.fanout_applied").fetchall()
    assert applied == [(metrics["source_snapshot"],)]

    # A new tenant joins later: seeded by a scan while the others just advance.
    setup.write("INSERT INTO l.main.events VALUES (50, 'delta', 'new tenant'), (51, 'acme', 'z')")
    more = {**TENANTS, "delta-lake": "delta"}
    run_caught_up(setup.config(more))
    assert_converged(setup, more)

    # status --json shows cursors, lag and counters.
    path = tmp_path / "fanout.yaml"
    path.write_text(json.dumps(setup.config(more).model_dump(mode="json")))
    assert main(["status", "-c", str(path), "--json"]) == 0


def test_status_json_and_check_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    setup = Setup(tmp_path)
    seed_rows(setup)
    path = tmp_path / "fanout.yaml"
    path.write_text(json.dumps(setup.config(TENANTS).model_dump(mode="json")))
    assert main(["check", "-c", str(path)]) == 0
    # In-process `main(["run", ...])` would install signal handlers in pytest; the CLI's run is
    # covered by the crash tests' subprocesses.
    assert commands.run(str(path), threading.Event(), until_caught_up=True) == 0
    capsys.readouterr()
    assert main(["status", "-c", str(path), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["kind"] == "fanout" and status["metrics"]["unrouted_rows"] == 1
    acme = next(d for d in status["destinations"] if d["id"] == "acme-lake")
    assert acme["rows_written"] == 2 and acme["lag_snapshots"] == 0 and acme["last_error"] is None


def test_append_only_mode_appends(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    seed_rows(setup)
    config = setup.config(TENANTS, routing={"key_columns": []})
    run_caught_up(config)
    setup.write("INSERT INTO l.main.events VALUES (1, 'acme', 'again')", "DELETE FROM l.main.events WHERE event_id = 3")
    run_caught_up(config)
    run_caught_up(config)  # nothing new: nothing appended twice
    assert setup.held("acme-lake") == [(1, "acme", "a"), (1, "acme", "again"), (2, "acme", "b")]
    assert setup.held("beta-lake") == [(3, "beta", "c")]  # deletes are not applied in append-only mode


def test_seed_by_cdc_replay(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    seed_rows(setup)
    setup.write(*HISTORY)
    metrics = run_caught_up(setup.config(TENANTS, routing={"seed_mode": "cdc_replay"}))
    assert_converged(setup, TENANTS)
    assert metrics["change_reads"] == 1 and metrics["cancelled_rows"] >= 1


def test_small_reads_and_lru_pool(tmp_path: Path) -> None:
    """Five tenants through a pool of two lakes, ranges of two snapshots at a time."""
    setup = Setup(tmp_path)
    seed_rows(setup)
    tenants = {**TENANTS, "delta-lake": "delta", "nobody-lake": "nobody"}
    config = setup.config(tenants, pool={"max_open": 2}, poll={"interval_seconds": 0.01, "max_snapshots_per_read": 2})
    run_caught_up(config)
    setup.write(*HISTORY)
    metrics = run_caught_up(config)
    assert_converged(setup, tenants)
    assert metrics["pool_evictions"] > 0
    assert metrics["change_reads"] >= len(HISTORY) // 2


def test_partition_modes_each_instance_serves_its_share(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    seed_rows(setup)
    setup.write(*HISTORY)
    owners: dict[str, str] = {}
    for ordinal in (0, 1):
        config = setup.config(TENANTS, instance={"id": f"fanout-{ordinal}",
                                                 "partition": {"mode": "hash", "total": 2, "ordinal": ordinal}})
        runner = FanoutRunner(config)
        try:
            assert runner.run(until_caught_up=True) == 0
            for d in runner.mine:
                owners[d.id] = config.instance.id
        finally:
            runner.close()
    assert sorted(owners) == sorted(TENANTS)
    assert_converged(setup, TENANTS)
    with setup.source() as con:
        rows = dict(con.execute(
            "SELECT destination_id, instance_id FROM __ducklake_metadata_l.headrace_fanout_cursor"
        ).fetchall())
    assert rows == owners
    explicit = setup.config(TENANTS, instance={"id": "one", "partition": {"mode": "explicit",
                                                                         "include": ["beta-lake"]}})
    assert [d.id for d in explicit.owned_destinations()] == ["beta-lake"]


def test_failing_destination_does_not_block_the_others(tmp_path: Path) -> None:
    """gamma's data path is a file, so its lake cannot be created; the others proceed, then it recovers."""
    setup = Setup(tmp_path)
    seed_rows(setup)
    blocker = tmp_path / "gamma-lake"
    blocker.write_text("not a folder")
    config = setup.config(TENANTS)
    runner = FanoutRunner(config)
    try:
        runner.cycle()
        runner.pool.con.execute("INSERT INTO hr_src.main.events VALUES (60, 'acme', 'while gamma is down')")
        runner.cycle()
        m = runner.metrics
        assert m.destinations["acme-lake"].lag_snapshots == 0
        assert m.destinations["gamma-lake"].last_snapshot is None
        assert m.destinations["gamma-lake"].errors >= 1 and "gamma-lake" in (m.destinations["gamma-lake"].last_error or "")
        stored = runner.cursors.load()["gamma-lake"]
        assert stored.errors >= 1 and stored.last_error
        blocker.unlink()  # the operator fixes it; the next retry succeeds
        assert runner.run(until_caught_up=True) == 0
        assert runner.cursors.load()["gamma-lake"].last_error is None
    finally:
        runner.close()
    assert_converged(setup, TENANTS)
