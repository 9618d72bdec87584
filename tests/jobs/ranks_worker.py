"""A training job's own step code on fixed data, run under torchrun or alone, for the tests that
compare N ranks with 1: APO's and distillation's `learn` on rollouts the executor wrote once
(so every run learns from the same episodes), SFT's `fit` on exported trajectories, SFT
normalised per rank, the mistake the comparison must catch, and "export": the loaded weights
exported, no step run. Rank 0 writes each step's loss and the final weights.

One launch runs a list of cases one after another in the same process group: a launch spends
9 to 13 s importing torch and transformers before any work (`make test`'s largest cost after the
work itself), and each case starts its own Run, seeded from its config.

    torchrun --nproc-per-node 2 tests/jobs/ranks_worker.py CASES.json

or forked, rank by rank, from a server that imported all this once (`run_all`, through
tests/rank_processes.run_ranks: tests/jobs/rank_runs.fork_cases).

CASES.json: [{"job": "apo", "config": PATH, "data": PATH, "out": PATH}, ...], with "die_at" (a
step) and "die_rank" where a rank is to kill itself (SIGKILL) after that step.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import signal
import time

import torch
from gearshift.training import checkpoints
from gearshift.training.jobs import load_config
from gearshift.training.runtime import Run


def learn_apo(run: Run, config, data) -> None:
    from gearshift.jobs.apo import trainer

    reference = run.frozen(config.reference or config.model.base) if config.kl_coef else None
    for step in run.steps():
        loss, metrics = trainer.learn(run, data, config, reference)
        run.record(step, loss, metrics, time.perf_counter())


def learn_distill(run: Run, config, data) -> None:
    from gearshift.jobs.distill import trainer

    owners, episodes = data
    teachers = {source: run.frozen(source) for source in sorted(set(owners))}
    for step in run.steps():
        loss, metrics = trainer.learn(run, config, teachers, owners, episodes)
        run.record(step, loss, metrics, time.perf_counter())


def learn_sft_per_rank(run: Run, config, data) -> None:
    """SFT as a plain DDP loop does it, each rank's loss a token mean over its own share, averaged
    over the ranks: wrong on purpose (the ranks' shares hold different numbers of tokens)."""
    import random

    from gearshift.jobs.sft.trainer import sft_loss_of
    from gearshift.training import tokenization

    examples = [tokenization.encode_trajectory(run.tokenizer, t, config.max_length, True) for t in data]
    for step in run.steps():
        draw = random.Random(config.optim.seed * 1_000_003 + step)
        mine = run.ranks.shard([examples[i] for i in draw.choices(range(len(examples)), k=config.batch_size)])
        local = sum(e.target_count for e in mine) * run.ranks.world_size
        run.update(step, run.micro_batches(mine), sft_loss_of(run, local), {}, time.perf_counter())


def run_case(job_name: str, config_path: str, data_path: str, out: str, die_at: int = 0, die_rank: int = 1) -> None:
    job = {"sft-per-rank": "sft", "export": "sft"}.get(job_name, job_name)
    config = load_config(job, config_path)
    with open(data_path, "rb") as handle:
        data = pickle.load(handle)

    def die(step: int, record: dict) -> None:
        if step == die_at and int(os.environ.get("RANK", "0")) == die_rank:
            os.kill(os.getpid(), signal.SIGKILL)

    run = Run.start(job, config, die)
    if job_name == "export":  # the loaded weights, exported as training exports them
        run.save_weights(run.output)
    elif job_name == "sft":
        from gearshift.jobs.sft.trainer import fit

        fit(run, config, data)
    else:
        {"apo": learn_apo, "distill": learn_distill, "sft-per-rank": learn_sft_per_rank}[job_name](run, config, data)
    state = checkpoints.full_state(run.model, run.ranks)
    if run.ranks.main:
        weights = os.path.join(os.path.dirname(out), "final.pt")
        torch.save(state, weights)
        metrics = run.output / "metrics.jsonl"
        losses = {record["step"]: record["loss"] for record in map(json.loads, open(metrics))} if metrics.exists() else {}
        with open(out, "w") as handle:
            json.dump({"losses": [losses[step] for step in sorted(losses)], "weights": weights,
                       "resumed_from": run.start_step}, handle)


def run_all(cases: list[dict]) -> None:
    for case in cases:
        run_case(case["job"], case["config"], case["data"], case["out"], case.get("die_at", 0), case.get("die_rank", 1))
        gc.collect()  # the last case's model and optimizer state, before the next loads


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("cases", help="JSON: the cases to run, in order (the module docstring)")
    run_all(json.loads(open(parser.parse_args().cases).read()))


if __name__ == "__main__":
    main()
