"""The worker advises on a job from what its agent writes (issue 24): status.json through the agent's own
StatusReporter and metrics.json's history in the GCS emulator, read by the real GCS channel; the machine is
the in-memory cloud's. The advice is on the row and in GET /v1/jobs/{id}, while the job runs and after
it ends however it ends, and what the job's own code can write there does not break it. The rules
themselves: tests/unit/test_advice.py."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from agent.job import AgentJob
from agent.plan import Hardware, resolve_plan
from agent.status import StatusReporter, _TailHandler
from service.db.jobstate import JobStatus
from service.db.models import Job
from service.db.session import get_engine, transaction
from tests.support import eventually
from tests.support.browser import CHROMIUM, RECORD_CSP_VIOLATIONS, ms, needs_browser
from tests.support.jobs import digits_spec
from tests.support.worker import FAST, wait_for
from trainjobs import storage
from trainjobs.job_paths import JobPaths
from trainjobs.messages import AgentState
from trainjobs.spec import JobSpec
from trainjobs.vm_metadata import LABEL_JOB
from worker.driver import DriverConfig
from worker.gcs_channel import GcsJobChannel
from worker.loop import Worker, WorkerConfig
from worker.memory_cloud import MemoryCloud, memory_stager

S = JobStatus
TRAIN_EXAMPLES = 1437  # sklearn digits' training split
# float32 by choice on an L4 and one 3 ms step per call: mixed_precision and dispatch_bound.
SPEC = digits_spec(accelerator={"type": "gpu", "gpu_type": "nvidia-l4"}, strategy="auto", precision="float32",
                   steps_per_execution=1, model={"name": "mlp"}, training={"epochs": 3, "per_replica_batch_size": 64})


class Agent:
    """Writes what the agent writes where it writes it: status.json (agent/status.py) and metrics.json."""

    def __init__(self, job_id: str, bucket: str, tmp_path: Path):
        spec = JobSpec.model_validate(SPEC)
        self.paths = JobPaths.for_job(job_id, bucket)
        (tmp_path / "agent.log").write_text("")
        self.reporter = StatusReporter(AgentJob(job_id, 1, spec, "", self.paths.root, 0), tmp_path / "agent.log",
                                       _TailHandler(10), heartbeat_s=3600)
        self.history: list[dict[str, Any]] = []
        plan = resolve_plan(spec, Hardware("gpu", 1, 8.9), "one_device", 1, TRAIN_EXAMPLES)
        self.reporter.runtime = plan.as_dict() | {"dataset": {"train_examples": TRAIN_EXAMPLES}}
        self.reporter.set_phase("training")

    def epoch(self, n: int, step_ms: float = 3.0) -> None:
        entry = {"epoch": n, "attempt": 1, "loss": 0.5, "accuracy": 0.9, "examples_per_sec": 64_000 / step_ms,
                 "step_time_ms": step_ms * (10 if n == 1 else 1), "input_wait_fraction": 0.01, "train_seconds": 0.07,
                 "epoch_seconds": 0.08, "executions": 22, "steps": 22}
        self.history.append(entry)
        self.write_metrics({"job_id": "x", "attempt": 1, "epochs": 3, "initial_epoch": 0, "initial_step": 0,
                            "history": self.history})
        self.reporter.epoch_done(n, entry)

    def write_metrics(self, doc: Any) -> None:
        storage.blob(self.paths.metrics).upload_from_string(doc if isinstance(doc, bytes) else json.dumps(doc))

    def succeed(self, final: dict[str, Any]) -> None:
        storage.write_json(self.paths.final_metrics, final)
        self.reporter.finish(AgentState.SUCCEEDED)


@pytest.fixture
def advising_worker(database_url: str, bucket: str, running_workers: list[Worker]) -> MemoryCloud:
    cloud = MemoryCloud()
    config = WorkerConfig(concurrency=2, name="advisor", driver=DriverConfig(poll_s=0.05), **FAST)  # type: ignore[arg-type]
    worker = Worker(get_engine(database_url), cloud, GcsJobChannel(bucket), memory_stager, config)
    running_workers.append(worker)
    worker.start()
    return cloud


def _started(api: Any, cloud: MemoryCloud, bucket: str, tmp_path: Path) -> tuple[str, Agent]:
    job_id = api.post("/v1/jobs", json=SPEC).json()["id"]
    eventually(lambda: cloud.list({LABEL_JOB: job_id}), 30,
               lambda: f"the job's machine was created; the job is {api.get(f'/v1/jobs/{job_id}').json()}")
    return job_id, Agent(job_id, bucket, tmp_path)


def _rules(job: Any) -> set[str]:
    return {a["rule"] for a in job.advice or []}


def _advised(db: Any, job_id: str, rules: set[str]) -> Any:
    """The running job once its row holds advice by exactly these rules."""
    def advised() -> Any:
        job = wait_for(db, uuid.UUID(job_id), {S.RUNNING})
        return job if _rules(job) == rules else None

    return eventually(advised, 30, f"the running job's advice came to {sorted(rules)}")


def test_a_running_jobs_advice_is_stored_and_shown_and_the_end_recomputes_it(api: Any, db: Any, bucket: str,
                                                                             advising_worker: MemoryCloud,
                                                                             tmp_path: Path) -> None:
    job_id, agent = _started(api, advising_worker, bucket, tmp_path)
    for n in (1, 2, 3):
        agent.epoch(n)
    running = _advised(db, job_id, {"dispatch_bound", "mixed_precision"})
    [dispatch] = [a for a in running.advice if a["rule"] == "dispatch_bound"]
    assert dispatch["evidence"]["epochs"] == "2-3" and dispatch["evidence"]["step_time_ms"] == 3.0
    assert dispatch["suggestion"] == "steps_per_execution: 22"  # an epoch of 1437 examples at 64 has 22 steps
    assert api.get(f"/v1/jobs/{job_id}").json()["advice"] == running.advice

    # The agent's step split, in the final metrics, replaces the fallback's reading of a short step.
    agent.succeed({"accuracy": 0.9, "step_time_breakdown": {"device_ms_per_step": 1.0, "host_ms_per_step": 2.0,
                                                            "input_wait_ms_per_step": 0.0}})
    done = wait_for(db, uuid.UUID(job_id), {S.SUCCEEDED})
    [dispatch] = [a for a in done.advice if a["rule"] == "dispatch_bound"]
    assert dispatch["evidence"]["host_share"] == round(2 / 3, 4) and dispatch["expected_gain"].startswith("up to 3x")
    assert api.get(f"/v1/jobs/{job_id}").json()["advice"] == done.advice


@pytest.mark.parametrize("ending", ["failed", "cancelled"])
def test_a_job_that_ends_without_succeeding_keeps_advice_from_its_epochs(ending: str, api: Any, db: Any, bucket: str,
                                                                         advising_worker: MemoryCloud,
                                                                         tmp_path: Path) -> None:
    job_id, agent = _started(api, advising_worker, bucket, tmp_path)
    wait_for(db, uuid.UUID(job_id), {S.RUNNING})
    for n in (1, 2):
        agent.epoch(n)
    if ending == "failed":
        agent.reporter.finish(AgentState.FAILED, RuntimeError("the model diverged"))
    else:
        eventually(lambda: (wait_for(db, uuid.UUID(job_id), {S.RUNNING}).metrics or {}).get("epoch") == 2, 30,
                   "the second epoch was recorded")
        api.post(f"/v1/jobs/{job_id}/cancel")
    job = wait_for(db, uuid.UUID(job_id), {S.FAILED, S.CANCELLED})
    assert job.status == (S.FAILED if ending == "failed" else S.CANCELLED)
    assert _rules(job) == {"dispatch_bound", "mixed_precision"}


NESTED = b"[" * 100_000 + b"]" * 100_000
HOSTILE_METRICS: dict[str, Any] = {
    "not-json": b"{not json",
    "nested-too-deep": NESTED,
    "history-not-a-list": {"history": "x" * 10_000},
    "numbers-that-are-not": {"history": [
        {"epoch": 2, "attempt": 1, "examples_per_sec": float("nan"), "step_time_ms": 1e400, "input_wait_fraction": 9},
        {"epoch": "3", "attempt": 1, "examples_per_sec": "<b>fast</b>", "step_time_ms": [1], "input_wait_fraction": {}},
        {"epoch": 4, "attempt": True, "examples_per_sec": 1e308, "step_time_ms": -5, "input_wait_fraction": 0.5}]},
}


@pytest.mark.parametrize("doc", HOSTILE_METRICS.values(), ids=HOSTILE_METRICS.keys())
def test_metrics_the_jobs_code_garbled_do_not_break_the_job_or_its_advice(doc: Any, api: Any, db: Any, bucket: str,
                                                                          advising_worker: MemoryCloud,
                                                                          tmp_path: Path) -> None:
    job_id, agent = _started(api, advising_worker, bucket, tmp_path)
    agent.write_metrics(doc)
    agent.reporter.epoch_done(2, {"epoch": 2, "attempt": 1, "step_time_ms": "NaN", "input_wait_fraction": "<img>"})
    agent.succeed({"step_time_breakdown": {"device_ms_per_step": "1", "host_ms_per_step": None}})
    job = wait_for(db, uuid.UUID(job_id), {S.SUCCEEDED})
    # The runtime is the agent's own: its advice stands; nothing read from the garbled epochs does.
    assert _rules(job) == {"mixed_precision"} and job.driver_failures == 0
    assert api.get(f"/v1/jobs/{job_id}").json()["advice"] == job.advice


@needs_browser
def test_the_job_page_lists_each_advice_as_text_never_as_markup(api: Any, api_url: str, db: Any) -> None:
    from playwright.sync_api import expect, sync_playwright

    job_id = api.post("/v1/jobs", json=SPEC).json()["id"]  # no worker here: the row keeps the advice set below
    hostile = "<img src=x onerror=\"document.title='owned'\">"
    advice = [{"rule": "dispatch_bound", "evidence": {"steps_per_execution": 1, "step_time_ms": 3.2},
               "suggestion": "steps_per_execution: 22", "expected_gain": "not measured"},
              {"rule": hostile, "evidence": {hostile: hostile}, "suggestion": hostile, "expected_gain": hostile}]
    with transaction(db) as s:
        s.execute(update(Job).where(Job.id == uuid.UUID(job_id)).values(advice=advice))
    key = api.headers["authorization"].split()[1]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = browser.new_page()
            page.add_init_script(RECORD_CSP_VIOLATIONS)
            page.goto(f"{api_url}/ui/")
            page.fill("#key", key)
            page.click("#signin-form button")
            page.goto(f"{api_url}/ui/#/jobs/{job_id}")
            first = page.locator("#advice li[data-rule='dispatch_bound']")
            expect(first).to_contain_text("dispatch_bound: steps_per_execution: 22", timeout=ms(10))
            # Each number beside its name (JSONB keeps the keys in its own order: shorter first).
            expect(first).to_contain_text("steps_per_execution 1")
            expect(first).to_contain_text("step_time_ms 3.2")
            expect(page.locator("#advice li").nth(1)).to_contain_text(hostile)
            assert page.locator("#advice img").count() == 0 and page.title() != "owned"
        finally:
            browser.close()
