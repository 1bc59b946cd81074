"""The client verbs of `trainjobs`: submit, status, list, logs, metrics, cancel, artifacts, and the
`sweep` group (submit, status, list, cancel).

They need only the base install. The console script is stack/cli.py: its group holds these verbs and
the server verbs (up, down, api, worker, db, keys, projects).

Exit codes (README "Exit codes"): 0 succeeded (or the command did what was asked), 1 the job failed or
the command could not do it, 2 usage error, 3 the job was cancelled, 130 interrupted (Ctrl-C; a job
being followed keeps running).
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click

from trainjobs.client import terminal
from trainjobs.states import TERMINAL, JobStatus

EXIT_FAILED, EXIT_USAGE, EXIT_CANCELLED, EXIT_INTERRUPTED = 1, 2, 3, 130
EXIT_FOR_STATUS = {"SUCCEEDED": 0, "FAILED": EXIT_FAILED, "CANCELLED": EXIT_CANCELLED}

F = TypeVar("F", bound=Callable[..., Any])


# The client's verbs; the console script (stack/cli.py, the one place that defines it) adds them to its group.
verbs = click.Group("verbs")


def output_option(f: F) -> F:
    """--output text|json on a read command, with --json kept as the old spelling of --output json."""
    f = click.option("--json", "as_json", is_flag=True, help="same as --output json")(f)
    f = click.option("-o", "--output", type=click.Choice(["text", "json"], case_sensitive=False), default="text",
                     help="json: one object per line (per event when following)")(f)

    @wraps(f)
    def wrapper(*args: Any, output: str, as_json: bool, **kw: Any) -> Any:
        return f(*args, as_json=as_json or output.lower() == "json", **kw)

    return wrapper  # type: ignore[return-value]


# --- client side ---------------------------------------------------------------------------------

def _client() -> Any:
    from trainjobs.client.api import Client

    return Client()


def _fail(exc: BaseException) -> None:
    """One error message on stderr, once: the API's message and each field with its reason."""
    from trainjobs.client.api import ApiError, ApiUnreachable

    if isinstance(exc, ApiError):
        head = exc.message
        if exc.details and (first := f"{exc.details[0]['field']}: {exc.details[0]['reason']}") in head:
            head = head[:head.index(first)].rstrip(" :;") or "invalid request"  # the details say it below
        lines = [head] + [f"  {d['field']}: {d['reason']}" for d in exc.details]
        raise click.ClickException("\n".join(lines))
    if isinstance(exc, ApiUnreachable):
        raise click.ClickException(str(exc))
    raise click.ClickException(f"{type(exc).__name__}: {exc}")


def _api_call(f: F) -> F:
    """Errors from the API or the network become one message and exit code 1; Ctrl-C is 130."""
    @wraps(f)
    def wrapper(*args: Any, **kw: Any) -> Any:
        try:
            return f(*args, **kw)
        except (click.ClickException, click.exceptions.Exit, SystemExit):
            raise
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except Exception as exc:  # noqa: BLE001 - every failure reaches the user as one line
            _fail(exc)

    return wrapper  # type: ignore[return-value]


@verbs.command()
@click.argument("spec_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--idempotency-key", help="resubmitting with the same key returns the first job; without one, "
              "each run makes its own, which its retries after a lost answer reuse")
@click.option("-f", "--follow", is_flag=True,
              help="show live progress until the job ends; exit 0 SUCCEEDED, 1 FAILED, 3 CANCELLED")
@click.option("--wait", is_flag=True, help="same as --follow")
@click.option("--dry-run", is_flag=True, help="print the machines the job would create and their price; submit nothing")
@output_option
@_api_call
def submit(spec_file: Path, idempotency_key: str | None, follow: bool, wait: bool, dry_run: bool, as_json: bool) -> None:
    """Submit a job spec (YAML or JSON). Local files and folders it names are uploaded first."""
    spec = read_spec(spec_file, "job")
    if dry_run:
        _dry_run(spec)
        return
    c = _client()
    _upload_local_files(c, spec, spec_file.parent)
    job = c.submit(spec, idempotency_key=idempotency_key)
    if as_json:
        terminal.emit_json(job)
    else:
        click.echo(terminal.one_line(job))
    if follow or wait:
        sys.exit(_follow_job(c, job, as_json))


def read_spec(path: Path, what: str) -> dict[str, Any]:
    """The spec in a YAML or JSON file, as a mapping of its fields; anything else is one message naming
    the file (an empty file, a list, a bare string, a syntax error), never a traceback."""
    import yaml

    try:
        text = path.read_text()
        spec = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" (line {where.line + 1}, column {where.column + 1})" if where is not None else ""
        reason = getattr(exc, "problem", None) or str(exc)
        raise click.ClickException(f"{path} is not YAML or JSON{at}: {reason}") from None
    except UnicodeDecodeError:
        raise click.ClickException(f"{path} is not a text file: a {what} spec is YAML or JSON") from None
    fields = SPEC_FIELDS[what]
    if spec is None and not any(line.strip() and not line.lstrip().startswith("#") for line in text.splitlines()):
        raise click.ClickException(f"{path} is empty: a {what} spec is a YAML or JSON mapping of its fields "
                                   f"({fields})")
    if not isinstance(spec, dict):
        raise click.ClickException(f"{path} holds a {_yaml_kind(spec)}, not a {what} spec: a {what} spec is a "
                                   f"mapping of its fields ({fields})")
    return spec


# What a spec file's top level looks like, for the message about one that is not a mapping.
SPEC_FIELDS = {"job": "name: ..., dataset: ..., model: ..., training: ...; README: The job spec",
               "sweep": "name: ..., job: ..., parameters: ..., objective: ...; README: Sweeps"}


def _yaml_kind(value: Any) -> str:
    kinds = {list: "list", str: "string", bool: "boolean", int: "number", float: "number", type(None): "null"}
    return kinds.get(type(value), type(value).__name__)


def _dry_run(raw: Any) -> None:
    """Validated here, by the same model the API uses, and priced from the same catalogue as the worker:
    no API call, nothing stored."""
    import os

    from pydantic import ValidationError

    from trainjobs.machine_plan import plan_machines
    from trainjobs.spec import JobSpec, describe_errors

    try:
        spec = JobSpec.model_validate(raw)
    except ValidationError as exc:
        problems = describe_errors([dict(e) for e in exc.errors()])
        lines = ["the job spec is invalid"] + [f"  {d['field']}: {d['reason']}" for d in problems]
        raise click.ClickException("\n".join(lines)) from exc
    for line in plan_machines(spec).lines(os.environ.get("TRAINJOBS_GCP_ZONE")):
        click.echo(line)
    click.echo("dry run: nothing was submitted")


def _upload_local_files(c: Any, spec: dict[str, Any], base: Path) -> None:
    """A model module or dataset (file or folder) that is a path on this laptop is uploaded first, so
    the job runs anywhere (relative paths are relative to the spec file; trainjobs/client/local_paths.py)."""
    from trainjobs.client.local_paths import LocalPathError, local_upload, requirements_lines

    model, dataset, program = spec.get("model") or {}, spec.get("dataset") or {}, spec.get("program") or {}
    try:
        module = local_upload(model.get("module"), base, "model.module")
        source = local_upload(dataset.get("source"), base, "dataset.source")
        code = local_upload(program.get("source"), base, "program.source")
    except LocalPathError as exc:
        raise click.ClickException(str(exc)) from None
    if module is not None:
        uploaded, model["module"] = model["module"], c.upload_module(module)
        click.echo(f"uploaded model code {uploaded} -> {model['module']}", err=True)
    if code is not None:
        if code.is_dir() and not program.get("requirements") and (code / "requirements.txt").is_file():
            program["requirements"] = requirements_lines((code / "requirements.txt").read_text())
        uploaded, program["source"] = program["source"], c.upload_module(code)
        click.echo(f"uploaded program {uploaded} -> {program['source']}", err=True)
    if source is not None:
        uploaded, dataset["source"] = dataset["source"], c.upload_dataset(source)["dataset"]
        click.echo(f"uploaded dataset {uploaded} -> {dataset['source']}", err=True)
    _upload_channels(c, program.get("channels"), base)


def _upload_channels(c: Any, channels: Any, base: Path) -> None:
    """A program's channel that is a local file or folder goes up packed (one upload each); staging
    unpacks it into the channel's folder, its files as they are."""
    import tempfile

    from trainjobs.client.local_paths import LocalPathError, local_upload, pack_channel

    for name, value in (channels.items() if isinstance(channels, dict) else []):
        try:
            path = local_upload(value, base, f"program.channels.{name}")
        except LocalPathError as exc:
            raise click.ClickException(str(exc)) from None
        if path is None or not isinstance(name, str):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            channels[name] = c.upload_dataset(pack_channel(path, Path(tmp) / "channel.tar.gz"))["dataset"]
        click.echo(f"uploaded channel {name} {value} -> {channels[name]}", err=True)


def _stream_or_poll(c: Any, job_id: str, what: str, poll_s: float = 2.0) -> Iterator[Any]:
    """The job's `what` ("logs" or "metrics") stream; against a server that does not stream, the same
    events made by polling (new log text, new epochs, and `end` once the job is terminal). A metrics
    stream that keeps dropping is polled on from there: the epochs it has yet to bring still come."""
    from trainjobs.client.api import ApiError, StreamEvent, StreamUnsupported

    sent: set[tuple[Any, Any]] = set()  # the epochs already given, by (attempt, epoch)
    try:
        for ev in c.follow(job_id, what):
            if ev.event == "metric":
                sent.add((ev.data.get("attempt"), ev.data.get("epoch")))
            yield ev
        return
    except StreamUnsupported:
        pass
    except ApiError as exc:
        if what != "metrics" or exc.code != "stream":  # a revoked key, a document over its cap: said as is
            raise
    seen = 0
    while True:
        status = c.get(job_id)["status"]  # before reading, so nothing written before the end is missed
        if what == "logs":
            text = c.logs(job_id)
            for line in text[seen:].splitlines():
                yield StreamEvent("log", {"line": line}, None)
            seen = len(text)
        else:
            for rec in c.metrics(job_id):
                if (key := (rec.get("attempt"), rec.get("epoch"))) not in sent:
                    sent.add(key)
                    yield StreamEvent("metric", rec, None)
        if status in TERMINAL:
            yield StreamEvent("end", {"status": status}, None)
            return
        time.sleep(poll_s)


def _follow_job(c: Any, job: dict[str, Any], as_json: bool) -> int:
    """Follow a job to its end: epochs from the metrics stream (read in a thread), status and the
    progress inside an epoch from reading the job each second. Ctrl-C stops following, not the job."""
    from trainjobs.client.api import Client

    events: queue.Queue[Any] = queue.Queue()

    def read_stream(stream_client: Client) -> None:
        try:
            for ev in _stream_or_poll(stream_client, job["id"], "metrics"):
                events.put(ev)
        except Exception as exc:  # noqa: BLE001 - the main loop still ends the follow by polling
            events.put(exc)

    view: terminal.LiveView | None = None
    last = None
    # The job exists from here on: a Ctrl-C while the follow is still being set up says so too, not only
    # one in the loop (making the stream's client loads the TLS certificates: 0.2 s on a busy 2-core machine).
    try:
        # The stream holds its connection for the whole job, so it gets a client of its own.
        threading.Thread(target=read_stream, args=(Client(api_url=c.api_url),), name="metrics-stream",
                         daemon=True).start()
        view = None if as_json else terminal.LiveView(terminal.console())
        ended, ending_since = False, None
        while True:
            job = c.get(job["id"])
            ended = _drain(events, view) or ended
            if job["status"] in TERMINAL and not ended and _stream_alive(events):
                # The job has ended, and the stream has yet to bring its last epochs and its `end` (it polls
                # storage): they are shown before the end, so the last epoch shown is the last one trained.
                ending_since = ending_since or time.monotonic()
                if time.monotonic() - ending_since < END_WAIT_S:
                    time.sleep(0.2)
                    continue
            state = (job["status"], job.get("progress"))
            if view:
                view.job(job)
            elif state != last:
                terminal.emit_json({"event": "status", "status": job["status"], "progress": job.get("progress")})
            last = state
            if job["status"] in TERMINAL:
                break
            time.sleep(1.0)
    except KeyboardInterrupt:
        if view:
            view.close()
        click.echo(f"\nstopped following; job {job['id']} keeps running "
                   f"(`trainjobs status {job['id']}`, `trainjobs cancel {job['id']}`)", err=True)
        return EXIT_INTERRUPTED
    if view:
        view.close()
    job = c.get(job["id"])
    if as_json:
        terminal.emit_json({"event": "end", "job": job})
    else:
        terminal.show(terminal.job_detail(job))
        if job["status"] == "SUCCEEDED":
            click.echo(f"artifacts: trainjobs artifacts {job['id']} --download DIR")
    return EXIT_FOR_STATUS.get(job["status"], EXIT_FAILED)


# How long a follow waits, once the job has ended, for the stream to bring what is left (an API polls a
# job's storage every 0.5 s, and says `end` after its last epoch); then it shows the end without them.
END_WAIT_S = 30.0


def _drain(events: queue.Queue[Any], view: terminal.LiveView | None) -> bool:
    """Show what the stream brought since the last look; True once it said `end`."""
    ended = False
    while True:
        try:
            ev = events.get_nowait()
        except queue.Empty:
            return ended
        if isinstance(ev, Exception):
            logging.getLogger("trainjobs.client.cli").info("metrics stream stopped: %s", ev)
            events.put(ev)  # remembered: the stream is gone, polling ends the follow
            return ended
        if ev.event == "metric":
            if view:
                view.metric(ev.data)
            else:
                terminal.emit_json({"event": "metric", **ev.data})
        ended = ended or ev.event == "end"


def _stream_alive(events: queue.Queue[Any]) -> bool:
    return not any(isinstance(ev, Exception) for ev in list(events.queue))


STATUS_CHOICE = click.Choice([s.value for s in JobStatus], case_sensitive=False)


@verbs.command()
@click.argument("job_id")
@click.option("--events", is_flag=True, help="also print the state transitions")
@output_option
@_api_call
def status(job_id: str, events: bool, as_json: bool) -> None:
    """Show a job: status, phase timestamps, runtime, latest metrics."""
    c = _client()
    job = c.get(job_id)
    found = c.events(job_id) if events else None
    if as_json:
        terminal.emit_json({**job, "events": found} if found is not None else job)
    else:
        terminal.show(terminal.job_detail(job, found))


@verbs.command("list")
@click.option("--status", "statuses", multiple=True, type=STATUS_CHOICE, help="only these statuses (repeatable)")
@click.option("--label", "labels", multiple=True, help="key=value (repeatable; all must match)")
@click.option("--limit", default=50, type=click.IntRange(1, 500))
@output_option
@_api_call
def list_(statuses: tuple[str, ...], labels: tuple[str, ...], limit: int, as_json: bool) -> None:
    """List jobs, newest first."""
    bad = [lbl for lbl in labels if "=" not in lbl]
    if bad:
        raise click.BadParameter(f"{bad[0]!r} is not key=value", param_hint="--label")
    page = _client().list(status=[s.upper() for s in statuses], labels=dict(lbl.split("=", 1) for lbl in labels),
                          limit=limit)
    if as_json:
        terminal.emit_json(page)
    else:
        terminal.show(terminal.jobs_table(page["jobs"]))


@verbs.command()
@click.argument("job_id")
@click.option("-f", "--follow", is_flag=True, help="keep printing lines as the job writes them, until it ends")
@output_option
@_api_call
def logs(job_id: str, follow: bool, as_json: bool) -> None:
    """Print the agent's log."""
    c = _client()
    if not follow:
        for text in c.iter_logs(job_id):  # a page at a time: a long log is never held whole
            terminal.emit_json({"text": text}) if as_json else click.echo(text, nl=False)
        return
    for ev in _stream_or_poll(c, job_id, "logs"):
        if as_json:
            terminal.emit_json({"event": ev.event, **ev.data})
        elif ev.event == "log":
            click.echo(ev.data.get("line", ""))
        elif ev.event == "end":
            click.echo(f"-- job ended {ev.data.get('status')}", err=True)


@verbs.command()
@click.argument("job_id")
@click.option("-f", "--follow", is_flag=True, help="keep printing epochs as they finish, until the job ends")
@output_option
@_api_call
def metrics(job_id: str, follow: bool, as_json: bool) -> None:
    """Per-epoch metrics: loss, accuracy, validation, examples/s, step time, input-wait fraction."""
    c = _client()
    if not follow:
        epochs = c.metrics(job_id)
        if as_json:
            for rec in epochs:
                terminal.emit_json(rec)
        else:
            terminal.show(terminal.epochs_table(epochs, None if epochs else c.get(job_id)))
        return
    for ev in _stream_or_poll(c, job_id, "metrics"):
        if as_json:
            terminal.emit_json({"event": ev.event, **ev.data})
        elif ev.event == "metric":
            click.echo(terminal.epoch_line(ev.data, None))
        elif ev.event == "end":
            click.echo(f"-- job ended {ev.data.get('status')}", err=True)


@verbs.command()
@click.argument("job_id")
@output_option
@_api_call
def cancel(job_id: str, as_json: bool) -> None:
    """Cancel a job (idempotent)."""
    job = _client().cancel(job_id)
    terminal.emit_json(job) if as_json else click.echo(terminal.one_line(job))


@verbs.command()
@click.argument("job_id")
@click.option("--download", type=click.Path(file_okay=False, path_type=Path), help="fetch every artifact into DIR")
@output_option
@_api_call
def artifacts(job_id: str, download: Path | None, as_json: bool) -> None:
    """List (or download) a job's artifacts."""
    c = _client()
    listing = c.artifacts(job_id)
    if as_json:
        terminal.emit_json(listing)
    else:
        for item in listing["artifacts"]:
            click.echo(f"{item['size']:>12}  {item['sha256'][:12]}  {item['path']}")
        if not listing["artifacts"]:
            click.echo(f"no artifacts: the job is {c.get(job_id)['status']} (a job's artifacts are kept when it "
                       "succeeds)", err=True)
    if download:
        paths = c.download_artifacts(job_id, download)
        click.echo(f"downloaded {len(paths)} file(s) to {download}", err=as_json)


# --- sweeps (issue 22) ---------------------------------------------------------------------------

@verbs.group()
def sweep() -> None:
    """Hyperparameter sweeps: trials of one job spec, each an ordinary job, searched by Optuna."""


@sweep.command("submit")
@click.argument("spec_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--wait", is_flag=True,
              help="poll until the sweep ends, then print its trials; exit 0 SUCCEEDED, 1 FAILED, 3 CANCELLED")
@output_option
@_api_call
def sweep_submit(spec_file: Path, wait: bool, as_json: bool) -> None:
    """Submit a sweep spec (YAML or JSON). Local files its job names are uploaded first, relative to SPEC_FILE."""
    spec = read_spec(spec_file, "sweep")
    c = _client()
    if isinstance(spec.get("job"), dict):  # anything else: the API's 422 says what
        _upload_local_files(c, spec["job"], spec_file.parent)
    found = c.submit_sweep(spec)
    terminal.emit_json(found) if as_json else click.echo(terminal.sweep_line(found))
    if wait:
        sys.exit(_wait_sweep(c, found["id"], as_json))


def _wait_sweep(c: Any, sweep_id: str, as_json: bool) -> int:
    """Poll the sweep to its end, a line per change of its status or trial counts, then show it.
    Ctrl-C stops waiting, not the sweep."""
    def changed(found: dict[str, Any]) -> None:
        if as_json:
            terminal.emit_json({"event": "status", "status": found["status"], "trials": found["trials"]})
        else:
            click.echo(f"{time.strftime('%H:%M:%S')}  {found['status']:<10}  {terminal.trial_counts(found['trials'])}")

    try:
        found = c.wait_sweep(sweep_id, on_update=changed)
    except KeyboardInterrupt:
        click.echo(f"\nstopped waiting; sweep {sweep_id} keeps running (`trainjobs sweep status {sweep_id}`, "
                   f"`trainjobs sweep cancel {sweep_id}`)", err=True)
        return EXIT_INTERRUPTED
    if as_json:
        terminal.emit_json({"event": "end", "sweep": found})
    else:
        terminal.show(terminal.sweep_report(found, c.sweep_trials(sweep_id)))
    return EXIT_FOR_STATUS.get(found["status"], EXIT_FAILED)


@sweep.command("status")
@click.argument("sweep_id")
@output_option
@_api_call
def sweep_status(sweep_id: str, as_json: bool) -> None:
    """Show a sweep and its trials, best first.

    The head gives its status, objective, trial counts, best trial and cost; the table every trial's
    value, parameters, epochs reported, job status and cost."""
    c = _client()
    found = c.get_sweep(sweep_id)
    if as_json:
        terminal.emit_json(found)
    else:
        terminal.show(terminal.sweep_report(found, c.sweep_trials(sweep_id)))


@sweep.command("list")
@click.option("--limit", default=50, type=click.IntRange(1, 200))
@output_option
@_api_call
def sweep_list(limit: int, as_json: bool) -> None:
    """List sweeps, newest first."""
    found = _client().list_sweeps(limit=limit)
    if as_json:
        terminal.emit_json({"sweeps": found})
    else:
        terminal.show(terminal.sweeps_table(found))


@sweep.command("cancel")
@click.argument("sweep_id")
@output_option
@_api_call
def sweep_cancel(sweep_id: str, as_json: bool) -> None:
    """Cancel a sweep (idempotent).

    No trial starts after it; the worker cancels the running trials' jobs, then the sweep is CANCELLED."""
    found = _client().cancel_sweep(sweep_id)
    terminal.emit_json(found) if as_json else click.echo(terminal.sweep_line(found))
    if found["status"] in ("SUCCEEDED", "FAILED"):  # the API answers an ended sweep as it is
        click.echo(f"sweep {sweep_id} had already ended {found['status']}: nothing to cancel", err=True)
