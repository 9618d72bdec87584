"""Mixture-of-experts training speed on the CPU: gearshift's SFT step on a small random
Qwen3-MoE (4 layers, hidden 256, 8 experts, 2 per token, SmolLM2's tokenizer) as one process, as
2 ranks under FSDP2 (each rank gathers every expert of a layer) and as 2 ranks with expert
parallelism 2 (each rank holds 4 experts; tokens travel to them and back, all-to-all), in one
run on the same batch (training_speed.py's 4 prompt/completion pairs). Figures: median tokens/s
over the timed steps (the first is a warm-up), and the all-to-all bytes of a step, counted at
torch.distributed.all_to_all_single: what the ranks handed it and what of that went to another
rank. The ranks share the machine's cores (--threads in all).

    .venv/bin/python benchmarks/moe_training.py [--steps 6] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

LAYOUTS = {"1 rank": (1, 1), "2 ranks, FSDP": (2, 1), "2 ranks, expert parallel 2": (2, 2)}  # name: (ranks, expert_parallel)


def make_model(directory: Path) -> Path:
    from gearshift import weights
    from gearshift.settings import Settings
    from transformers import Qwen3MoeForCausalLM

    tokenizer = weights.smollm2_tokenizer(Settings().models_dir)
    config = weights.tiny_moe_config(len(tokenizer))
    config.update({"hidden_size": 256, "moe_intermediate_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8,
                   "num_key_value_heads": 2, "head_dim": 32, "num_experts": 8})
    torch.manual_seed(0)
    Qwen3MoeForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


class AllToAllBytes:
    """Counts what this rank hands torch.distributed.all_to_all_single (the MoE dispatch and
    combine, and their backward), and what of it goes to another rank."""

    def __init__(self):
        self.handed = self.sent = 0
        self.original = dist.all_to_all_single
        dist.all_to_all_single = self

    def __call__(self, output, tensor, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False):
        row = tensor[0].numel() * tensor.element_size() if len(tensor) else 0
        splits = input_split_sizes or [len(tensor) // dist.get_world_size(group)] * dist.get_world_size(group)
        own = splits[dist.get_rank(group)] if splits else 0
        self.handed += tensor.numel() * tensor.element_size()
        self.sent += (len(tensor) - own) * row
        return self.original(output, tensor, output_split_sizes, input_split_sizes, group=group, async_op=async_op)


def worker(path: Path, out: Path, steps: int, threads: int, expert_parallel: int) -> None:
    """gearshift's SFT step on the shared batch, alone or as one rank; rank 0 writes each step's
    seconds and all-to-all bytes (summed over the ranks)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from gearshift.jobs.sft.config import SFTConfig
    from gearshift.jobs.sft.trainer import sft_loss_of
    from gearshift.training.runtime import Run
    from training_speed import sft_examples

    config = SFTConfig.model_validate(
        {"model": {"base": str(path)}, "optim": {"learning_rate": 1e-5, "max_steps": steps, "threads": threads},
         "output": {"dir": str(out.parent / f"{out.stem}-run"), "save_every": 10_000, "progress": False, "resume": False},
         "runtime": {"expert_parallel": expert_parallel}})
    run = Run.start("sft", config)
    counter = AllToAllBytes()
    examples = sft_examples(run.tokenizer)
    total = sum(example.target_count for example in examples)
    seconds, handed, sent = [], [], []
    for step in run.steps():
        counter.handed = counter.sent = 0
        started = time.perf_counter()
        run.update(step, run.micro_batches(run.ranks.shard(examples)), sft_loss_of(run, total), {}, started)
        seconds.append(time.perf_counter() - started)
        step_handed, step_sent = run.ranks.sum([float(counter.handed), float(counter.sent)])
        handed.append(step_handed)
        sent.append(step_sent)
    if run.ranks.main:
        tokens = sum(len(example.input_ids) for example in examples)
        out.write_text(json.dumps({"seconds": seconds, "tokens": tokens, "handed": handed, "sent": sent}))


def measure(path: Path, ranks: int, expert_parallel: int, steps: int, threads: int, scratch: Path) -> dict:
    out = scratch / f"moe-{ranks}-{expert_parallel}.json"
    each = max(1, threads // ranks)
    command = [__file__, "--worker", str(out), "--model", str(path), "--steps", str(steps), "--threads", str(each),
               "--expert-parallel", str(expert_parallel)]
    if ranks > 1:
        command = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", *command]
    done = subprocess.run([sys.executable, *command], capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": str(each)})
    if done.returncode:
        raise RuntimeError(f"the {ranks}-rank worker failed:\n{done.stderr[-3000:]}")
    result = json.loads(out.read_text())
    timed = result["seconds"][1:]
    return {"tokens_per_second": result["tokens"] / statistics.median(timed), "step_seconds": statistics.median(timed),
            "all_to_all_mib_per_step": statistics.median(result["handed"][1:]) / 2**20,
            "all_to_all_mib_to_other_ranks_per_step": statistics.median(result["sent"][1:]) / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6, help="SFT steps per layout (the first is a warm-up)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads, shared among the ranks")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--expert-parallel", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.model, args.worker, args.steps, args.threads, args.expert_parallel)
        return
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        path = make_model(scratch / "moe")
        report = {name: measure(path, ranks, parallel, args.steps, args.threads, scratch) for name, (ranks, parallel) in LAYOUTS.items()}
    report["threads"] = args.threads
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
