"""The fan-out's Prometheus endpoint, scraped while an instance runs, and its failures classified as
a CDC table's are (transient retried, terminal waiting for the operator with the fix)."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from pathlib import Path

import duckdb
import pytest
from prometheus_client.parser import text_string_to_metric_families

from headrace.core.errors import ConfigError, SchemaChangeError, TransientError
from headrace.fanout.config import ApiConfig
from headrace.fanout.failures import classify_failure
from headrace.fanout.runner import FanoutRunner
from headrace.fanout.server import MetricsServer
from tests.fanout.helpers import Setup, lake
from tests.fanout.test_pipeline import TENANTS, seed_rows

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def scrape_until(url: str, done: threading.Event, ready: object, what: str) -> Samples:
    """Scrape until ``ready(samples)`` holds; the run thread ending first is a failure."""
    deadline = time.monotonic() + 120
    while True:
        samples = scrape(url)
        if ready(samples):  # type: ignore[operator]
            return samples
        assert not done.is_set(), f"the fan-out stopped before {what}"
        assert time.monotonic() < deadline, f"no {what} in 120 s: {samples}"
        done.wait(0.05)


def test_metrics_scraped_during_a_run_with_a_transient_and_a_terminal_destination(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    seed_rows(setup)
    # gamma's data path is a file: its lake cannot be created (transient, retried until fixed).
    (tmp_path / "gamma-lake").write_text("not a folder")
    # shape-lake already holds an events table of another shape: terminal, waits for the operator.
    with lake(setup.dest_catalog("shape-lake"), setup.dest_data("shape-lake")) as con:
        con.execute("CREATE TABLE l.main.events (event_id BIGINT, note VARCHAR)")
    setup.write("INSERT INTO l.main.events VALUES (6, 'delta', 'for shape-lake')")
    tenants = {**TENANTS, "shape-lake": "delta"}
    config = setup.config(tenants, api={"listen": "127.0.0.1:0"})
    assert config.api is not None
    runner = FanoutRunner(config)
    server = MetricsServer(config.api, runner.metrics, config.name, config.instance.id)
    stop, done = threading.Event(), threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            runner.run(stop)
        except BaseException as exc:
            failed.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=run, name="fanout-test")
    thread.start()
    try:
        def settled(s: Samples) -> bool:
            return (value(s, "headrace_fanout_lag_snapshots", destination="acme-lake") == 0
                    and value(s, "headrace_fanout_destination_waiting", destination="shape-lake") == 1
                    and (value(s, "headrace_fanout_errors_total", destination="gamma-lake", kind="transient")
                         or 0) >= 2)

        samples = scrape_until(server.url, done, settled, "acme caught up, shape waiting, gamma retried")
        assert value(samples, "headrace_fanout_info", pipeline="events-fanout", instance_id="fanout-0") == 1
        assert value(samples, "headrace_fanout_rows_upserted_total", destination="acme-lake") == 2
        assert value(samples, "headrace_fanout_rows_upserted_total", destination="beta-lake") == 1
        assert value(samples, "headrace_fanout_unrouted_rows_total") == 1  # event 5, routing value NULL
        assert value(samples, "headrace_fanout_errors_total", destination="shape-lake", kind="terminal") == 1
        assert value(samples, "headrace_fanout_errors_total", destination="acme-lake", kind="transient") == 0
        assert value(samples, "headrace_fanout_destination_waiting", destination="gamma-lake") == 0
        assert (value(samples, "headrace_fanout_cycles_total") or 0) >= 2
        assert value(samples, "headrace_fanout_source_snapshot") == runner.metrics.source_snapshot
        assert value(samples, "headrace_fanout_lake_commits_total") == 2  # acme and beta's seeds
        shape = runner.metrics.destinations["shape-lake"]
        assert shape.last_error is not None and "SchemaChangeError" in shape.last_error
        assert "fix:" in shape.last_error and "main.events" in shape.last_error

        # The operator fixes gamma; it catches up on its next retry while shape-lake still waits.
        (tmp_path / "gamma-lake").unlink()
        scrape_until(server.url, done,
                     lambda s: value(s, "headrace_fanout_lag_snapshots", destination="gamma-lake") == 0,
                     "gamma caught up")
    finally:
        stop.set()
        thread.join(timeout=60)
        server.stop()
        runner.close()
    assert not failed, failed
    assert setup.held("gamma-lake") == setup.expected("gamma")
    with pytest.raises(OSError):  # the port is closed after stop()
        scrape(server.url)


def test_until_caught_up_gives_up_at_once_on_a_terminal_destination(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    seed_rows(setup)
    with lake(setup.dest_catalog("beta-lake"), setup.dest_data("beta-lake")) as con:
        con.execute("CREATE TABLE l.main.events (event_id BIGINT, note VARCHAR)")
    runner = FanoutRunner(setup.config(TENANTS, retry={"give_up_after": 50, "initial_seconds": 0.05}))
    try:
        assert runner.run(until_caught_up=True) == 1  # 50 retries would take minutes at the 0.2 s cap
        beta = runner.metrics.destinations["beta-lake"]
        assert beta.errors == 1 and beta.waiting and beta.errors_by_kind == {"terminal": 1}
        stored = runner.cursors.load()["beta-lake"]
        assert stored.errors == 1 and "restart this fan-out instance" in (stored.last_error or "")
    finally:
        runner.close()
    assert setup.held("acme-lake") == setup.expected("acme")


def test_failures_are_classified_like_cdc_ones() -> None:
    io = classify_failure(duckdb.IOException("IO Error: Could not set lock"), "destination a")
    assert io.kind == "transient" and io.retries(100, 5)
    assert io.message.startswith("TransientError: DuckDB IOException writing destination a")
    shape = classify_failure(duckdb.BinderException("column note not found"), "destination a", "main.events")
    assert shape.kind == "terminal" and not shape.retries(1, 5)
    assert "main.events" in shape.fix and "restart" in shape.fix
    bug = classify_failure(KeyError("x"), "destination a")
    assert bug.kind == "unknown" and bug.retries(4, 5) and not bug.retries(5, 5)
    assert bug.message == "UnclassifiedError: destination a: KeyError: 'x'"
    own = classify_failure(TransientError("destination a: cannot create the data path"), "destination a")
    assert own.kind == "transient" and own.message == "TransientError: destination a: cannot create the data path"


def test_api_config_and_a_busy_port() -> None:
    with pytest.raises(ValueError, match="host:port"):
        ApiConfig(listen="9100")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        api = ApiConfig(listen=f"127.0.0.1:{busy.getsockname()[1]}")
        from headrace.fanout.metrics import FanoutMetrics

        with pytest.raises(ConfigError, match="cannot serve /metrics"):
            MetricsServer(api, FanoutMetrics(), "p", "i")


def test_the_run_command_serves_metrics_on_api_listen(tmp_path: Path) -> None:
    from headrace.fanout import commands

    setup = Setup(tmp_path)
    seed_rows(setup)
    with socket.socket() as probe:  # a port free a moment ago; the config names it, as a user's would
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    path = tmp_path / "fanout.yaml"
    path.write_text(json.dumps(setup.config(TENANTS, api={"listen": f"127.0.0.1:{port}"}).model_dump(mode="json")))
    stop, done = threading.Event(), threading.Event()
    codes: list[int] = []

    def run() -> None:
        try:
            codes.append(commands.run(str(path), stop, until_caught_up=False))
        finally:
            done.set()

    thread = threading.Thread(target=run, name="fanout-cli-test")
    thread.start()
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        deadline = time.monotonic() + 120
        while True:
            try:
                samples = scrape(url)
            except OSError:  # not listening yet
                samples = {}
            if all(value(samples, "headrace_fanout_lag_snapshots", destination=d) == 0 for d in TENANTS):
                break
            assert not done.is_set() and time.monotonic() < deadline, samples
            done.wait(0.05)
        assert value(samples, "headrace_fanout_rows_upserted_total", destination="acme-lake") == 2
    finally:
        stop.set()
        thread.join(timeout=60)
    assert codes == [0]


def test_a_terminal_source_failure_stops_the_run_with_its_kind(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    seed_rows(setup)
    runner = FanoutRunner(setup.config(TENANTS))
    try:
        runner.pool.con.execute("DROP TABLE hr_src.main.events")  # the shared table is gone
        with pytest.raises(SchemaChangeError, match="events-fanout"):
            runner.run(until_caught_up=True)
        assert runner.metrics.cycle_errors_by_kind == {"terminal": 1}
    finally:
        runner.close()
