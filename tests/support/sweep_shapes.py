"""The review's hostile sweep (issue 36, 1): a valid 29 KB body whose every checked value, validated as a
whole job, re-parsed 64 requirements, 2,048 times. Shared by the tests and bench/sweep_submit_bench.py."""

from __future__ import annotations

from typing import Any

PARAMETERS, CHOICES, REQUIREMENTS, ENV = 32, 64, 64, 96


def hostile_sweep(parameters: int = PARAMETERS, choices: int = CHOICES) -> dict[str, Any]:
    """A program job with 64 requirements and 96 environment variables, swept over `parameters` more
    variables of `choices` values each (32 x 64 as the review sent it)."""
    job = {"program": {"source": "https://example.com/train.py",
                       "requirements": [f"package-{i}>=1.{i},<3; python_version >= '3.9'" for i in range(REQUIREMENTS)],
                       "env": {f"SETTING_{i}": f"value-{i}" for i in range(ENV)}},
           "accelerator": {"type": "cpu"}, "training": {"epochs": 2}}
    sweep = {f"program.env.SWEPT_{i}": {"type": "categorical", "choices": [f"choice-{i}-{j}" for j in range(choices)]}
             for i in range(parameters)}
    return {"name": "hostile", "job": job, "parameters": sweep, "objective": {"metric": "val_accuracy"},
            "algorithm": "random", "max_trials": 1, "parallel_trials": 1}


def minimal_sweep() -> dict[str, Any]:
    """The same program job without its requirements and environment, swept over one variable of two values."""
    sweep = hostile_sweep(parameters=1, choices=2)
    sweep["job"]["program"] = {"source": sweep["job"]["program"]["source"]}
    return sweep
