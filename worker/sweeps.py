"""The sweep engine (issue 22): drives each active sweep from one place, with Optuna's ask-and-tell.

Each tick a worker leases the most overdue active sweeps, in turns across projects (service/db/sweeps.py
LEASE_SQL), steps each in a thread of a small pool, in a transaction of its own, and releases its lease
when the step ends: any worker takes the most overdue next, a slow step holds only its own sweep, and a
sweep whose trials only wait holds no worker's place (issue 36, findings 2 and 4). Per sweep, each step:
1. a trial Optuna holds as running but no job runs for (the worker stopped between asking and
   submitting) gets its job now, with the parameters Optuna gave it: no trial lost, none run twice
   (its job is created with an idempotency key of the sweep and the trial's number);
2. each running trial is followed: every epoch's objective its job wrote (metrics.json, read at a bounded
   cost: worker/sweep_curves.py) is reported to the study as an intermediate value, up to the job's last
   epoch and a bounded number a step; when the pruner says so, the job is cancelled with the reason
   "pruned by the sweep" and the trial told PRUNED; a job that ended is told COMPLETE with its final
   value of the objective, or FAIL;
3. while fewer than parallel_trials run, more are asked for, up to the sweep's trials and within
   limits.max_cost_usd (each trial may spend at most what is left, as its own max_cost_usd); a trial
   refused as a job is told FAIL, and after REFUSALS_PER_STEP of them the next step asks on;
4. the sweep ends when nothing runs, nothing more may be asked and every trial's job has ended (a
   pruned one's machine torn down): SUCCEEDED with a best trial, FAILED without one, or CANCELLED
   after a cancel (every running trial's job cancelled with it).

Optuna's own state is the truth about a trial: when it says a trial ended and our row does not yet
(the worker stopped between the two), the row follows it. Optuna's heartbeats do not work with
ask-and-tell; the sweep's lease (one step long) and the jobs' own leases are the liveness.

Samplers are rebuilt for each ask, seeded with the sweep's seed plus the trials asked so far, so a
restarted worker asks on as the first would have, never repeating the first random draws.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import uuid
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from service.db import jobs as job_data
from service.db import sweeps as data
from service.db.admission import Admission, NotAdmitted
from service.db.models import Job, Sweep, SweepTrial
from service.db.session import transaction
from trainjobs.job_paths import JobPaths
from trainjobs.spec import parse_stored
from trainjobs.spec.derived import hourly_price_usd, job_accelerators
from trainjobs.spec.job import JobSpec
from trainjobs.spec.sweep import SweepSpec, first_reason, trial_spec
from trainjobs.states import JobStatus, SweepStatus, TrialState
from trainjobs.storage_limits import WORKER_LIMITS, limited_calls
from worker.sweep_curves import is_number, last_epoch, read_new_epochs

log = logging.getLogger("trainjobs.worker.sweeps")

PRUNED_REASON = "pruned by the sweep"
CANCELLED_REASON = "cancelled with its sweep"
SPENT = "stopped asking for trials: limits.max_cost_usd is spent"
OPTUNA_SCHEMA = "optuna"


@dataclass
class SweepConfig:
    poll_s: float = 2.0  # a tick when no notification wakes the loop sooner
    step_every_s: float | None = None  # a sweep is stepped at most this often (None: poll_s)
    lease_s: float = 30.0  # a leased sweep not stepped by then (its worker stopped) is anyone's again
    max_sweeps: int = 32  # sweeps one worker leases a tick (and has leased, not yet stepped, at most)
    step_threads: int = 4  # sweeps stepped at once, each in its own transaction
    # A tick waits this long for its steps; one still running then ends on its own while the next tick
    # leases and steps other sweeps (its sweep stays locked, so no worker steps it twice at once).
    tick_wait_s: float = 10.0


SPECS_KEPT = 1024  # parsed sweep specs a worker keeps (any worker may step any sweep)
# Trials one step may see refused before it leaves the rest to the sweep's next steps: a sweep whose
# every trial is refused (its job's rules, the deployment's limits) asked all of max_trials (up to 1,000,
# ~20 ms of Optuna writes each) in one step, holding a step thread for 20 s (issue 36, finding 2).
REFUSALS_PER_STEP = 8


def startup_trials(trials: int) -> int:
    """Trials that run to the end before the median pruner may stop any: a quarter of the sweep, 1 to 5."""
    return min(5, max(1, trials // 4))


class SweepEngine:
    def __init__(self, engine: Engine, factory: sessionmaker[Session], owner: str, stopping: threading.Event,
                 config: SweepConfig | None = None):
        self.engine, self.factory, self.owner, self.stopping = engine, factory, owner, stopping
        self.config = config or SweepConfig()
        self.wake = threading.Event()
        self._storage: Any = None
        self._storage_lock = threading.Lock()
        self._specs: OrderedDict[uuid.UUID, SweepSpec] = OrderedDict()
        self._specs_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(self.config.step_threads, thread_name_prefix="sweep-step")
        self._in_flight: dict[uuid.UUID, Future[None]] = {}  # leased by this worker, stepping or queued

    # --- the loop ---

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                if self.tick():
                    continue  # a full batch: more sweeps may be due now
            except Exception as exc:
                log.warning("sweep tick failed; retrying in %.1fs: %s", self.config.poll_s, exc)
            self.wake.wait(self.config.poll_s)
            self.wake.clear()

    def tick(self) -> bool:
        """Lease the most overdue of the sweeps due, as many as this worker has room for, and step them in
        the pool. True when it leased all it had room for: others may be due still."""
        self._in_flight = {k: f for k, f in self._in_flight.items() if not f.done()}
        room = self.config.max_sweeps - len(self._in_flight)
        if room <= 0 or self.stopping.is_set():
            return False
        every_s = self.config.poll_s if self.config.step_every_s is None else self.config.step_every_s
        with transaction(self.factory) as session:
            leased = data.lease_sweeps(session, self.owner, self.config.lease_s, room, every_s)
        started = {sweep_id: self._pool.submit(self._step_leased, sweep_id) for sweep_id in leased}
        self._in_flight.update(started)
        wait(started.values(), timeout=self.config.tick_wait_s)
        return len(leased) == room

    def _step_leased(self, sweep_id: uuid.UUID) -> None:
        if self.stopping.is_set():  # release_all gives its lease back
            return
        try:
            with limited_calls(WORKER_LIMITS):
                self.step(sweep_id)
        except Exception:
            log.exception("sweep %s: step failed; it is tried again in its next turn", sweep_id)
            try:  # its turn passes all the same: a sweep that fails every step must not hold the first place
                with transaction(self.factory) as session:
                    data.release_stepped(session, sweep_id, self.owner)
            except Exception:
                log.warning("sweep %s: could not release its lease; it expires in %.0fs", sweep_id,
                            self.config.lease_s)

    def release_all(self) -> None:
        """On shutdown: sweeps leased and not yet stepped are anyone's at once, so the next worker drives them now."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        try:
            with transaction(self.factory) as session:
                data.release_sweeps(session, self.owner)
        except Exception:
            log.warning("could not release sweep leases; they expire in %.0fs", self.config.lease_s)

    # --- one sweep ---

    def step(self, sweep_id: uuid.UUID) -> None:
        """One step of a sweep this worker leased, which gives the lease back in the step's own transaction."""
        with transaction(self.factory) as session:
            sweep = data.leased_sweep(session, sweep_id, self.owner)
            if sweep is None:  # its lease lapsed while the step waited, and another worker has it
                return
            if not SweepStatus(sweep.status).terminal:
                self._advance(session, sweep)
            data.release_stepped(session, sweep.id, self.owner)

    def _advance(self, session: Session, sweep: Sweep) -> None:
        try:
            spec = self._spec(sweep)
        except ValidationError as exc:  # stored under rules since tightened: no step of it can ever succeed
            self._abandon(session, sweep, f"the sweep's spec is no longer valid: {first_reason(exc)}")
            return
        study = self._study(sweep, spec)
        rows = {t.number: (t, job) for t, job in data.trials_with_jobs(session, sweep.id)}
        import optuna

        for frozen in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            if frozen.number not in rows:  # asked, then the worker stopped before its job was made
                log.info("sweep %s: trial %d had no job; submitting it", sweep.id, frozen.number)
                # The rules may have changed since it was asked: one refused now is told FAIL, as below,
                # instead of failing this sweep's every step.
                self._submit_or_fail(session, study, sweep, spec, frozen.number, frozen._trial_id,
                                     dict(frozen.params), rows)
        for trial, job in rows.values():
            if trial.state == TrialState.RUNNING:
                self._follow(session, study, sweep, spec, trial, job)
            elif not JobStatus(job.status).terminal:  # a pruned trial's job tearing down: still spending
                _account(trial, job)
        running = sum(1 for t, _ in rows.values() if t.state == TrialState.RUNNING)
        # Every trial's job has ended: nothing of the sweep holds a machine any more.
        settled = all(JobStatus(j.status).terminal for _, j in rows.values())
        if sweep.status == SweepStatus.CANCELLING:
            for trial, job in rows.values():
                if trial.state == TrialState.RUNNING:
                    self._end(session, study, trial, job, TrialState.FAIL, cancel=CANCELLED_REASON)
            if settled:
                self._finish(session, sweep, SweepStatus.CANCELLED, sweep.note or "cancel requested by user")
            return
        note = None
        # Asked so far: every trial Optuna handed out (a grid's queued cells not yet), one refused as a
        # job included, so a refusal counts against max_trials instead of being asked again forever.
        asked = sum(1 for t in study.get_trials(deepcopy=False) if t.state != optuna.trial.TrialState.WAITING)
        refused = 0
        while running < spec.parallel_trials and asked < spec.trials and refused < REFUSALS_PER_STEP:
            cap = self._budget_left(spec, rows)
            if cap is not None and cap < 0.01:
                note = SPENT
                break
            number, trial_id, params = self._ask(study, spec, asked)
            asked += 1
            if not self._submit_or_fail(session, study, sweep, spec, number, trial_id, params, rows, cap):
                refused += 1
                continue
            running += 1
            if sweep.note == SPENT:  # it had waited for running trials to leave some of the budget
                sweep.note = None
        if running == 0 and settled and (asked >= spec.trials or note is not None):
            completed = [t for t, _ in rows.values() if t.state == TrialState.COMPLETE]
            note = note or sweep.note  # what an earlier tick had to say stays said
            if completed:
                self._finish(session, sweep, SweepStatus.SUCCEEDED, note)
            else:
                self._finish(session, sweep, SweepStatus.FAILED, note or "no trial completed")
        else:
            sweep.updated_at = _now()
            if note is not None:
                sweep.note = note

    def _spec(self, sweep: Sweep) -> SweepSpec:
        # Parsed once per sweep: its spec never changes, and checking every trial's spec is not free.
        with self._specs_lock:
            if (spec := self._specs.get(sweep.id)) is not None:
                self._specs.move_to_end(sweep.id)
                return spec
        spec = SweepSpec.model_validate(sweep.spec)
        with self._specs_lock:
            self._specs[sweep.id] = spec
            while len(self._specs) > SPECS_KEPT:
                self._specs.popitem(last=False)
        return spec

    def _optuna_storage(self) -> Any:
        with self._storage_lock:  # one storage (and connection pool) for every step thread
            if self._storage is None:
                import optuna

                optuna.logging.set_verbosity(optuna.logging.WARNING)
                url = self.engine.url.render_as_string(hide_password=False)
                self._storage = optuna.storages.RDBStorage(url, engine_kwargs={
                    "pool_pre_ping": True, "connect_args": {"options": f"-c search_path={OPTUNA_SCHEMA}"}})
            return self._storage

    def _study(self, sweep: Sweep, spec: SweepSpec) -> Any:
        import optuna

        name = f"sweep-{sweep.id}"
        storage = self._optuna_storage()
        try:
            return optuna.load_study(study_name=name, storage=storage, pruner=_pruner(spec))
        except KeyError:
            pass
        study = optuna.create_study(study_name=name, storage=storage, direction=spec.objective.direction,  # type: ignore[arg-type]
                                    pruner=_pruner(spec), load_if_exists=True)
        if spec.algorithm == "grid" and not study.trials:
            for params in grid(spec)[:spec.trials]:  # asked in this order, each exactly once
                study.enqueue_trial(params)
        return study

    def _ask(self, study: Any, spec: SweepSpec, asked: int) -> tuple[int, int, dict[str, Any]]:
        import optuna

        seed = spec.seed + asked
        sampler = (optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(10, max(2, spec.trials // 3)))
                   if spec.algorithm == "tpe" else optuna.samplers.RandomSampler(seed=seed))
        study.sampler = sampler
        trial = study.ask(distributions(spec))
        return trial.number, trial._trial_id, dict(trial.params)

    def _submit(self, session: Session, sweep: Sweep, spec: SweepSpec, number: int, trial_id: int,
                params: dict[str, Any], rows: dict[int, tuple[SweepTrial, Job]],
                cap: float | None = None) -> tuple[SweepTrial, Job]:
        raw = trial_spec(spec.job, params)
        raw["name"] = f"{spec.name}-trial-{number}"
        raw["labels"] = {**raw.get("labels", {}), "sweep": str(sweep.id), "trial": str(number)}
        if cap is None:
            cap = self._budget_left(spec, rows)
        if cap is not None:
            own = (raw.get("limits") or {}).get("max_cost_usd")
            raw.setdefault("limits", {})["max_cost_usd"] = round(min(cap, own) if own is not None else cap, 6)
        job_spec = JobSpec.model_validate(raw)
        # As POST /v1/jobs admits a job (issue 36, 5): a drawn value may be one submit never checked, or the
        # operator's limits may have changed since.
        if refusals := Admission.load(session, sweep.project_id).refusals(session, job_spec):
            raise NotAdmitted(refusals)
        body = job_spec.model_dump(mode="json")
        key = f"sweep-{sweep.id}-trial-{number}"
        row, _ = job_data.create_job(session, sweep.project_id, body, idempotency_key=key,
                                     request_hash=hashlib.sha256(json.dumps(body, sort_keys=True).encode()).digest(),
                                     accelerators=job_accelerators(job_spec))
        data.add_trial(session, sweep.id, number, trial_id, row.id, params)
        trial = session.get(SweepTrial, (sweep.id, number))
        job = session.get(Job, row.id)
        assert trial is not None and job is not None
        log.info("sweep %s: trial %d is job %s %s", sweep.id, number, row.id, params)
        return trial, job

    def _submit_or_fail(self, session: Session, study: Any, sweep: Sweep, spec: SweepSpec, number: int,
                        trial_id: int, params: dict[str, Any], rows: dict[int, tuple[SweepTrial, Job]],
                        cap: float | None = None) -> bool:
        """The trial's job, into `rows`; True when it was made. A value submit did not check, or one this
        deployment refuses, makes no job: the trial is told FAIL and the sweep's note says why."""
        import optuna

        try:
            rows[number] = self._submit(session, sweep, spec, number, trial_id, params, rows, cap)
        except (ValidationError, NotAdmitted, job_data.IdempotencyConflict) as exc:
            study.tell(number, state=optuna.trial.TrialState.FAIL)
            if isinstance(exc, ValidationError):
                why = f"is not a valid job: {first_reason(exc)}"
            elif isinstance(exc, NotAdmitted):
                why = f"is not admitted: {exc}"
            else:  # the project sent a job of its own under the trial's key (sweep-<id>-trial-<n>)
                why = "has no job: another job of the project holds its idempotency key"
            sweep.note = f"trial {number} {params} {why}"
            log.warning("sweep %s: %s", sweep.id, sweep.note)
            return False
        return True

    def _abandon(self, session: Session, sweep: Sweep, note: str) -> None:
        """A sweep no step can drive any more ends FAILED with the reason, its running trials' jobs cancelled
        (Optuna's study is left as it is: it cannot be loaded without the spec)."""
        log.warning("sweep %s: %s", sweep.id, note)
        for trial, job in data.trials_with_jobs(session, sweep.id):
            if trial.state == TrialState.RUNNING:
                self._record(trial, TrialState.FAIL, None, None)
            if not JobStatus(job.status).terminal:
                job_data.request_cancel(session, job.project_id, job.id, reason=CANCELLED_REASON)
        self._finish(session, sweep, SweepStatus.FAILED, note)

    def _budget_left(self, spec: SweepSpec, rows: dict[int, tuple[SweepTrial, Job]]) -> float | None:
        """What a new trial may spend: the sweep's max_cost_usd less what its trials spent (finished) or
        may still spend (running: their own max_cost_usd)."""
        if spec.limits.max_cost_usd is None:
            return None
        held = 0.0
        for trial, job in rows.values():
            if trial.state == TrialState.RUNNING:
                held += float((job.spec.get("limits") or {}).get("max_cost_usd") or 0.0)  # always set under a limit
            else:
                held += trial.cost_usd
        return spec.limits.max_cost_usd - held

    def _follow(self, session: Session, study: Any, sweep: Sweep, spec: SweepSpec, trial: SweepTrial,
                job: Job) -> None:
        import optuna

        _account(trial, job)  # the job as this step's transaction read it
        frozen = self._optuna_storage().get_trial(trial.optuna_trial_id)
        if frozen.state != optuna.trial.TrialState.RUNNING:  # told before the worker stopped: follow it
            state = TrialState(frozen.state.name)
            self._record(trial, state, frozen.value, frozen.intermediate_values)
            if not JobStatus(job.status).terminal and state == TrialState.PRUNED:
                job_data.request_cancel(session, sweep.project_id, job.id, reason=PRUNED_REASON)
            return
        metric = spec.objective.metric
        if JobStatus(job.status).terminal:
            if self._report(study, sweep, spec, trial, job):
                return  # epochs left to report: told COMPLETE once they are, its curve whole for the pruner
            if job.status == JobStatus.SUCCEEDED:
                value: Any = (job.metrics or {}).get(metric)
                if not is_number(value) and trial.curve:
                    value = trial.curve[-1][1]
                if is_number(value):
                    self._end(session, study, trial, job, TrialState.COMPLETE, value=float(value))
                    return
                log.warning("sweep %s: trial %d's job reported no %s", sweep.id, trial.number, metric)
            self._end(session, study, trial, job, TrialState.FAIL)
            return
        if job.status != JobStatus.RUNNING:
            return
        self._report(study, sweep, spec, trial, job)
        live = optuna.trial.Trial(study, trial.optuna_trial_id)
        # A trial that has reported its last epoch is only exporting: stopping it now saves nothing.
        last_epoch = int((job.spec.get("training") or {}).get("epochs") or 0)
        if (spec.early_stopping is not None and trial.curve and trial.curve[-1][0] < last_epoch
                and live.should_prune()):
            log.info("sweep %s: trial %d pruned at epoch %d (%s %.4g)", sweep.id, trial.number,
                     int(trial.curve[-1][0]), metric, trial.curve[-1][1])
            self._end(session, study, trial, job, TrialState.PRUNED, cancel=PRUNED_REASON)

    def _report(self, study: Any, sweep: Sweep, spec: SweepSpec, trial: SweepTrial, job: Job) -> bool:
        """Epochs' objective the job wrote and the curve lacks, as intermediate values (a bounded number:
        worker/sweep_curves.py). True when the document holds more than this step took."""
        import optuna

        curve = {int(e): float(v) for e, v in trial.curve}
        # Whether the trial's spec as written sets its epochs, without a copy of the sweep's job each step.
        sets_epochs = "training.epochs" in trial.params or "epochs" in (spec.job.get("training") or {})
        epochs = last_epoch(job.spec, sets_epochs)
        read = read_new_epochs(JobPaths.for_job(str(job.id)).metrics, spec.objective.metric, epochs, set(curve),
                               trial.metrics_generation, job_ended=JobStatus(job.status).terminal)
        if read.refused is not None and read.generation != trial.metrics_generation:
            log.warning("sweep %s: trial %d: %s", sweep.id, trial.number, read.refused)
            sweep.note = sweep.note or f"trial {trial.number}: {read.refused}"
        trial.metrics_generation = read.generation
        if read.new:
            live = optuna.trial.Trial(study, trial.optuna_trial_id)
            for epoch, value in read.new:
                live.report(value, epoch)
                curve[epoch] = value
            trial.curve = [[e, v] for e, v in sorted(curve.items())]
        return read.more

    def _end(self, session: Session, study: Any, trial: SweepTrial, job: Job, state: TrialState, *,
             value: float | None = None, cancel: str | None = None) -> None:
        import optuna

        if state == TrialState.COMPLETE:
            study.tell(trial.number, value)
        else:  # PRUNED (Optuna keeps its last intermediate value) or FAIL
            study.tell(trial.number, state=getattr(optuna.trial.TrialState, state.value))
        self._record(trial, state, value, None)
        if cancel is not None and not JobStatus(job.status).terminal:
            job_data.request_cancel(session, job.project_id, job.id, reason=cancel)


    @staticmethod
    def _record(trial: SweepTrial, state: TrialState, value: float | None, curve: dict[int, float] | None) -> None:
        trial.state = state.value
        if value is not None and state == TrialState.COMPLETE:
            trial.value = value
        if curve:
            trial.curve = sorted([int(e), float(v)] for e, v in curve.items())
        trial.finished_at = trial.finished_at or _now()

    def _finish(self, session: Session, sweep: Sweep, status: SweepStatus, note: str | None) -> None:
        log.info("sweep %s: %s%s", sweep.id, status.value, f" ({note})" if note else "")
        data.finish_sweep(session, sweep, status, note, _now())
        with self._specs_lock:  # other step threads reorder it (a UUID's hash runs Python code: no atomic pop)
            self._specs.pop(sweep.id, None)


def _account(trial: SweepTrial, job: Job) -> None:
    """What the trial's job has held so far: accelerators x seconds, and its cost at list price."""
    if job.provisioning_at is None:
        return
    end = job.finished_at or _now()
    seconds = max(0.0, (end - job.provisioning_at).total_seconds())
    spec = parse_stored(job.spec)
    trial.accelerator_s = round(max(1, job_accelerators(spec)) * seconds, 3)
    trial.cost_usd = round(hourly_price_usd(spec) * seconds / 3600, 6)


def _pruner(spec: SweepSpec) -> Any:
    import optuna

    stopping = spec.early_stopping
    if stopping is None:
        return optuna.pruners.NopPruner()
    if stopping.type == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=startup_trials(spec.trials), n_warmup_steps=stopping.min_epochs)
    epochs = int((spec.job.get("training") or {}).get("epochs") or 10)
    return optuna.pruners.HyperbandPruner(min_resource=max(1, stopping.min_epochs), max_resource=max(epochs, 2),
                                          reduction_factor=3)


def distributions(spec: SweepSpec) -> dict[str, Any]:
    """Each parameter as Optuna's distribution."""
    import optuna

    out: dict[str, Any] = {}
    for path, p in spec.parameters.items():
        if p.type == "float":
            out[path] = optuna.distributions.FloatDistribution(p.low, p.high, log=p.log, step=p.step)
        elif p.type == "int":
            out[path] = optuna.distributions.IntDistribution(p.low, p.high, log=p.log, step=p.step)
        else:
            out[path] = optuna.distributions.CategoricalDistribution(p.choices)
    return out


def grid(spec: SweepSpec) -> list[dict[str, Any]]:
    """Every combination of the parameters' values, the first parameter's slowest."""
    import itertools

    values = [p.values() or [] for p in spec.parameters.values()]
    return [dict(zip(spec.parameters, combo, strict=True)) for combo in itertools.product(*values)]


def _now() -> datetime:
    return datetime.now(timezone.utc)
