"""The control API against a running pipeline on a real Postgres: health, auth, metrics, operations."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request

import psycopg
from prometheus_client.parser import text_string_to_metric_families

from tests.control.conftest import TOKEN, TOKEN_ENV, Running
from tests.e2e.helpers import assert_same


def scrape(r: Running) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics, keyed by (name, sorted labels)."""
    with urllib.request.urlopen(r.base + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def sample(metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return metrics.get((name, tuple(sorted(labels.items()))), 0.0)


def cli(r: Running, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "headrace.cli", *args, "-c", str(r.config_path)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, TOKEN_ENV: TOKEN})


def test_health_readiness_and_openapi(running: Running) -> None:
    status, health = running.call("GET", "/healthz")
    assert status == 200 and health["status"] == "alive" and health["pipeline"] == "ctl"
    assert health["capture_connected"] is True and health["uptime_seconds"] > 0
    status, ready = running.call("GET", "/readyz")
    assert status == 200 and ready["ready"] is True and ready["reasons"] == []
    status, doc = running.call("GET", "/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.")
    assert {"/api/tables", "/api/tables/{table}/pause", "/api/source/tables"} <= set(doc["paths"])


def test_auth_rejects_missing_and_wrong_tokens(running: Running) -> None:
    for token in (None, "wrong", ""):
        for method, path in [("POST", "/api/pause"), ("POST", "/api/tables/public.orders/resync"),
                             ("POST", "/api/tables"), ("DELETE", "/api/tables/public.orders")]:
            status, body = running.call(method, path, token=token)
            assert status == 401, (method, path, token, body)
    # A form post (what another web page could send) is refused even with the token.
    assert running.call("POST", "/api/pause", content_type="text/plain")[0] == 415
    assert running.call("GET", "/api/tables", token=None)[0] == 200  # reads stay open
    assert running.table("public.orders")["state"] == "STREAMING"  # nothing above took effect
    assert running.call("GET", "/api/status")[1]["paused"] is False


def test_metrics_move_as_changes_flow(running: Running) -> None:
    before = scrape(running)
    t = "public.customers"
    running.source("INSERT INTO customers (name) SELECT 'm' || g FROM generate_series(1, 20) g;"
                   "UPDATE customers SET balance = -1 WHERE id <= 5; DELETE FROM customers WHERE id BETWEEN 6 AND 8")

    def applied() -> bool:
        m = scrape(running)
        return sample(m, "headrace_changes_applied_total", table=t, op="delete") - sample(
            before, "headrace_changes_applied_total", table=t, op="delete") >= 3

    running.wait(applied, "the changes to be applied")
    after = scrape(running)

    def moved(name: str, **labels: str) -> float:
        return sample(after, name, **labels) - sample(before, name, **labels)

    for op, n in [("insert", 20), ("update", 5), ("delete", 3)]:
        assert moved("headrace_changes_captured_total", table=t, op=op) == n
        assert moved("headrace_changes_applied_total", table=t, op=op) == n
    assert moved("headrace_apply_batch_duration_seconds_count", table=t) >= 1
    assert sample(after, "headrace_table_state", table=t, state="STREAMING") == 1
    assert sample(after, "headrace_table_state", table=t, state="PAUSED") == 0
    assert sample(after, "headrace_rows_copied", table=t) == 300
    assert ("headrace_capture_lag_bytes", ()) in after and ("headrace_slot_retained_wal_bytes", ()) in after
    assert sample(after, "headrace_capture_connected") == 1
    assert ("headrace_apply_lag_bytes", (("table", t),)) in after
    assert sample(after, "headrace_staged_changes_pending", table=t) == 0
    assert sample(after, "headrace_apply_lag_seconds", table=t) == 0  # caught up
    assert ("headrace_ddl_events_total", (("kind", "add_column"),)) in after  # present, 0 until DDL lands
    assert sample(after, "headrace_ddl_events_total", kind="add_column") == 0


def test_pause_stops_applying_and_resume_continues(running: Running) -> None:
    t = "public.customers"
    status, body = running.call("POST", f"/api/tables/{t}/pause")
    assert status == 200 and body["state"] == "PAUSED", body
    applied_before = running.table(t)["rows_applied"]
    running.source("INSERT INTO customers (name) SELECT 'p' || g FROM generate_series(1, 10) g")
    running.wait(lambda: running.table(t)["pending_changes"] >= 10, "capture to stage the changes")
    running.loop_passes(3)  # several loop passes see the staged changes: none is applied to a paused table
    paused = running.table(t)
    assert paused["state"] == "PAUSED" and paused["rows_applied"] == applied_before
    assert running.call("POST", f"/api/tables/{t}/pause")[0] == 200  # pausing twice is harmless
    status, body = running.call("POST", f"/api/tables/{t}/resume")
    assert status == 200 and body["state"] == "STREAMING", body
    running.wait(lambda: running.table(t)["pending_changes"] == 0, "the backlog to be applied")
    assert running.table(t)["rows_applied"] >= applied_before + 10
    assert running.call("POST", f"/api/tables/{t}/resume")[0] == 409  # not paused any more
    assert running.call("POST", "/api/tables/public.nope/pause")[0] == 404


def test_cli_pauses_the_pipeline_and_lists_tables(running: Running) -> None:
    result = cli(running, "pause")
    assert result.returncode == 0 and '"paused": true' in result.stdout, result.stderr
    running.source("INSERT INTO orders (customer, total) VALUES (1, 1), (2, 2)")
    running.wait(lambda: running.table("public.orders")["pending_changes"] >= 2, "capture while paused")
    running.loop_passes(3)
    assert running.table("public.orders")["pending_changes"] >= 2  # staged, not applied
    listing = cli(running, "tables")
    assert listing.returncode == 0 and "public.orders" in listing.stdout and "STREAMING" in listing.stdout
    result = cli(running, "resume")
    assert result.returncode == 0, result.stderr
    running.wait(lambda: running.table("public.orders")["pending_changes"] == 0, "apply after resume")
    bad = subprocess.run([sys.executable, "-m", "headrace.cli", "pause", "-c", str(running.config_path)],
                         capture_output=True, text=True, timeout=60, env={**os.environ, TOKEN_ENV: "wrong"})
    assert bad.returncode == 1 and "401" in bad.stderr


def test_resync_recopies(running: Running) -> None:
    t = "public.orders"
    running.source("INSERT INTO orders (customer, total) SELECT 1, g FROM generate_series(1, 25) g")
    with psycopg.connect(running.dsn) as conn:
        count = conn.execute("SELECT count(*) FROM orders").fetchone()[0]  # type: ignore[index]
    status, body = running.call("POST", f"/api/tables/{t}/resync")
    assert status in (200, 202) and body.get("state", "PENDING") == "PENDING", body
    running.wait(lambda: running.table(t)["state"] == "STREAMING" and running.table(t)["rows_copied"] == count,
                 "the table to be copied again")
    running.source("UPDATE orders SET note = 'after resync' WHERE id <= 3")
    running.wait(lambda: running.table(t)["pending_changes"] == 0, "changes after the resync")


def test_add_table_copies_and_streams_and_remove_stops(running: Running) -> None:
    status, body = running.call("GET", "/api/source/tables")
    by_name = {t["table"]: t for t in body["tables"]}
    assert by_name["public.extra"]["ready"] and not by_name["public.extra"]["tracked"]
    assert by_name["public.extra"]["kept_as_text"] == [{"column": "span", "pg_type": "int4range"}]
    assert by_name["public.customers"]["tracked"]
    assert not by_name["public.keyless"]["ready"]
    assert any("primary key" in p for p in by_name["public.keyless"]["problems"])
    status, body = running.call("POST", "/api/tables", {"table": "public.keyless"})
    assert status == 422 and "primary key" in body["error"]
    assert running.call("POST", "/api/tables", {"table": "public.customers"})[0] == 409

    status, body = running.call("POST", "/api/tables", {"table": "public.extra"})
    assert status in (201, 202), body
    running.wait(lambda: running.table("public.extra")["state"] == "STREAMING", "the new table to stream")
    assert running.table("public.extra")["rows_copied"] == 50
    running.source("INSERT INTO extra SELECT g, 'new', NULL FROM generate_series(51, 55) g;"
                   "UPDATE extra SET label = 'changed' WHERE id = 1")
    running.wait(lambda: running.table("public.extra")["rows_applied"] >= 6, "changes to the new table")
    status, described = running.call("GET", "/api/tables/public.extra")
    assert status == 200 and described["key"] == ["id"] and described["target"]["table"] == "public.extra"
    assert [c["name"] for c in described["columns"]] == ["id", "label", "span"]

    status, body = running.call("DELETE", "/api/tables/public.orders")
    assert status == 200 and body["removed"], body
    assert "public.orders" not in {t["table"] for t in running.call("GET", "/api/tables")[1]["tables"]}
    with psycopg.connect(running.dsn) as conn:
        published = {r[0] for r in conn.execute(
            "SELECT tablename FROM pg_publication_tables WHERE pubname = 'headrace_ctl'").fetchall()}
    assert published == {"customers", "extra"}


def test_check_is_the_same_assessment(running: Running) -> None:
    status, api = running.call("GET", "/api/check")
    assert status == 200 and api["problems"] == []
    result = cli(running, "check", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    import json

    assert json.loads(result.stdout)["tables"][0]["table"] == api["tables"][0]["table"]


def test_target_converges_while_paused(running: Running) -> None:
    # The pipeline paused leaves the target alone, so the test may read it.
    assert running.call("POST", "/api/pause")[1] == {"paused": True}
    try:
        assert assert_same(running.pipeline, running.dsn, "public.customers") == 300 + 20 - 3 + 10
        assert assert_same(running.pipeline, running.dsn, "public.extra") == 55
    finally:
        assert running.call("POST", "/api/resume")[1] == {"paused": False}


def test_grafana_dashboard_uses_exported_metrics(running: Running) -> None:
    import re
    from pathlib import Path

    dashboard = (Path(__file__).resolve().parents[2] / "docs" / "grafana" / "headrace.json").read_text()
    used = set(re.findall(r"headrace_[a-z_]+", dashboard))
    with urllib.request.urlopen(running.base + "/metrics", timeout=30) as resp:
        families = list(text_string_to_metric_families(resp.read().decode()))
    exported = {s.name for f in families for s in f.samples}
    exported |= {f.name + "_total" for f in families if f.type == "counter"}  # no samples before the first error
    assert used and used <= exported, used - exported
