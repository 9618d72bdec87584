"""The training jobs, one row each. `gearshift train JOB`, `python -m gearshift.jobs.JOB` (the
training image), the orchestrator and the loop all run a job through here.

Every job is a package training-jobs/<job>/ (imported as gearshift.jobs.<job>) of the same
shape: config.py holds a JobConfig subclass, trainer.py holds train(config) -> result, whose
result.json and registry record are the same for every job (gearshift.training.results). Jobs
are found by name, as services are, so this library imports none of them."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path


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


def load_config(job: str, path: str | Path):
    """The job's typed config from a JSON or YAML file."""
    return BY_NAME[job].config_class().from_file(path)


def run_job(job: str, config_path: str | Path) -> dict:
    """Runs a job to the end; returns its result (also in <output dir>/result.json)."""
    return BY_NAME[job].train(load_config(job, config_path))


def summary(result: dict) -> str:
    """One JSON line: the checkpoint, where it is, and the headline metrics."""
    headline = ("steps", "first_loss", "final_loss", "routing_accuracy", "learned_accuracy")
    metrics = {key: value for key, value in (result["metrics"] | result.get("eval_metrics", {})).items() if key in headline}
    return json.dumps({"checkpoint_id": result["checkpoint_id"], "uri": result["uri"], **metrics})


def main_process() -> bool:
    """Rank 0 of a torchrun launch, or a process launched alone: the one that prints the summary."""
    return os.environ.get("RANK", "0") == "0"


def job_main(job: str) -> None:
    """python -m gearshift.jobs.<job> --config FILE"""
    parser = argparse.ArgumentParser(prog=f"python -m gearshift.jobs.{job}", description=f"Run the {job} training job")
    parser.add_argument("--config", required=True, help="JSON or YAML config file")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    result = run_job(job, args.config)
    if main_process():
        print(summary(result), flush=True)
