"""`python -m agent --job-dir gs://BUCKET/jobs/<id> [--task-index N]`

Exit status: 0 succeeded, 1 failed (status.json says why), 143 terminated by SIGTERM or stopped by the
watchdog (agent/watchdog.py: the control plane asked, or the job directory stayed unreachable).

Settings (environment): TRAINJOBS_WATCHDOG_EVERY_S (30) how often the job directory is read,
TRAINJOBS_WATCHDOG_UNREACHABLE_S (300) how long it may stay unreachable, TRAINJOBS_TERM_GRACE_S (30) how
long the cleanup after SIGTERM may take before the process exits anyway (storage may be what is gone).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from trainjobs import storage
from trainjobs.job_paths import JobPaths
from trainjobs.messages import AgentError, AgentReport, AgentState
from agent.watchdog import Watchdog, stop_this_machine
from trainjobs.stop_request import term_grace_s
from agent.job import AgentJob, WorkDir, load_job, task_index_from_env
from agent.status import StatusReporter, setup_logging, utc_now
from agent.token_refresh import start_token_refresh

log = logging.getLogger("trainjobs.agent")

EXIT_FAILED, EXIT_TERMINATED = 1, 143


class Terminated(BaseException):
    """SIGTERM arrived (preemption, a delete). BaseException, so no `except Exception` swallows it."""


# Set once the agent is writing its last status: a SIGTERM then (the worker deleting the machine as
# soon as the chief has said it is done) must not cut that write off halfway.
_last_words = threading.Event()
# Set once SIGTERM has arrived: the agent is stopping, and its cleanup (bounded by the grace) writes
# the last status.
_terminating = threading.Event()
# Why the watchdog stopped the agent, if it did: the machine is stopped once the agent's cleanup is over.
_watchdog_reason: str | None = None


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one is enough; let the cleanup finish
    _terminating.set()
    log.warning("SIGTERM%s", " while writing the last status" if _last_words.is_set() else "")
    # ... but not forever: the cleanup writes to storage, which may be what is gone.
    _start_grace(_exit_now)
    if not _last_words.is_set():
        raise Terminated()


def _on_watchdog_stop(reason: str) -> None:
    """The watchdog's verdict. The worker writes its stop request just before it deletes the machine,
    so the watchdog can read it while the SIGTERM cleanup (or the last status write) is under way:
    exiting at once then would cut off the status that says how the agent ended (issue 19: a
    non-chief's status.json still said running after its job succeeded). That cleanup ends the
    process by itself, within the grace; only if it has not by then does the watchdog stop the machine."""
    if _terminating.is_set() or _last_words.is_set():
        log.warning("watchdog: %s; the agent is already writing its last status (at most %.0fs more)",
                    reason, term_grace_s())
        _start_grace(lambda: stop_this_machine(reason))
        return
    # Otherwise stop as on SIGTERM, so the status says the agent was terminated: the worker writes its
    # stop request just before it deletes the machine, and an agent that exited here at once (a
    # non-chief waiting for the chief, say) left status.json saying it still ran (issue 19). The
    # cleanup is bounded by the grace, after which the machine is stopped whatever the main thread does
    # (stuck in storage retries, say); a cleanup that ends in time stops it too (main's finally).
    global _watchdog_reason
    _watchdog_reason = reason
    log.warning("watchdog: %s; stopping as on SIGTERM (at most %.0fs)", reason, term_grace_s())
    _start_grace(lambda: stop_this_machine(reason))
    os.kill(os.getpid(), signal.SIGTERM)


def _start_grace(then: Callable[[], None]) -> None:
    grace = threading.Timer(term_grace_s(), then)
    grace.daemon = True
    grace.start()


def _finish(reporter: StatusReporter, state: AgentState, error: BaseException | None = None) -> None:
    _last_words.set()
    reporter.finish(state, error)


# The reporter of this run, for the last resort below.
_reporter: StatusReporter | None = None


def _exit_now() -> None:
    """The grace is over and the main thread has not written the last status: it may be stuck in a
    TensorFlow call that never returns to Python (where the SIGTERM's exception would be raised), or
    in storage. One bounded attempt from here, so the status says terminated rather than running."""
    log.error("cleanup after SIGTERM did not finish in time; exiting")
    if _reporter is not None and not _last_words.is_set():
        try:
            _reporter.write_last_resort(AgentState.TERMINATED, "stopped: the cleanup after SIGTERM did not "
                                        f"finish within {term_grace_s():.0f}s")
        except Exception as exc:
            log.error("could not write the last status: %s", exc)
    logging.shutdown()
    os._exit(EXIT_TERMINATED)


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name) or default)
    except ValueError:
        return default


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent", description=__doc__)
    parser.add_argument("--job-dir", required=True, help="gs://BUCKET/jobs/<id>")
    parser.add_argument("--task-index", type=int, default=None, help="this host's index (default: TF_CONFIG's, else 0)")
    parser.add_argument("--work-dir", default=None, help="local scratch space (default: a new temporary directory)")
    args = parser.parse_args(argv)

    work = WorkDir(Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="trainjobs-agent-")))
    tail = setup_logging(work.log_file)
    signal.signal(signal.SIGTERM, _on_sigterm)
    task_index = args.task_index if args.task_index is not None else task_index_from_env()
    try:
        job = load_job(args.job_dir, task_index)
    except Terminated:
        return EXIT_TERMINATED
    except Exception as exc:
        log.exception("cannot read the job")
        report = AgentReport(state=AgentState.FAILED, task_index=task_index, heartbeat_at=utc_now(),
                             error=AgentError(type=type(exc).__name__, message=str(exc), logs=list(tail.lines)))
        storage.write_json(JobPaths.of(args.job_dir).status, report.model_dump(mode="json"))
        return EXIT_FAILED

    start_token_refresh()  # on a cloud VM: the worker's newer storage tokens, before the first one expires
    Watchdog(args.job_dir, _on_watchdog_stop, attempt=job.attempt,
             every_s=_env_float("TRAINJOBS_WATCHDOG_EVERY_S", 30.0),
             unreachable_s=_env_float("TRAINJOBS_WATCHDOG_UNREACHABLE_S", 300.0)).start()
    reporter = StatusReporter(job, work.log_file, tail, float(os.environ.get("TRAINJOBS_HEARTBEAT_S", "10")))
    global _reporter
    _reporter = reporter
    try:
        return _run(job, work, reporter)
    finally:
        if not args.work_dir:
            shutil.rmtree(work.root, ignore_errors=True)
        if _watchdog_reason is not None:  # the last status is written: now the machine goes (and we exit)
            stop_this_machine(_watchdog_reason)


def _run(job: AgentJob, work: WorkDir, reporter: StatusReporter) -> int:
    try:
        reporter.start()
        if job.spec.program is not None:
            # The user's own program, in a process of its own: TensorFlow and the devices are its.
            from agent.program import run_program

            run_program(job, work, reporter, Terminated)
        else:
            from agent import devices

            # Before anything else touches TensorFlow: logical devices are fixed once its runtime starts.
            if (n := devices.local_device_count()) is not None:
                devices.configure_local_devices(n)
            from agent.run import run_job

            run_job(job, work, reporter)
        # Inside the try: a SIGTERM up to here is caught below, one after it lets the last status be
        # written. Set after the try, a SIGTERM in between (the worker deletes the machine the moment
        # the chief reports, just as a non-chief sees the same report and returns) escaped every
        # handler, and the agent exited with its status still saying it ran (issue 19).
        _last_words.set()
    except Terminated:
        return _terminated(job, work, reporter)
    except Exception as exc:
        if _terminating.is_set():
            # SIGTERM raised inside code that reports its own errors its own way: in an extension
            # module's import, pybind11 turns any error into an ImportError (seen: optree's, which
            # Keras then called "not installed"). The stop, not that error, is what happened.
            log.warning("%s: %s, raised while SIGTERM was stopping the agent", type(exc).__name__, exc)
            return _terminated(job, work, reporter)
        # First: a SIGTERM while the failure is logged (a non-chief failing as the worker deletes the
        # machine) would raise Terminated inside this handler, past the one above, and leave the status
        # saying the agent runs. With it set the SIGTERM lets this last write finish.
        _last_words.set()
        log.exception("job failed")
        _finish(reporter, AgentState.FAILED, exc)
        return EXIT_FAILED
    log.info("job %s attempt %d succeeded", job.job_id, job.attempt)
    _finish(reporter, AgentState.SUCCEEDED)
    return 0


def _terminated(job: AgentJob, work: WorkDir, reporter: StatusReporter) -> int:
    log.warning("SIGTERM: writing the last status, then uploading what there is")
    _finish(reporter, AgentState.TERMINATED)
    if job.is_chief and work.tensorboard.exists():
        try:
            storage.upload_dir(work.tensorboard, job.paths.tensorboard)
        except Exception as exc:
            log.warning("could not upload the TensorBoard events: %s", exc)
    return EXIT_TERMINATED


if __name__ == "__main__":
    sys.exit(main())
