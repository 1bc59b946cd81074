"""Which database an admin verb (`keys`, `projects`, `db upgrade`) works on (issue 37: `keys list` without
`--data-dir` started a second, empty embedded PostgreSQL, left it running and printed a traceback).

In order: TRAINJOBS_DATABASE_URL; else the `trainjobs up` running on the data dir (its stack.json names
its embedded database); without `--data-dir`, the `up` this user last started (TRAINJOBS_HOME/up.json
names its data dir), when the default data dir holds no deployment; else the data dir's embedded
PostgreSQL, if it runs; else, if the data dir holds a stopped deployment's database, that database,
started for the verb and stopped after it. Nothing else: no verb makes a database where there was
none, and none leaves one running that it started.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from stack.lifetime import Process, StackRecord, read_record, stack_lock
from trainjobs.config import database_url_from_env, home

POINTER = "up.json"  # in TRAINJOBS_HOME while an `up` runs: its data dir, for admin verbs run without --data-dir


class NoDeployment(LookupError):
    """No database to work on; the message says where it looked and what to do."""


def note_running_up(data_dir: Path, up: Process) -> None:
    path = home() / POINTER
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"data_dir": str(data_dir), "up": asdict(up)}))


def forget_running_up(up: Process) -> None:
    """Remove the pointer if it still names this `up` (a later one on another data dir may have replaced it)."""
    path = home() / POINTER
    try:
        if Process(**json.loads(path.read_text())["up"]) == up:
            path.unlink()
    except (OSError, ValueError, KeyError, TypeError):
        pass


def _running_up_dir() -> Path | None:
    try:
        data = json.loads((home() / POINTER).read_text())
        return Path(data["data_dir"]) if Process(**data["up"]).alive() else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _running_record(data_dir: Path) -> StackRecord | None:
    record = read_record(data_dir)
    return record if record is not None and record.up.alive() else None


def _holds_deployment(data_dir: Path) -> bool:
    return _running_record(data_dir) is not None or (data_dir / "postgres" / "PG_VERSION").exists()


@contextmanager
def admin_database(data_dir: Path, given: bool, say: Callable[[str], None]) -> Iterator[str]:
    """The database URL for one admin verb, for as long as the verb runs. `given`: the user named the data
    dir (--data-dir or TRAINJOBS_DATA_DIR). `say` tells the user which deployment it is, when not plain."""
    if (url := database_url_from_env()) is not None:
        yield url
        return
    if not given and not _holds_deployment(data_dir) and (elsewhere := _running_up_dir()) is not None:
        say(f"using the database of the `trainjobs up` running on {elsewhere}")
        data_dir = elsewhere
    if (record := _running_record(data_dir)) is not None:
        if record.database_url is None:
            raise NoDeployment(f"the `trainjobs up` running on {data_dir} (pid {record.up.pid}) uses the database "
                               "TRAINJOBS_DATABASE_URL named when it started: give it to this command too")
        yield record.database_url
        return
    from stack.embedded import (embedded_postgres_pid, embedded_postgres_url, start_embedded_postgres,
                                stop_embedded_postgres)

    postgres = data_dir / "postgres"
    if (url := embedded_postgres_url(postgres)) is not None:
        yield url
        return
    if not (postgres / "PG_VERSION").exists():
        raise NoDeployment(f"no trainjobs deployment found in {data_dir}: start one with `trainjobs up`, give "
                           "its --data-dir, or give TRAINJOBS_DATABASE_URL")
    # The data dir's lock while the server runs for the verb: an `up` starting on it meanwhile would take
    # the server for someone else's (not its own to stop), and find it stopped under it by the verb.
    with stack_lock(data_dir):
        if (record := _running_record(data_dir)) is not None:  # it started as this verb looked
            raise NoDeployment(f"trainjobs up (pid {record.up.pid}) is starting on {data_dir}: run this again once "
                               "it is ready")
        if (url := embedded_postgres_url(postgres)) is not None:  # someone else's meanwhile: left running
            yield url
            return
        say(f"the deployment in {data_dir} is stopped: its database runs for this command only")
        try:
            # Started inside the try: a start that fails or is interrupted (Ctrl-C) once the server is up
            # (pg_ctl gives it a session of its own, so the Ctrl-C does not reach it) still stops it.
            yield start_embedded_postgres(postgres)
        finally:
            from service.db.session import get_engine

            get_engine.cache_clear()  # close pooled connections before the server goes
            if embedded_postgres_pid(postgres) is not None:
                stop_embedded_postgres(postgres)
