"""`python -m MODULE` for a process of ours (an agent, a zygote, a storage guard, the lifeline, the GCS
emulator), started with the interpreter that runs us.

`python -m` puts the directory it starts in first on sys.path, so a folder there named like one of our
packages is imported instead of ours: `trainjobs up` run in a project with an `agent/` folder of its own
ran that folder as every local machine's agent, and a job's code could leave an `agent/` in the folder
its next agent starts in. `-P` (Python 3.11 and later) leaves that directory out, and our packages come
from where they are installed. Where the process starts in the folder that holds our packages (a
checkout run without installing it, as the images' test environments do) that folder is ours, and it
stays on the path. The agent also runs on the images' Python 3.10, which has no `-P`: there the folder
it starts in is its own work folder.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

OUR_ROOT = Path(__file__).resolve().parents[1]  # the folder holding trainjobs/, agent/, worker/, stack/


def module_command(module: str, *args: str, cwd: str | os.PathLike[str] | None = None) -> list[str]:
    """The command line; `cwd`: the folder the process will start in (default this process's)."""
    starts_in = Path(cwd if cwd is not None else os.getcwd()).resolve()
    safe_path = ["-P"] if sys.version_info >= (3, 11) and starts_in != OUR_ROOT else []
    return [sys.executable, *safe_path, "-m", module, *args]
