"""`trainjobs submit --dry-run FILE`: what the job would create and cost, from the spec alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from trainjobs.catalogue import GPU_TYPES, TPU_GENERATIONS
from stack.cli import main
from trainjobs.spec.derived import hourly_price_usd
from trainjobs.spec import JobSpec

DIGITS = {"dataset": {"source": "sklearn:digits"}, "model": {"name": "cnn"}}


def dry_run(tmp_path: Path, spec: dict, **env: str) -> tuple[int, str]:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    # An API that is not there: a dry run must not need one.
    base = {"TRAINJOBS_API_URL": "http://127.0.0.1:9", "TRAINJOBS_API_KEY": "none", "TRAINJOBS_HOME": str(tmp_path)}
    result = CliRunner().invoke(main, ["submit", "--dry-run", str(path)], env={**base, **env},
                                catch_exceptions=False)
    return result.exit_code, result.output


@pytest.mark.parametrize("accelerator, expected", [
    ({"type": "tpu", "tpu_type": "v5litepod-8", "spot": True},
     ["machine:   Cloud TPU v5litepod-8 (8 chips)", "zone:      us-west4-a", "runtime:   tpu-vm-tf-2.18.0-pjrt",
      "spot:      yes", "hosts:     1", "estimated: 9.60 USD/hour"]),
    ({"type": "tpu", "tpu_type": "v4-32", "runtime_version": "tpu-vm-tf-2.18.0-pod-pjrt"},
     ["machine:   Cloud TPU v4-32 (16 chips)", "runtime:   tpu-vm-tf-2.18.0-pod-pjrt", "spot:      no",
      "hosts:     4", "estimated: 51.52 USD/hour"]),
    ({"type": "gpu", "gpu_type": "nvidia-l4", "count": 2},
     ["machine:   Compute Engine GPU VM 2 x nvidia-l4", "hosts:     1", "estimated: 1.70 USD/hour"]),
    # A gcp worker runs a CPU job on a billed n2-standard VM (two vCPUs per replica); it once showed as free.
    ({"type": "cpu", "replicas": 2},
     ["machine:   CPU 2 replica(s), n2-standard-4 on GCP", "hosts:     1", "estimated: 0.19 USD/hour"]),
], ids=["tpu-spot", "tpu-multi-host", "gpu", "cpu"])
def test_dry_run_prints_the_machines_and_their_hourly_price(tmp_path: Path, accelerator: dict, expected: list[str]) -> None:
    code, out = dry_run(tmp_path, {**DIGITS, "accelerator": accelerator}, TRAINJOBS_GCP_ZONE="us-west4-a")
    assert code == 0, out
    lines = out.splitlines()
    for want in expected:
        assert any(line.startswith(want) for line in lines), (want, out)
    assert lines[-1] == "dry run: nothing was submitted"


def test_dry_run_of_an_invalid_spec_names_the_field(tmp_path: Path) -> None:
    code, out = dry_run(tmp_path, {**DIGITS, "accelerator": {"type": "tpu", "tpu_type": "v5litepod-7"}})
    assert code == 1
    assert "accelerator.tpu_type: 'v5litepod-7' is not a TPU size Google sells" in out


def test_dry_run_without_a_zone_says_the_worker_chooses_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRAINJOBS_GCP_ZONE", raising=False)
    code, out = dry_run(tmp_path, {**DIGITS, "accelerator": {"type": "tpu", "tpu_type": "v5litepod-8"}})
    assert code == 0 and "TRAINJOBS_GCP_ZONE (not set here)" in out


EVERY_MACHINE = ([{"type": "cpu", "replicas": n} for n in (1, 4, 64)]
                 + [{"type": "gpu", "gpu_type": g, "count": t.counts[0]} for g, t in GPU_TYPES.items()]
                 + [{"type": "tpu", "tpu_type": f"{gen}-8"} for gen in TPU_GENERATIONS])


@pytest.mark.parametrize("accelerator", EVERY_MACHINE, ids=lambda a: "-".join(str(v) for v in a.values()))
def test_every_machine_a_job_can_get_has_a_price(accelerator: dict) -> None:
    # limits.max_cost_usd is enforced with this price: at 0 it never fires.
    assert hourly_price_usd(JobSpec.model_validate({**DIGITS, "accelerator": accelerator})) > 0


def test_a_cpu_job_pays_for_each_worker_hosts_vm() -> None:
    one, two = (JobSpec.model_validate({**DIGITS, "accelerator": {"type": "cpu"}, "workers": n}) for n in (1, 2))
    assert hourly_price_usd(two) == 2 * hourly_price_usd(one)
