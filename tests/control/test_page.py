"""The status page in a real headless browser (Debian chromium driven by Playwright)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

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
