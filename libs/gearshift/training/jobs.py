"""Running a training job: `gearshift train JOB`, `python -m gearshift.jobs.JOB` (the training
image), the orchestrator and the loop all run a job through here. Which jobs there are is
gearshift.job_table."""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path

from gearshift.job_table import BY_NAME


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
