"""The status page in a real headless browser (Debian chromium driven by Playwright)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from headrace.control.page import lag_chart
from tests.control.conftest import TOKEN, Running

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "img" / "status-page.png"


def test_page_renders_tables_and_a_button_pauses_one(running: Running, tmp_path: Path) -> None:
    if not os.path.exists(CHROMIUM):
        pytest.skip("chromium is not installed (apt-get install chromium; scripts/bootstrap.sh does it)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    t = "public.customers"
    running.source("INSERT INTO customers (name) SELECT 'page' || g FROM generate_series(1, 40) g")
    running.wait(lambda: running.table(t)["pending_changes"] == 0, "changes before the screenshot")
    metrics = running.pipeline.metrics
    while [lags.get(t) is not None for _, lags in metrics.lag_history()][-2:] != [True, True]:
        metrics.sample_lag()  # the API samples every 30 s; a line needs two points while the table applies
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 420})
            page.on("dialog", lambda dialog: dialog.accept(TOKEN))  # the page asks for the API token once
            page.goto(running.base + "/")
            row = page.locator(f'tr[data-table="{t}"]')
            assert "STREAMING" in row.inner_text()
            assert page.locator("#tables tbody tr").count() >= 1
            assert "capture: connected" in page.inner_text(".bar")
            # The lag of the last hour, from the samples the metrics keep: a line per table, with its maximum.
            chart = page.locator("#lag-chart")
            assert chart.locator("svg polyline").count() >= 1 and "now" in chart.inner_text()
            assert f"{t} (max " in chart.locator(".legend").inner_text()
            row.get_by_role("button", name="Pause").click()
            page.wait_for_selector(f'tr[data-table="{t}"] .st.PAUSED', timeout=30_000)
            assert running.table(t)["state"] == "PAUSED"
            assert row.get_by_role("button", name="Resume").is_visible()
            shot = SCREENSHOT if os.environ.get("HEADRACE_UPDATE_SCREENSHOT") else tmp_path / "status-page.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    status, body = running.call("POST", f"/api/tables/{t}/resume")
    assert status == 200, body


def test_the_lag_chart_draws_a_line_per_table_with_gaps_and_its_axis() -> None:
    now = 10_000.0
    samples = [(now - 3000, {"public.a": 0.0, "public.b": None}), (now - 2000, {"public.a": 4.0, "public.b": 1.0}),
               (now - 1000, {"public.a": None, "public.b": 2.0}), (now, {"public.a": 2.0, "public.b": 90.0})]
    svg = lag_chart(samples, now)
    assert svg.count("<polyline") == 2  # public.a's first run (2 points) and public.b's (3 points)
    assert svg.count("<circle") == 1  # public.a after its gap: one point
    assert "public.b (max 90.0 s)" in svg and "public.a (max 4.0 s)" in svg
    assert ">90.0 s</text>" in svg and "−60 min" in svg and ">now</text>" in svg
    assert "collecting" in lag_chart(samples[:1], now)
    many = [(now - 60, {f"public.t{i}": float(i) for i in range(9)}), (now, {f"public.t{i}": float(i) for i in range(9)})]
    assert "3 more not shown" in lag_chart(many, now) and "public.t8" in lag_chart(many, now)
    assert "public.t0 " not in lag_chart(many, now)  # the tables with the lowest lag are left out
