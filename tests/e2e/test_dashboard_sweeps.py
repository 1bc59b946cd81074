"""The dashboard's sweep pages (issue 22) in a real browser: a sweep submitted through the API, its
trials made by the real sweep engine and their jobs played (tests/support/sweeps.py's play():
metrics.json and the jobs row as a worker and an agent would write them), so the page is judged on
known values; the list, the best trial and its job, both charts, the trials table, and cancel."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from sqlalchemy import text

from service.db.session import get_engine, transaction
from tests.support.sweeps import play, sweep_spec, trials
from tests.support.browser import CHROMIUM, RECORD_CSP_VIOLATIONS, ms, needs_browser
from worker.sweeps import SweepConfig, SweepEngine


def js_num(v: float) -> str:
    """A value below 1 as the page's fmt.num writes it (toPrecision(3), trailing zeros kept)."""
    return f"{v:#.3g}"


def torn_down(db: Any, sweep_id: str) -> None:
    """Every job of the sweep being cancelled (its pruned trial's, its running trial's) has ended, as the
    worker that holds it writes once the machine is deleted."""
    with transaction(db) as session:
        session.execute(text("UPDATE jobs SET status = 'CANCELLED', finished_at = now()"
                             " WHERE labels->>'sweep' = :id AND status = 'CANCELLING'"), {"id": sweep_id})


@needs_browser
def test_the_dashboard_shows_a_sweep_its_best_trial_charts_and_trials_and_cancels_it(
        api: Any, api_url: str, database_url: str, db: Any, bucket: str, tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    r = api.post("/v1/sweeps", json=sweep_spec(max_trials=4, early_stopping={"type": "median", "min_epochs": 1}))
    assert r.status_code == 201, r.text
    sweep = r.json()
    engine = SweepEngine(get_engine(database_url), db, "w", threading.Event(), SweepConfig(step_every_s=0.0))
    engine.tick()
    first = trials(api, sweep["id"])
    play(db, first[0]["job_id"], [0.7, 0.85, 0.9], done=True)
    play(db, first[1]["job_id"], [0.72, 0.86, 0.93], done=True)
    engine.tick()
    then = trials(api, sweep["id"])
    play(db, then[2]["job_id"], [0.1, 0.12], done=False)  # far behind the median: pruned
    play(db, then[3]["job_id"], [0.75, 0.88], done=False)  # level with the others: runs on
    engine.tick()
    made = {t["number"]: t for t in trials(api, sweep["id"])}
    assert {n: t["state"] for n, t in made.items()} == {0: "COMPLETE", 1: "COMPLETE", 2: "PRUNED", 3: "RUNNING"}
    best = made[1]
    lr = best["params"]["training.learning_rate"]

    key = api.headers["authorization"].split()[1]
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1400})
            page.add_init_script(RECORD_CSP_VIOLATIONS)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"{api_url}/ui/")
            page.fill("#key", key)
            page.click("#signin-form button")
            expect(page.locator("#jobs")).to_be_visible(timeout=ms(10))

            page.click("#nav a[data-nav=sweeps]")
            row = page.locator(f"tr[data-sweep='{sweep['id']}']")
            expect(row).to_be_visible(timeout=ms(10))
            for cell in ("lr", "RUNNING", "val_accuracy 0.930", "3 / 4"):  # trials done: complete, pruned, failed
                expect(row).to_contain_text(cell)

            row.click()
            expect(page.locator("#sweep-name")).to_have_text("lr", timeout=ms(10))
            expect(page.locator("#sweep-status")).to_have_text("RUNNING")
            expect(page.locator("#sweep-id")).to_contain_text("maximize val_accuracy")
            expect(page.locator("#best-value")).to_have_text("val_accuracy 0.930", timeout=ms(10))
            expect(page.locator("#best-params")).to_contain_text(f"training.learning_rate{js_num(lr)}")
            for number, state in ((0, "COMPLETE"), (1, "COMPLETE"), (2, "PRUNED"), (3, "RUNNING")):
                trial = page.locator(f"#trials-table tr[data-trial='{number}']")
                expect(trial.locator(".status")).to_have_text(state)
                expect(trial.locator(f"a[href='#/jobs/{made[number]['job_id']}']")).to_be_visible()
                expect(trial).to_contain_text(f"training.learning_rate={js_num(made[number]['params']['training.learning_rate'])}")
            expect(page.locator("#trials-table tbody tr")).to_have_count(4)
            expect(page.locator("#trials-table tr[data-trial='2']")).to_contain_text("0.120 at epoch 2")
            # (Matched as attributes: wait_for_function evaluates a string, which the page's CSP refuses.)
            by_trial = page.locator("#chart-trials")  # a mark per completed or pruned trial; the pruned a ring
            expect(by_trial).to_have_attribute("data-points", "3")
            expect(by_trial).to_have_attribute("data-rings", "1")
            by_epoch = page.locator("#chart-curves")  # a line per trial, over its epochs
            expect(by_epoch).to_have_attribute("data-lines", "4")
            expect(by_epoch).to_have_attribute("data-points", "3")
            shot = tmp_path / "dashboard-sweep-page.png"
            page.screenshot(path=str(shot), full_page=True)
            print(f"dashboard screenshot: {shot}")

            page.click("#best-job")
            expect(page).to_have_url(f"{api_url}/ui/#/jobs/{best['job_id']}")
            expect(page.locator("#job-name")).to_have_text("lr-trial-1", timeout=ms(10))
            expect(page.locator("#job-sweep")).to_have_text(f"trial 1 of sweep {sweep['id'][:8]}")
            page.click("#job-sweep a")
            expect(page.locator("#sweep-status")).to_have_text("RUNNING", timeout=ms(10))

            page.once("dialog", lambda dialog: dialog.accept())
            page.click("#sweep-cancel")
            expect(page.locator("#sweep-status")).to_have_text("CANCELLING", timeout=ms(10))
            expect(page.locator("#sweep-note")).to_have_text("cancel requested by user")
            expect(page.locator("#sweep-cancel")).to_be_disabled()
            engine.tick()  # the engine cancels the running trial's job ...
            torn_down(db, sweep["id"])  # ... a worker deletes the trials' machines ...
            engine.tick()  # ... and the sweep ends once none holds one
            expect(page.locator("#sweep-status")).to_have_text("CANCELLED", timeout=ms(10))
            expect(page.locator("#trials-table tr[data-trial='3'] .status")).to_have_text("FAIL")
            errors += page.evaluate("window.cspViolations")
        finally:
            browser.close()
    assert api.get(f"/v1/sweeps/{sweep['id']}").json()["status"] == "CANCELLED"
    assert shot.stat().st_size > 10_000
    assert errors == []
