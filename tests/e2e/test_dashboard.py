"""The dashboard in a browser with a real job running on the local stack. Its headers and CSP:
tests/integration/test_dashboard.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.jobs import digits_spec, wait_for_job
from tests.support.local import AGENT_JOB_S
from tests.support.browser import CHROMIUM, RECORD_CSP_VIOLATIONS, ms, needs_browser


@pytest.mark.tf
@needs_browser
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
            page.add_init_script(RECORD_CSP_VIOLATIONS)
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
            # (Matched as attributes: wait_for_function evaluates a string, which the page's CSP refuses.)
            chart = page.locator("#chart-loss")
            expect(chart).not_to_have_attribute("data-points", "0", timeout=ms(240))
            points = chart.get_attribute("data-points")
            expect(chart).not_to_have_attribute("data-points", points or "0", timeout=ms(30))  # it only grows
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
            errors += page.evaluate("window.cspViolations")
        finally:
            browser.close()
    assert api.get(f"/v1/jobs/{job['id']}").json()["status"] == "CANCELLED"
    assert shot.stat().st_size > 10_000
    assert errors == []


@pytest.mark.tf
@needs_browser
def test_a_finished_jobs_page_compares_its_exported_models(api, api_url, local_stack):
    """export.variants: GET /v1/jobs/{id} carries the optimization report's rows, and the job's page
    shows them, one row per model, with the score the API gives. The same job's step-time breakdown and
    profile (training.profile) reach the job's record and its page too."""
    from playwright.sync_api import expect, sync_playwright

    spec = digits_spec(name="models", model={"name": "mlp"}, strategy="default", accelerator={"type": "cpu"},
                       export={"tflite": {"quantization": "none"}, "variants": ["saved_model_int8", "tflite_dynamic"]},
                       training={"epochs": 2, "profile": True})
    job = wait_for_job(api, api.post("/v1/jobs", json=spec).json()["id"], {"SUCCEEDED"}, timeout=AGENT_JOB_S)
    rows = job["metrics"]["optimization"]
    breakdown, profile = job["metrics"]["step_time_breakdown"], job["metrics"]["profile"]
    assert breakdown["device_seconds"] > 0 and profile["files"], profile
    assert [r["name"] for r in rows] == ["saved_model", "model.tflite", "saved_model_int8", "tflite_dynamic"]
    key = api.headers["authorization"].split()[1]
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1400})
            page.add_init_script(RECORD_CSP_VIOLATIONS)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"{api_url}/ui/#/jobs/{job['id']}")
            page.fill("#key", key)
            page.click("#signin-form button")
            expect(page.locator("#job-status")).to_have_text("SUCCEEDED", timeout=ms(10))
            expect(page.locator("#models tbody tr")).to_have_count(4, timeout=ms(10))
            expect(page.locator("#models thead")).to_contain_text("accuracy")
            int8 = page.locator("#models tr[data-model='saved_model_int8'] td")
            expect(int8.nth(1)).to_have_text("int8")
            shown = float(int8.nth(2).inner_text())
            assert shown == pytest.approx(rows[2]["accuracy"], abs=0.006)  # fmt.num: three figures
            expect(page.locator("#models tr[data-model='tflite_dynamic']")).to_contain_text(" ms")
            expect(page.locator("#step-time tbody tr")).to_have_count(7)
            device = page.locator("#step-time tr[data-part='device_seconds'] td")
            expect(device.nth(0)).to_have_text("device")
            assert float(device.nth(1).inner_text()) == pytest.approx(breakdown["device_seconds"], rel=0.01)
            expect(device.nth(3)).to_contain_text("%")
            expect(page.locator("#profile")).to_contain_text(f"epoch 2, {profile['steps']} steps in ")
            expect(page.locator("#profile")).to_contain_text(f"tensorboard/{profile['files'][0]}")
            errors += page.evaluate("window.cspViolations")
        finally:
            browser.close()
    assert errors == []
