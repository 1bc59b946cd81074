"""A program's channels on the machine (issue 37): SageMaker's input data, each in a folder of its own.

Staging (worker/staging_channels.py) has copied each source's files, as they are, into the job's own
directory, channels/<name>/, and failed the job there if a source was missing, empty or too large. Here
each is downloaded to <input>/data/<name>, SageMaker's /opt/ml/input/data/<name>, before the program
starts. The agent reads only its own job's directory: where the data came from, and whether the job
may name it, was decided before any machine started.
"""

from __future__ import annotations

import logging
from pathlib import Path

from trainjobs import storage
from trainjobs.job_paths import JobPaths

log = logging.getLogger("trainjobs.agent")


class ChannelMissing(Exception):
    """A channel's files are not in the job's directory."""


def download_channels(names: list[str], paths: JobPaths, data_dir: Path) -> dict[str, list[str]]:
    """Each channel's files into data_dir/<name>; its files' names relative to it, by channel."""
    found: dict[str, list[str]] = {}
    for name in names:
        local = data_dir / name
        files = storage.download_prefix(f"{paths.channel(name)}/", local)
        if not files:  # staging refused an empty channel: its copy is gone since
            raise ChannelMissing(f"program.channels.{name}: no files in {paths.channel(name)}/ (staging copied them "
                                "there; were they deleted?)")
        found[name] = sorted(f.relative_to(local).as_posix() for f in files)
        log.info("channel %s: %d file(s) in %s", name, len(files), local)
    return found
