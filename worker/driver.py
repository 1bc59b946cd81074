"""Drives one claimed job through its states, one step per wake-up.

Each step reads the row, does the outside-world work for the current status (stage, provision,
watch, tear down), then moves the job with one conditional transition. If the transition finds the
job changed underneath (a cancel, a lost lease) it raises `StaleTransition` and the next step
re-reads. A step never holds a database transaction open across a cloud call.

A step that raises anything else is logged and retried with capped exponential backoff. Consecutive
failures are counted on the row (jobs.driver_failures), so a worker restart does not reset them;
after `max_driver_failures` in a row the job ends FAILED with the error, its machines deleted.
Errors that only say a service is unreachable (service/db/outages.py), and a cloud's refusals for the
project's API rate quota (RateLimited, issue 25), are retried but not counted.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from service.db import jobs as jobdata
from service.db import machines as timings
from service.db.jobstate import JobStatus, StaleTransition, transition
from service.db.models import Job
from service.db.outages import is_outage
from service.db.session import transaction
from trainjobs.messages import AgentError, AgentReport, AgentState
from trainjobs.spec import JobSpec, parse_stored
from worker import prometheus
from worker.advising import JobAdvisor
from worker.status_cadence import StatusCadence
from worker.boundary.access import JobBoundary, job_boundary
from worker.teacher_check import teacher_refusal
from trainjobs.spec.derived import hourly_price_usd
from trainjobs.states import TERMINAL
from trainjobs.vm_metadata import LABEL_ATTEMPT, LABEL_JOB
from worker.ports import (
    DatasetError, JobChannel, MachineRefused, MachineRequest, MachineState, NoCapacity, ProgramError, Provisioner,
    RateLimited, Stager, StagingStopped,
)

log = logging.getLogger("trainjobs.worker")
S = JobStatus


@dataclass
class DriverConfig:
    poll_s: float = 1.0  # how often a running job's row and machine are checked
    # status.json that brings nothing new is read less often, down to once in this many polls
    # (worker/status_cadence.py)
    status_idle_polls: int = 10
    agent_stale_s: float = 120.0  # a READY machine whose agent is silent this long is treated as lost
    boot_timeout_s: float = 900.0  # a machine that never reports is replaced
    max_driver_failures: int = 5  # steps failing in a row before the job is failed
    retry_backoff_s: float = 1.0  # wait after a failed step, doubled per failure in a row
    retry_backoff_max_s: float = 30.0  # ... up to this; an outage is retried this often for as long as it lasts


class JobDriver:
    def __init__(self, job_id: uuid.UUID, owner: str, factory: sessionmaker[Session], provisioner: Provisioner,
                 channel: JobChannel, stager: Stager, config: DriverConfig, stop: threading.Event):
        self.job_id, self.owner, self.factory = job_id, owner, factory
        self.provisioner, self.channel, self.stager, self.config = provisioner, channel, stager, config
        self.stop = stop  # the worker is stopping
        self.wake = threading.Event()  # something changed: look now instead of at the next poll
        self.cancel_requested = threading.Event()  # the job is CANCELLING: give up staging
        self._failed_in_a_row = 0  # this driver's own count, outages included: sets the backoff
        self._noted: set[tuple[str, int, str]] = set()  # machine timings already on the row
        self._waiting_seen: float | None = None  # when the machine was last seen queued for capacity
        self._boundary: tuple[str | None, JobBoundary] | None = None  # (dataset_uri, the job's boundary)
        self._spec: JobSpec | None = None  # parsed at the first step: a job's spec never changes once stored
        self._advisor: JobAdvisor | None = None  # made at the first step, from the advice the row holds
        self._status_cadence = StatusCadence(config.poll_s, config.status_idle_polls)
        self._recorded: dict[str, Any] | None = None  # the progress last written to the row

    def run(self) -> None:
        """Step until the job is terminal, no longer ours, or the worker is stopping."""
        while not self.stop.is_set():
            try:
                job = self._load()
                if job is None or job.lease_owner != self.owner or job.status in TERMINAL:
                    return
                moved = self._step(job)
                self._step_succeeded(job)
            except StaleTransition as exc:
                log.info("job %s moved underneath us (%s); re-reading", self.job_id, exc)
                continue
            except Exception as exc:
                self._step_failed(exc)
                continue
            if moved:
                continue  # take the next step at once
            self.wake.wait(self.config.poll_s)
            self.wake.clear()

    def _should_stop_staging(self) -> bool:
        return self.stop.is_set() or self.cancel_requested.is_set()

    # --- one step per status; return True when the job moved ---

    def _step(self, job: Job) -> bool:
        if self._spec is None:
            # Read as stored, not as submitted: a validator tightened since the job was accepted must not
            # fail it (trainjobs/spec/job.py, parse_stored). Once per driver, not once a second.
            self._spec = parse_stored(job.spec)
        if self._advisor is None:
            self._advisor = JobAdvisor(self.channel, str(job.id), job.advice)
        spec = self._spec
        match job.status:
            case S.STAGING:
                return self._stage(job, spec)
            case S.PROVISIONING:
                return self._provision(job, spec)
            case S.RUNNING:
                return self._watch(job, spec)
            case S.RECOVERING:
                return self._recover(job, spec)
            case S.CANCELLING:
                self._delete_machines(job, "the job was cancelled")
                return self._move(job, S.CANCELLED, "machine deleted after cancel")
            case _:
                return False

    def _stage(self, job: Job, spec: JobSpec) -> bool:
        try:
            uri = self.stager(spec, str(job.id), project_id=str(job.project_id), should_stop=self._should_stop_staging)
        except StagingStopped:
            return True  # re-read: the job is CANCELLING, or the loop ends because the worker stops
        except ProgramError as exc:
            return self._move(job, S.FAILED, "program rejected", error=str(exc))
        except DatasetError as exc:
            return self._move(job, S.FAILED, "dataset rejected", error=f"dataset: {exc}")
        if (refusal := teacher_refusal(self.factory, job, spec, uri)) is not None:
            return self._move(job, S.FAILED, "teacher rejected", error=refusal)
        note = f"dataset staged at {uri}" if uri else "no dataset to stage: the program names none"
        return self._move(job, S.PROVISIONING, note, record={"dataset_uri": uri})

    def _provision(self, job: Job, spec: JobSpec) -> bool:
        request = self._request(job, spec)
        machine = self.provisioner.get(request)
        if machine is None:
            self.channel.prepare(str(job.id), job.attempt, spec, job.dataset_uri or "")
            self._note(job, request, "requested_at")
            try:
                machine = self.provisioner.create(request)
                prometheus.MACHINES_CREATED.inc()
            except NoCapacity as exc:
                log.info("job %s waits for capacity: %s", job.id, exc)
                return False
            except RateLimited:  # the project's request quota, not this machine: the next step asks again
                raise
            except MachineRefused as exc:  # quota, permission, invalid request: retrying cannot help
                self._delete_machines(job, "the cloud refused the machine")
                return self._move(job, S.FAILED, "the cloud refused the machine", error=str(exc))
            except Exception as exc:  # quota, stockout, bad request: the cloud's message is the reason
                log.warning("creating %s failed: %s", request.name, exc)
                return self._move(job, S.RECOVERING, f"create failed: {exc}")
        if machine.refused is not None:  # e.g. the capacity wait ran out: another attempt would wait again
            self._delete_machines(job, "the cloud gave up on the machine")
            return self._move(job, S.FAILED, "the cloud gave up on the machine", error=machine.refused)
        if machine.waiting_for_capacity:
            self._waiting_seen = time.monotonic()  # the boot clock starts once capacity comes
            return False
        if machine.state in (MachineState.PREEMPTED, MachineState.STOPPED):
            # A short job's agent may have trained and exited before the driver first saw it run (its
            # process is a local machine): its last word decides, as in _watch.
            last = self.channel.read_status(str(job.id), job.attempt)
            if last is not None and last.state == AgentState.SUCCEEDED:
                return self._move(job, S.RUNNING, f"agent succeeded on {machine.name}", record={"runtime": last.runtime})
            if last is not None and last.state == AgentState.FAILED:
                return self._attempt_failed(job, last.error)
            return self._move(job, S.RECOVERING, f"machine {machine.state.value.lower()} while starting")
        if machine.state == MachineState.READY:
            self._note(job, request, "ready_at")
        status = self.channel.read_status(str(job.id), job.attempt)
        if status is not None:
            self._note(job, request, "first_report_at")
            self._note_first_step(job, status)
            if status.state in (AgentState.RUNNING, AgentState.SUCCEEDED):
                return self._move(job, S.RUNNING, f"agent {status.state.value} on {machine.name}",
                                  record={"runtime": status.runtime})
            if status.state == AgentState.FAILED:
                return self._attempt_failed(job, status.error)
        booting = _age(job.provisioning_at)
        if self._waiting_seen is not None:
            booting = min(booting, time.monotonic() - self._waiting_seen)
        if booting > self.config.boot_timeout_s:
            return self._move(job, S.RECOVERING, f"agent did not report within {self.config.boot_timeout_s:.0f}s")
        return False

    def _watch(self, job: Job, spec: JobSpec) -> bool:
        request = self._request(job, spec)
        if (limit := self._limit_exceeded(job, spec)) is not None:
            self._delete_machines(job, limit)
            return self._move(job, S.FAILED, limit, error=limit)
        status = None
        if self._status_cadence.due():
            status = self.channel.read_status(str(job.id), job.attempt)
            self._status_cadence.read(status)
        if status is not None:
            self._note_first_step(job, status)
            progress = {"progress": status.progress, "metrics": status.metrics, "runtime": status.runtime}
            if status.state == AgentState.SUCCEEDED:
                return self._finish_succeeded(job, status, "agent finished; machine deleted")
            advice = self._advice(job, status.runtime, status.metrics, final=False)
            if advice or progress != self._recorded:  # a heartbeat alone changes nothing a user sees
                self._record(**progress, **advice)
                self._recorded = progress
            if status.state == AgentState.FAILED:
                return self._attempt_failed(job, status.error)
        machine = self.provisioner.get(request)
        if machine is None or machine.state in (MachineState.PREEMPTED, MachineState.STOPPED):
            # The agent may have finished between the read above and this look at its machine (a local
            # agent writes its last status and exits, and its process is the machine): its word decides.
            last = self.channel.read_status(str(job.id), job.attempt)
            if last is not None and last.state == AgentState.SUCCEEDED:
                return self._finish_succeeded(job, last, "agent finished; machine deleted")
            if last is not None and last.state == AgentState.FAILED:
                return self._attempt_failed(job, last.error)
            what = "gone" if machine is None else machine.state.value.lower()
            return self._move(job, S.RECOVERING, f"machine {request.name} {what} before the agent finished")
        if status is not None and _age(status.heartbeat_at) > self.config.agent_stale_s:
            return self._move(job, S.RECOVERING, f"agent silent for {_age(status.heartbeat_at):.0f}s")
        return False

    def _recover(self, job: Job, spec: JobSpec) -> bool:
        """After a lost machine or a dead worker: an attempt whose agent finished is judged by what the
        agent said, whatever became of its machine (a finished local agent's process has exited; a
        dead worker saw neither); else adopt what still runs; else start a new attempt."""
        status = self.channel.read_status(str(job.id), job.attempt) if job.attempt else None
        if status is not None and status.state == AgentState.SUCCEEDED:
            return self._finish_succeeded(job, status, "the agent had finished; machine deleted")
        # An attempt failed for the machine's reason (error.retry) goes on below to the next attempt.
        retried: AgentError | None = None
        if status is not None and status.state == AgentState.FAILED:
            if status.error is None or not status.error.retry:
                return self._finish_failed(job, status.error)
            retried = status.error
        request = self._request(job, spec)
        machine = self.provisioner.get(request) if job.attempt else None
        if (machine and machine.state == MachineState.READY and status and status.state == AgentState.RUNNING
                and _age(status.heartbeat_at) < self.config.agent_stale_s):
            return self._move(job, S.RUNNING, f"adopted running machine {machine.name}")
        if job.dataset_uri is None:
            return self._move(job, S.STAGING, "restaging: the previous worker had not finished staging")
        self._delete_machines(job, f"attempt {job.attempt} was given up")
        if job.attempt > spec.limits.max_retries:
            limit = f"limits.max_retries is {spec.limits.max_retries}"
            error = (f"machine lost {job.attempt} times; {limit}" if retried is None
                     else f"attempt {job.attempt} failed and {limit}: {retried.summary()}")
            return self._move(job, S.FAILED, "retries exhausted", error=error)
        return self._move(job, S.PROVISIONING, f"starting attempt {job.attempt + 1}", bump_attempt=True)

    # --- a step that raised ---

    def _step_succeeded(self, job: Job) -> None:
        self._failed_in_a_row = 0
        if job.driver_failures:
            with transaction(self.factory) as session:
                jobdata.reset_driver_failures(session, job.id, self.owner)

    def _step_failed(self, exc: Exception) -> None:
        self._failed_in_a_row += 1
        # Before is_outage, which takes the 429 a RateLimited may carry as its cause for storage's.
        rate_limited = isinstance(exc, RateLimited)
        prometheus.DRIVER_ERRORS.labels("rate_limited" if rate_limited else "outage" if is_outage(exc) else "error").inc()
        if rate_limited:  # the project's quota, shared by every job: the machine watch logs it once per change
            log.info("job %s: the cloud's rate quota refused a call; retrying, not counted as a failure: %s",
                     self.job_id, exc)
        elif is_outage(exc):
            log.warning("job %s: a service is unreachable (%s); retrying, not counted as a failure",
                        self.job_id, _describe(exc))
        else:
            log.error("job %s: driver step failed", self.job_id, exc_info=exc)
            failures = self._count_failure()
            if failures is not None and failures >= self.config.max_driver_failures:
                self._give_up(exc, failures)
                return
        delay = min(self.config.retry_backoff_s * 2 ** (self._failed_in_a_row - 1), self.config.retry_backoff_max_s)
        self.wake.wait(delay)
        self.wake.clear()

    def _count_failure(self) -> int | None:
        """The row's count after this failure; None when it cannot be written (then the database is
        what failed, and a failure nobody can record is not held against the job) or the job is no
        longer ours."""
        try:
            with transaction(self.factory) as session:
                return jobdata.count_driver_failure(session, self.job_id, self.owner)
        except Exception as exc:
            log.warning("job %s: could not record the failure: %s", self.job_id, _describe(exc))
            return None

    def _give_up(self, exc: Exception, failures: int) -> None:
        error = f"the worker could not drive this job: {_describe(exc)}"
        try:
            job = self._load()
            if job is None or job.lease_owner != self.owner or job.status in TERMINAL:
                return
            try:
                self._delete_machines(job, error)
            except Exception:
                log.warning("job %s: could not delete its machines", self.job_id, exc_info=True)
            # A cancel whose teardown keeps failing still ends as the user asked, with the error kept.
            to = S.CANCELLED if job.status == S.CANCELLING else S.FAILED
            self._move(job, to, f"driver failed {failures} times in a row", error=error, step_worked=False)
        except StaleTransition:
            pass  # moved underneath us: the next step re-reads
        except Exception:
            log.exception("job %s: could not end the job after %d failures; retrying", self.job_id, failures)

    # --- helpers ---

    def _finish_succeeded(self, job: Job, status: AgentReport, reason: str) -> bool:
        # Machine first: once it is gone the job's code can no longer change what is read next. The
        # manifest is copied into the row, where downloads are checked against it.
        self._delete_machines(job, "the job succeeded")
        metrics = self.channel.final_metrics(str(job.id)) or status.metrics
        artifacts = self.channel.artifact_manifest(str(job.id))
        return self._move(job, S.SUCCEEDED, reason, record={"progress": status.progress, "metrics": metrics,
                                                            "runtime": status.runtime, "artifacts": artifacts})

    def _attempt_failed(self, job: Job, error: AgentError | None) -> bool:
        """The agent said its attempt failed: the job fails with its error, unless the attempt failed for
        the machine's reason (error.retry: its program killed by a signal, the kernel's out-of-memory
        killer say), which goes RECOVERING like a lost machine, and on to another attempt there."""
        if error is not None and error.retry:
            first_line = error.message.split("\n", 1)[0]
            return self._move(job, S.RECOVERING, f"attempt {job.attempt} failed: {first_line[:500]}")
        return self._finish_failed(job, error)

    def _finish_failed(self, job: Job, error: AgentError | None) -> bool:
        self._delete_machines(job, "the job failed")
        return self._move(job, S.FAILED, "agent failed", error=(error or AgentError()).summary())

    def _limit_exceeded(self, job: Job, spec: JobSpec) -> str | None:
        elapsed = timedelta(seconds=_age(job.provisioning_at))
        if elapsed > spec.limits.max_runtime:
            return f"exceeded limits.max_runtime ({spec.limits.max_runtime})"
        if spec.limits.max_cost_usd is not None:
            cost = hourly_price_usd(spec) * elapsed.total_seconds() / 3600
            if cost > spec.limits.max_cost_usd:
                return f"exceeded limits.max_cost_usd ({cost:.2f} > {spec.limits.max_cost_usd:.2f} USD)"
        return None

    def _request(self, job: Job, spec: JobSpec) -> MachineRequest:
        job_id = str(job.id)
        job_dir = self.channel.job_dir(job_id)
        # From the row and the worker-written manifest only, once per driver (the manifest of a staged
        # dataset never changes): the same boundary at create and when a new worker adopts the machine.
        if self._boundary is None or self._boundary[0] != job.dataset_uri:
            self._boundary = (job.dataset_uri, job_boundary(job_id, spec, job.dataset_uri, job_dir))
        return MachineRequest(job_id, max(job.attempt, 1), spec, job_dir, self._boundary[1],
                              project_id=str(job.project_id))

    def _delete_machines(self, job: Job, reason: str) -> None:
        # The stop request first: an agent the delete does not reach (a machine the cloud keeps, a
        # local process the worker lost) stops itself when its watchdog reads it. Best effort: the
        # delete below is what counts, and an agent that cannot read its job directory stops too.
        if job.attempt:
            try:
                self.channel.request_stop(str(job.id), job.attempt, reason)
            except Exception as exc:
                log.warning("job %s: could not write the stop request: %s", job.id, _describe(exc))
        # By label, not just the recorded name: a worker that died between create and record leaves
        # a machine only the label finds.
        for m in self.provisioner.list({LABEL_JOB: str(job.id)}):
            self.provisioner.delete(m.name)
            prometheus.MACHINES_DELETED.inc()
            attempt = m.labels.get(LABEL_ATTEMPT, "")
            self._note(job, None, "deleted_at", name=m.name, attempt=int(attempt) if attempt.isdigit() else job.attempt)

    def _note(self, job: Job, request: MachineRequest | None, event: timings.MachineEvent, *, name: str = "",
              attempt: int = 0) -> None:
        """A machine timing for the job's figures (issue 10 §4), once per machine and event. Best effort:
        a figure is not worth failing a step for."""
        key = (request.name, request.attempt, event) if request is not None else (name, attempt, event)
        if key in self._noted:
            return
        try:
            with transaction(self.factory) as session:
                timings.note_machine(session, job.id, self.owner, key[0], key[1], event, datetime.now(UTC))
            self._noted.add(key)
        except Exception as exc:
            log.warning("job %s: could not record %s of %s: %s", job.id, event, key[0], _describe(exc))

    def _note_first_step(self, job: Job, status: AgentReport) -> None:
        if status.first_step_at is None or job.first_step_at is not None or ("", 0, "first_step") in self._noted:
            return
        try:
            with transaction(self.factory) as session:
                timings.note_first_step(session, job.id, self.owner, status.first_step_at)
            self._noted.add(("", 0, "first_step"))
        except Exception as exc:
            log.warning("job %s: could not record its first step: %s", job.id, _describe(exc))

    def _advice(self, job: Job, runtime: Any, metrics: Any, *, final: bool) -> dict[str, Any]:
        """{"advice": [...]} when the job's advice changed, to write with the progress it comes from; else {}."""
        if self._advisor is None or self._spec is None:
            return {}
        machines = job.machines
        if final and (fresh := self._load()) is not None:
            machines = fresh.machines  # the ends of the machines just deleted are on the row, not on `job`
        advice = self._advisor.changed(self._spec, runtime=runtime, metrics=metrics, machines=machines,
                                       attempts=job.attempt, final=final)
        return {} if advice is None else {"advice": advice}

    def _load(self) -> Job | None:
        with transaction(self.factory) as session:
            return session.get(Job, self.job_id)

    def _record(self, **fields: object) -> None:
        with transaction(self.factory) as session:
            jobdata.record_progress(session, self.job_id, self.owner, **fields)

    def _move(self, job: Job, to: JobStatus, reason: str, *, error: str | None = None, bump_attempt: bool = False,
              record: dict[str, Any] | None = None, step_worked: bool = True) -> bool:
        """Move the job; `record` (what the agent or staging reported) is written in the same
        transaction, so the row never shows the new status without it, or it without the status. A job
        that had a machine ends with its advice from everything it reported (FAILED and CANCELLED too)."""
        if to in TERMINAL and job.attempt:
            record = record or {}
            record |= self._advice(job, record.get("runtime", job.runtime), record.get("metrics", job.metrics),
                                   final=True)
        with transaction(self.factory) as session:
            if record:
                jobdata.record_progress(session, job.id, self.owner, **record)
            if step_worked and job.driver_failures:  # reset while the lease (gone once terminal) is ours
                jobdata.reset_driver_failures(session, job.id, self.owner)
                job.driver_failures = 0
            transition(session, job.id, job.status, to, reason=reason, owner=self.owner, error=error,
                       bump_attempt=bump_attempt)
        log.info("job %s: %s -> %s (%s)", job.id, job.status.value, to.value, reason)
        prometheus.left_phase(job, job.status)
        return True


def _describe(exc: BaseException) -> str:
    # SQLAlchemy's text carries the statement and its parameters; the driver's own words are enough.
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        exc = exc.orig
    return f"{type(exc).__name__}: {exc}"


def _age(t: datetime | None) -> float:
    return 0.0 if t is None else (datetime.now(UTC) - t).total_seconds()
