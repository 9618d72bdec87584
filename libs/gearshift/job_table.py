"""The training jobs, one row each, as topology.py holds the services: `gearshift train`'s
choices and the job names the settings and the orchestrator accept are read from it.

Every job is a package training-jobs/<job>/ (imported as gearshift.jobs.<job>) of the same
shape: config.py holds a JobConfig subclass, trainer.py holds train(config) -> result, whose
result.json and registry record are the same for every job (gearshift.training.results). Jobs
are found by name, as services are, so this library imports none of them; and this table
imports nothing heavy, so settings can check a job name without loading training code."""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class JobSpec:
    name: str
    config: str  # the JobConfig subclass in gearshift.jobs.<name>.config
    summary: str
    trains_policy: bool = True  # its checkpoint is a policy (a promotion round can run it)

    def config_class(self):
        return getattr(importlib.import_module(f"gearshift.jobs.{self.name}.config"), self.config)

    def train(self, config) -> dict:
        return importlib.import_module(f"gearshift.jobs.{self.name}.trainer").train(config)


JOBS = (
    JobSpec("sft", "SFTConfig", "route-then-align supervised fine-tuning on stored trajectories"),
    JobSpec("distill", "DistillConfig", "multi-teacher on-policy distillation (per-token reverse KL)"),
    JobSpec("apo", "APOConfig", "adaptive policy optimization: GRPO with forced and free rollouts"),
    JobSpec("router", "RouterConfig", "the learned cost-aware router, from forced-mode outcomes", trains_policy=False),
)
JOB_NAMES = tuple(job.name for job in JOBS)
POLICY_JOBS = tuple(job.name for job in JOBS if job.trains_policy)
BY_NAME = {job.name: job for job in JOBS}
