"""The trainer's idle fraction in on-policy training, synchronous against asynchronous rollouts,
side by side in one run on this machine (issue 49).

An APO job trains against a running stack (rollout.executor_addr: the fleet), in its own process
as `gearshift train apo` (under torchrun with --ranks 2), twice with the same config: once with
rollout.max_async_steps 0 (generate, then train) and once with 1 (the next step's rollouts are
generated while this step trains). The fleet is this process's embedded stack, whose built-in
policy server serves the model being trained and loads each step's weights (POST /v1/load).

Idle fraction of a step = the seconds the trainer waited for the step's rollouts (metrics.jsonl's
wait_seconds) / the step's seconds (from asking for the rollouts to the step's record, sync
included). Reported: the median over the steps after the first (whose rollouts nobody can have
generated ahead), with the medians of step seconds and staleness.

On this CPU the fleet and the trainer share the same cores, so overlap cannot make generation
free: the figure shows how much of a step the trainer spends waiting, not a GPU cluster's speed-up.

    .venv/bin/python benchmarks/on_policy_idle.py [--model smollm2] [--steps 5] [--ranks 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from gearshift import weights  # noqa: E402
from gearshift.embedded import embedded  # noqa: E402
from gearshift.settings import ExecutorSettings, PlannerSettings, PolicyServerSettings, Settings  # noqa: E402
from gearshift.training.results import read_metrics  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [
    {"query": "What is the capital of France?", "reference_answer": "Paris"},
    {"query": "What is the capital of Italy?", "reference_answer": "Rome"},
    {"query": "What is 7*8?", "reference_answer": "56"},
    {"query": "Who wrote Hamlet?", "reference_answer": "William Shakespeare"},
]


def job_config(out: Path, model: str, executor_addr: str, policy_url: str, steps: int, max_async: int, threads: int) -> dict:
    return {
        "model": {"base": model},
        "optim": {"learning_rate": 1e-5, "max_steps": steps, "seed": 1, "threads": threads},
        "output": {"dir": str(out), "checkpoint_id": f"idle-{max_async}", "progress": False},
        "prompts": PROMPTS,
        "prompts_per_step": 2,
        "rho": 1,
        "gamma": 0,
        "reward": "sr2am",
        "rollout": {"executor_addr": executor_addr, "policy_url": policy_url, "temperature": 1.0, "max_async_steps": max_async},
    }


async def train(config: dict, folder: Path, ranks: int, threads: int) -> list[dict]:
    """The job in its own process (torchrun with ranks > 1), awaited: this loop serves the fleet."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"] if ranks > 1 else []
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    process = await asyncio.create_subprocess_exec(
        sys.executable, *launcher, "-m", "gearshift.cli", "train", "apo", "--config", str(folder / "config.json"), cwd=ROOT, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    output, _ = await process.communicate()
    if process.returncode:
        raise SystemExit(f"the job failed:\n{output.decode()[-4000:]}")
    return read_metrics(Path(config["output"]["dir"]))


def summary(records: list[dict]) -> dict:
    later = [r for r in records if r["step"] > 1] or records
    return {
        "idle_fraction": statistics.median(r["wait_seconds"] / r["seconds"] for r in later),
        "step_seconds": statistics.median(r["seconds"] for r in later),
        "wait_seconds": statistics.median(r["wait_seconds"] for r in later),
        "generation_seconds": statistics.median(r["rollout_seconds"] for r in later),
        "staleness": statistics.median(r["staleness"] for r in later),
        "steps": len(later),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", help='"smollm2", "tiny" or a checkpoint directory')
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per policy turn")
    args = parser.parse_args()
    threads = max(1, (os.cpu_count() or 2) // (args.ranks + 1))
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        os.environ["GEARSHIFT_DATA_DIR"] = str(root / "data")
        os.environ["GEARSHIFT_METRICS_PORT"] = "0"
        model = str(weights.resolve(args.model, Settings().models_dir))
        stack = Settings(data_dir=root / "stack", log_level="WARNING", metrics_port=0)
        stack = stack.model_copy(update={
            "policy_server": PolicyServerSettings(model=model, threads=threads),
            "executor": ExecutorSettings(max_tokens_per_turn=args.max_tokens, max_steps_other=1, max_steps_agentic=1),
            "planner": PlannerSettings(max_tokens=16),
        })
        results = {}
        async with embedded(stack, policy_model=model) as fleet:
            os.environ["GEARSHIFT_REWARD_ADDR"] = fleet.settings.reward_addr
            os.environ["GEARSHIFT_POLICY_CLIENT__MODEL"] = fleet.settings.policy_client.model
            for name, max_async in (("synchronous", 0), ("asynchronous (max_async_steps 1)", 1)):
                config = job_config(root / f"out-{max_async}", model, fleet.settings.executor_addr, fleet.settings.policy_client.url,
                                    args.steps, max_async, threads)
                results[name] = summary(await train(config, root / f"run-{max_async}", args.ranks, threads))
    print(f"APO, {args.model}, {args.ranks} rank(s), {args.steps} steps, 2 prompts x 3 rollouts a step, "
          f"{args.max_tokens} tokens a turn; medians over steps 2-{args.steps}")
    print(f"{'':36} {'idle':>6} {'step s':>8} {'wait s':>8} {'gen s':>8} {'stale':>6}")
    for name, row in results.items():
        print(f"{name:36} {row['idle_fraction']:6.2f} {row['step_seconds']:8.1f} {row['wait_seconds']:8.1f} "
              f"{row['generation_seconds']:8.1f} {row['staleness']:6.1f}")


if __name__ == "__main__":
    asyncio.run(main())
