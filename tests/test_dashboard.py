"""The dashboard in a real browser (Debian's Chromium, headless, driven by Playwright): sign in, find
a running job in the list, watch its loss chart gain a point, cancel it from the page. A screenshot of
the job page is kept as a test artifact (its path is printed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import digits_spec, scaled
from tests.test_end_to_end import local_stack  # noqa: F401 - the fixture: a worker with the local provisioner

CHROMIUM = "/usr/bin/chromium"
pytestmark = [pytest.mark.tf, pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                                 reason=f"no browser: {CHROMIUM} is absent (apt-get install chromium)")]


def ms(seconds: float) -> float:
    return scaled(seconds) * 1000


def test_dashboard_shows_a_running_job_live_and_cancels_it(api, api_url, local_stack, tmp_path: Path):
    from playwright.sync_api import expect, sync_playwright

    spec = digits_spec(name="dashboard-demo", model={"name": "mlp"}, strategy="default", accelerator={"type": "cpu"},
                       training={"epochs": 400}, labels={"suite": "dashboard"})
    job = api.post("/v1/jobs", json=spec).json()
    key = api.headers["authorization"].split()[1]
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1400})
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"{api_url}/")  # redirects to /ui/
            assert page.url.endswith("/ui/")
            page.fill("#key", key)
            page.click("#signin-form button")

            row = page.locator(f"tr[data-job='{job['id']}']")
            expect(row).to_be_visible(timeout=ms(10))
            page.fill("#filter-labels", "suite=elsewhere")
            page.click("#filters button")
            expect(page.locator("#jobs-empty")).to_be_visible(timeout=ms(10))
            page.fill("#filter-labels", "suite=dashboard")
            page.click("#filters button")
            expect(row).to_be_visible(timeout=ms(10))

            row.click()
            expect(page.locator("#job-name")).to_have_text("dashboard-demo", timeout=ms(10))
            # The chart is fed by the metrics stream: it gains points while the job trains.
            page.wait_for_function("Number(document.querySelector('#chart-loss').dataset.points) >= 1",
                                   timeout=ms(240))
            points = int(page.get_attribute("#chart-loss", "data-points") or 0)
            page.wait_for_function(f"Number(document.querySelector('#chart-loss').dataset.points) > {points}",
                                   timeout=ms(30))
            expect(page.locator("#job-status")).to_have_text("RUNNING")
            expect(page.locator("#runtime")).to_contain_text("strategy", timeout=ms(10))
            expect(page.locator("#log")).to_contain_text("epoch", timeout=ms(10))
            expect(page.locator("#timeline")).to_contain_text("PROVISIONING")
            shot = tmp_path / "dashboard-job-page.png"
            page.screenshot(path=str(shot), full_page=True)
            print(f"dashboard screenshot: {shot}")

            page.once("dialog", lambda dialog: dialog.accept())
            page.click("#cancel")
            expect(page.locator("#job-status")).to_have_text("CANCELLED", timeout=ms(60))
            expect(page.locator("#log-state")).to_have_text("(ended: CANCELLED)", timeout=ms(30))
            expect(page.locator("#cancel")).to_be_disabled()
        finally:
            browser.close()
    assert api.get(f"/v1/jobs/{job['id']}").json()["status"] == "CANCELLED"
    assert shot.stat().st_size > 10_000
    assert errors == []
