"""`python -m MODULE` for a process of ours (an agent, a zygote, a storage guard, the lifeline, the GCS
emulator), started with the interpreter that runs us.

`python -m` puts the directory it starts in first on sys.path, so a folder there named like one of our
packages is imported instead of ours: `trainjobs up` run in a project with an `agent/` folder of its own
ran that folder as every local machine's agent, and a job's code could leave an `agent/` in the folder
its next agent starts in. `-P` (Python 3.11 and later) leaves that directory out; our packages come from
the installed distribution. The agent also runs on the images' Python 3.10, which has no `-P`: there the
directory it starts in is its own work folder.
"""

from __future__ import annotations

import sys


def module_command(module: str, *args: str) -> list[str]:
    safe_path = ["-P"] if sys.version_info >= (3, 11) else []
    return [sys.executable, *safe_path, "-m", module, *args]
