"""/v1/sweeps (issue 22): submit a sweep, read it and its trials, cancel it. The worker's sweep engine
(worker/sweeps.py) runs it; each trial is an ordinary job of the project (labels sweep, trial)."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Request, Response
from pydantic import ValidationError

from service.db import quotas
from service.db import sweeps as data
from service.db.admission import Admission, NotAdmitted, Refusal, source_refusals
from service.db.models import Job, Sweep, SweepTrial
from service.db.projects import hash_key
from service.deps import ApiSecret, Factory, ReadFactory, SessionFactory, in_db_thread, project_transaction
from service.errors import ApiError, error_response, refused
from service.request_body import ParsedOffLoop, deferred, in_parse_thread, validate
from service.schemas import AUTHED, SweepList, SweepPublic, TrialList, TrialPublic, error_responses
from service.sweep_rate import RATE, TooManySweeps
from trainjobs.spec import JobSpec
from trainjobs.spec.sweep import ADMIT_TRIAL, SweepSpec
from trainjobs.states import SweepStatus, TrialState

router = APIRouter(prefix="/v1/sweeps", tags=["sweeps"], route_class=ParsedOffLoop)

# What every trial shares with the job it starts from: its data, its code and its teacher, checked once
# at submit (and by the worker again at each trial's staging).
_SHARED = ("dataset.source", "model.module", "program.source", "training.distillation.teacher_job")
SweepBody = Annotated[Any, Body(), deferred(SweepSpec)]


def _not_found(sweep_id: uuid.UUID) -> ApiError:
    return ApiError(404, f"sweep {sweep_id} not found")


@router.post("", status_code=201, response_model=SweepPublic, responses=error_responses(*AUTHED, 400, 413))
async def submit_sweep(request: Request, body: SweepBody, secret: ApiSecret, factory: Factory) -> Response | SweepPublic:
    # The key first (a 401 costs no count and no checks), then its rate, then the checks, off the event
    # loop (service/request_body.py): a sweep's body is the costliest the API validates.
    admission = await in_db_thread(request, _admission, secret, factory)
    try:
        RATE.take(hash_key(secret))
    except TooManySweeps as exc:
        return error_response(429, "too_many_requests", str(exc), headers={"Retry-After": str(exc.retry_after_s)})
    spec, job = await in_parse_thread(request, _checked, body, admission)
    return await in_db_thread(request, _submit, spec, job, secret, factory)


def _admission(secret: str, factory: SessionFactory) -> Admission:
    with project_transaction(factory, secret) as (project, session):
        return Admission.load(session, project)


def _checked(body: Any, admission: Admission) -> tuple[SweepSpec, JobSpec]:
    """The sweep validated (every trial's spec checked: trainjobs/spec/sweep.py), and admitted as its
    trials would be: the job, and the trial of every value checked of every parameter (issue 36, 5)."""
    try:  # the job itself first, so that what it asks for is named job.<field>, not after a parameter
        job = JobSpec.model_validate(body.get("job") if isinstance(body, dict) else None)
    except ValidationError:
        job = None  # the sweep's validation says why, naming `job`
    if job is not None and (refusals := admission.sizing(job)):
        raise refused([Refusal(f"job.{r.field}", r.reason, r.code) for r in refusals])

    def admit(path: str, value: Any, trial: JobSpec) -> None:  # in the pass that checks each trial
        if refusals := admission.sizing(trial):
            raise NotAdmitted([Refusal(f"parameters.{path}", f"a trial is not admitted (at {value!r}): {r.field}: "
                                                             f"{r.reason}", r.code) for r in refusals])

    try:
        spec = validate(SweepSpec, body, {ADMIT_TRIAL: admit})
    except NotAdmitted as exc:
        raise refused(exc.refusals) from None
    for path in spec.parameters:
        if any(path == s or path.startswith(f"{s}.") for s in _SHARED):
            raise ApiError(422, f"parameters.{path}: every trial uses the job's own {path}", "invalid_spec",
                           [{"field": f"parameters.{path}", "reason": "the trials share the job's data, code and teacher"}])
    assert job is not None  # the sweep's validation validated it as above
    return spec, job


def _submit(spec: SweepSpec, job: JobSpec, secret: str, factory: SessionFactory) -> SweepPublic:
    with project_transaction(factory, secret) as (project, session):
        # Its data, code and teacher, which every trial shares (their sizes were checked with the trials').
        if refusals := source_refusals(session, project, job):
            raise refused(refusals)
        stored = spec.model_dump(mode="json")
        # Stored resolved: the goal the metric implies, and how many trials run at most.
        stored["objective"]["goal"], stored["max_trials"] = spec.objective.direction, spec.trials
        if too_many := data.active_sweeps_refusal(session, project):  # issue 36 (4): each steps in turn
            raise ApiError(429, too_many, "too_many_active_sweeps", [{"field": "sweep", "reason": too_many}])
        sweep = data.create_sweep(session, project, stored)
        return sweep_public(session, project, sweep)


@router.get("", response_model=SweepList, responses=error_responses(*AUTHED))
async def list_sweeps(request: Request, secret: ApiSecret, factory: ReadFactory,
                      limit: Annotated[int, Query(ge=1, le=200)] = 50) -> SweepList:
    return await in_db_thread(request, _list, secret, factory, limit)


def _list(secret: str, factory: SessionFactory, limit: int) -> SweepList:
    with project_transaction(factory, secret) as (project, session):
        return SweepList(sweeps=[sweep_public(session, project, s) for s in data.list_sweeps(session, project, limit)])


@router.get("/{sweep_id}", response_model=SweepPublic, responses=error_responses(*AUTHED, 404))
async def get_sweep(request: Request, sweep_id: uuid.UUID, secret: ApiSecret, factory: ReadFactory) -> SweepPublic:
    return await in_db_thread(request, _get, sweep_id, secret, factory)


def _get(sweep_id: uuid.UUID, secret: str, factory: SessionFactory) -> SweepPublic:
    with project_transaction(factory, secret) as (project, session):
        sweep = data.get_sweep(session, project, sweep_id)
        if sweep is None:
            raise _not_found(sweep_id)
        return sweep_public(session, project, sweep)


@router.get("/{sweep_id}/trials", response_model=TrialList, responses=error_responses(*AUTHED, 404))
async def sweep_trials(request: Request, sweep_id: uuid.UUID, secret: ApiSecret, factory: ReadFactory) -> TrialList:
    return await in_db_thread(request, _trials, sweep_id, secret, factory)


def _trials(sweep_id: uuid.UUID, secret: str, factory: SessionFactory) -> TrialList:
    with project_transaction(factory, secret) as (project, session):
        if data.get_sweep(session, project, sweep_id) is None:
            raise _not_found(sweep_id)
        rows = data.trials_with_jobs(session, sweep_id)
        reasons = quotas.wait_reasons(session, project, [j for _, j in rows])
        return TrialList(trials=[trial_public(t, j, reasons.get(j.id)) for t, j in rows])


@router.post("/{sweep_id}/cancel", status_code=202, response_model=SweepPublic, responses=error_responses(*AUTHED, 404))
async def cancel_sweep(request: Request, sweep_id: uuid.UUID, secret: ApiSecret, factory: Factory) -> SweepPublic:
    return await in_db_thread(request, _cancel, sweep_id, secret, factory)


def _cancel(sweep_id: uuid.UUID, secret: str, factory: SessionFactory) -> SweepPublic:
    with project_transaction(factory, secret) as (project, session):
        sweep = data.request_cancel(session, project, sweep_id)
        if sweep is None:
            raise _not_found(sweep_id)
        return sweep_public(session, project, sweep)


def trial_public(trial: SweepTrial, job: Job, wait_reason: str | None = None) -> TrialPublic:
    return TrialPublic(number=trial.number, state=trial.state, params=trial.params, value=trial.value,
                       curve=trial.curve, job_id=job.id, job_status=job.status, job_error=job.error,
                       cost_usd=trial.cost_usd, accelerator_seconds=trial.accelerator_s, created_at=trial.created_at,
                       finished_at=trial.finished_at, wait_reason=wait_reason)


def sweep_public(session: Any, project: uuid.UUID, sweep: Sweep) -> SweepPublic:
    objective = sweep.spec["objective"]  # its goal resolved at submit
    rows = data.trials_with_jobs(session, sweep.id)
    counts = {state.value: 0 for state in TrialState}
    for trial, _ in rows:
        counts[trial.state] = counts.get(trial.state, 0) + 1
    counts["planned"] = int(sweep.spec["max_trials"])
    done = [(t, j) for t, j in rows if t.state == TrialState.COMPLETE and t.value is not None]
    best = None
    if done:
        pick = max if objective["goal"] == "maximize" else min
        best = trial_public(*pick(done, key=lambda tj: float(tj[0].value or 0.0)))
    wait = None
    if sweep.status == SweepStatus.RUNNING:
        reasons = quotas.wait_reasons(session, project, [j for t, j in rows if t.state == TrialState.RUNNING])
        wait = next(iter(reasons.values()), None)
    return SweepPublic(
        id=sweep.id, name=sweep.name, status=sweep.status, spec=sweep.spec,
        objective={"metric": objective["metric"], "goal": objective["goal"]}, created_at=sweep.created_at,
        updated_at=sweep.updated_at, finished_at=sweep.finished_at, note=sweep.note, trials=counts, best=best,
        cost_usd=round(sum(t.cost_usd for t, _ in rows), 6),
        accelerator_seconds=round(sum(t.accelerator_s for t, _ in rows), 3), wait_reason=wait)
