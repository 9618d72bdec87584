"""Entry points shared by `gearshift train <job> --config FILE` and
`python -m gearshift.jobs.<job> --config FILE`: read the config, run the trainer, print where
the checkpoint went."""

from __future__ import annotations

import argparse
import importlib
import json
import logging

JOBS = ("sft", "distill", "apo")
CONFIG_CLASSES = {"sft": "SFTConfig", "distill": "DistillConfig", "apo": "APOConfig"}


def load_config(job: str, path: str):
    """The job's typed config from a JSON or YAML file."""
    module = importlib.import_module(f"gearshift.jobs.{job}.config")
    return getattr(module, CONFIG_CLASSES[job]).from_file(path)


def run_job(job: str, config_path: str) -> dict:
    """Runs a job to the end; returns its result (also in <output dir>/result.json)."""
    config = load_config(job, config_path)
    trainer = importlib.import_module(f"gearshift.jobs.{job}.trainer")
    return trainer.train(config)


def summary(result: dict) -> str:
    metrics = {key: value for key, value in result["metrics"].items() if key in ("steps", "first_loss", "final_loss")}
    return json.dumps({"checkpoint_id": result["checkpoint_id"], "uri": result["uri"], **metrics})


def job_main(job: str) -> None:
    """python -m gearshift.jobs.<job> --config FILE"""
    parser = argparse.ArgumentParser(prog=f"python -m gearshift.jobs.{job}", description=f"Run the {job} training job")
    parser.add_argument("--config", required=True, help="JSON or YAML config file")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    print(summary(run_job(job, args.config)), flush=True)
