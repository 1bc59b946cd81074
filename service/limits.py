"""How big one job may be on this deployment. The spec's own bounds are what any cloud could run;
these are what this deployment's provisioners can: locally every worker is a TensorFlow process and
every CPU replica a logical device on this host, so the defaults fit a laptop. An operator with real
clouds raises them (TRAINJOBS_MAX_WORKERS, TRAINJOBS_MAX_CPU_REPLICAS)."""

from __future__ import annotations

from dataclasses import dataclass

from service.db.quotas import ProjectUsage, env_int
from trainjobs.spec import CpuAccelerator, JobSpec


@dataclass(frozen=True)
class JobSizeLimits:
    max_workers: int
    max_cpu_replicas: int

    @classmethod
    def from_env(cls) -> JobSizeLimits:
        return cls(env_int("TRAINJOBS_MAX_WORKERS", 4), env_int("TRAINJOBS_MAX_CPU_REPLICAS", 8))

    def refusals(self, spec: JobSpec) -> list[dict[str, str]]:
        """[{field, reason}] for each size this deployment cannot run; empty when the job fits."""
        out = []
        if spec.workers > self.max_workers:
            out.append({"field": "workers", "reason": f"{spec.workers} workers: this deployment runs at most "
                                                      f"{self.max_workers} (TRAINJOBS_MAX_WORKERS)"})
        acc = spec.accelerator
        if isinstance(acc, CpuAccelerator) and acc.replicas > self.max_cpu_replicas:
            out.append({"field": "accelerator.replicas", "reason": f"{acc.replicas} CPU replicas: this deployment "
                        f"runs at most {self.max_cpu_replicas} (TRAINJOBS_MAX_CPU_REPLICAS)"})
        return out


def beyond_project_quota(usage: ProjectUsage, accelerators: int) -> dict[str, str] | None:
    """A job needing more accelerators than its project may ever hold at once would wait forever: refuse it."""
    if accelerators <= usage.max_accelerators:
        return None
    return {"field": "accelerator", "reason": f"this job needs {accelerators} accelerators; the project may hold "
                                              f"at most {usage.max_accelerators} at once (its quota)"}
