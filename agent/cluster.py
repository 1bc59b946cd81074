"""`python -m agent.cluster --uri gs://.../cluster/attempt-N.json --task-index I`: wait for the
cluster a multi-host Compute Engine job trains in, then print this host's TF_CONFIG.

The worker writes the file once every VM of the attempt is RUNNING (it learns their internal IPs only
then); the startup script exports what this prints before it starts the agent. Exit 1 if the file does
not come within --timeout-s (the worker gave the attempt up, or never got every VM).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from trainjobs import storage


def tf_config(cluster: dict[str, Any], task_index: int) -> dict[str, Any]:
    workers = cluster["worker"]
    if not 0 <= task_index < len(workers):
        raise ValueError(f"task index {task_index} is not in a cluster of {len(workers)} workers")
    return {"cluster": {"worker": list(workers)}, "task": {"type": "worker", "index": task_index}}


def wait_for_cluster(uri: str, timeout_s: float, every_s: float = 2.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            found = storage.read_json(uri)
        except Exception as exc:  # storage may blink while the VM boots; the deadline decides
            print(f"cannot read {uri} yet: {exc}", file=sys.stderr)
            found = None
        if isinstance(found, dict) and isinstance(found.get("worker"), list):
            return found
        if time.monotonic() >= deadline:
            raise TimeoutError(f"no cluster at {uri} after {timeout_s:.0f}s")
        time.sleep(every_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent.cluster", description=__doc__)
    parser.add_argument("--uri", required=True)
    parser.add_argument("--task-index", type=int, required=True)
    parser.add_argument("--timeout-s", type=float, default=1800.0)
    args = parser.parse_args(argv)
    try:
        print(json.dumps(tf_config(wait_for_cluster(args.uri, args.timeout_s), args.task_index)))
    except (TimeoutError, ValueError) as exc:
        print(f"agent.cluster: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
