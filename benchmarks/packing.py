"""Padded against packed micro-batches, in one run on the same model and batch (not a timed test).

The batch: executor episodes shaped like tests/libs/training/trajectories.py's (the platform's
system prompt and chat template, a routing head, instant answers and agentic episodes of one to
four tool calls with outputs of varied length: 260 to about 900 tokens), as APO groups: --groups prompts x --rollouts
rollouts, each group's rollouts sharing their prompt. The model: SmolLM2-135M's shape (random
weights, --layers of its 30 decoder layers; speed does not depend on the weights). A step is the
forward and backward of every micro-batch of the batch (micro_batch_tokens --tokens), the loss on
the target tokens' log-probabilities (forward.TargetForward), no optimizer (the same for all).

Layouts, run round-robin (a shared machine's load falls on all alike), medians over --rounds:
- padded: batching.plan, one example per row, the prefix decoded with every row;
- padded, shared prefix: batching.plan and today's forward: the prefix decoded once, the rows from
  its KV cache in two halves by length (three decoder calls);
- packed: batching.pack, no prefix sharing (one row, position ids, forward.block_attention);
- packed, shared prefix: batching.pack, the prefix once per micro-batch, one decoder call.
Tokens are those the decoder computes (rows x width per call, padding included).

    .venv/bin/python benchmarks/packing.py [--groups 4] [--rollouts 8] [--layers 6] [--tokens 8192] [--rounds 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from gearshift import weights  # noqa: E402
from gearshift.api.common.v1.common_pb2 import Mode, ToolResult, Turn  # noqa: E402
from gearshift.settings import Settings  # noqa: E402
from gearshift.training import batching, forward, tokenization  # noqa: E402

QUERIES = ["What is 17*23?", "How many primes are there below 100?", "What is the capital of Australia, and why not Sydney?",
           "Sum the digits of 2**100.", "Which is larger, 3**40 or 4**30?", "Convert 1011011 from binary to decimal.",
           "What year did the Berlin Wall fall?", "Find the roots of x^2 - 5x + 6."]
WORDS = "the value is computed step by step and then checked against the tool output before the final answer".split()


def episodes(tokenizer, groups: int, rollouts: int, seed: int = 0) -> list[tokenization.Encoded]:
    """groups x rollouts encoded episodes: each group one query, its rollouts of varied mode and length."""
    from tests.libs.training.trajectories import TOOL_CALL, forced_agentic, routed_instant

    draw = random.Random(seed)
    encoded = []
    for group in range(groups):
        query = QUERIES[group % len(QUERIES)]
        for _ in range(rollouts):
            if draw.random() < 0.3:
                trajectory = routed_instant()
                trajectory.turns[0].output = " ".join(draw.choices(WORDS, k=draw.randint(5, 60))) + "</answer>"
            else:
                trajectory = forced_agentic()
                del trajectory.turns[:]
                calls = draw.randint(1, 4)
                for index in range(calls):
                    output = f"Plan: None\n<plan>{' '.join(draw.choices(WORDS, k=draw.randint(5, 25)))}</plan>\n{TOOL_CALL}"
                    result = " ".join(str(draw.randint(0, 10**4)) for _ in range(draw.randint(2, 40)))
                    trajectory.turns.append(Turn(index=index, output=output, tool_results=[ToolResult(call_id="1", name="python", output=result)]))
                trajectory.turns.append(Turn(index=calls, output="\nPlan: None\n<answer>391</answer>"))
                trajectory.mode = Mode.MODE_AGENTIC
            trajectory.query = query
            encoded.append(tokenization.encode_trajectory(tokenizer, trajectory, None, True))
    return encoded


def model(layers: int) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(weights.cache_smollm2(Settings().models_dir), local_files_only=True)
    config.num_hidden_layers = layers
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")  # TargetForward runs it as forward.block_attention


def layouts(examples: list[tokenization.Encoded], max_tokens: int, pad_id: int) -> dict[str, list[batching.MicroBatch]]:
    padded = batching.plan(examples, max_tokens, pad_id)
    unshared = [batching.MicroBatch(micro.indices, micro.batch, share_prefix=False) for micro in padded]
    return {"padded": unshared, "padded, shared prefix": padded,
            "packed": batching.pack(examples, max_tokens, pad_id, share_prefix=False),
            "packed, shared prefix": batching.pack(examples, max_tokens, pad_id)}


def computed_tokens(module: forward.TargetForward, micro: batching.MicroBatch) -> int:
    """Tokens the decoder computes for the micro-batch (padding included)."""
    batch = micro.batch
    shared = 0 if batch.packed or not micro.share_prefix else forward.shared_prefix(batch)
    if not shared:
        return batch.input_ids.numel()
    lengths = batch.attention_mask.sum(dim=1).tolist()
    return shared + sum(len(half) * (max(shared + 1, *(lengths[row] for row in half)) - shared) for half in forward.length_halves(lengths))


def step(module: forward.TargetForward, plan: list[batching.MicroBatch], targets: int) -> float:
    started = time.perf_counter()
    module.zero_grad()
    for micro in plan:
        out = forward.through(module, micro.batch, micro.share_prefix)
        (-out.logprobs.sum() / targets).backward()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=8192, help="micro_batch_tokens")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    net = model(args.layers)
    tokenizer = weights.smollm2_tokenizer(Settings().models_dir)
    examples = episodes(tokenizer, args.groups, args.rollouts)
    targets = sum(example.target_count for example in examples)
    module = forward.TargetForward(net)
    plans = layouts(examples, args.tokens, tokenizer.pad_token_id)
    seconds: dict[str, list[float]] = {name: [] for name in plans}
    for name, plan in plans.items():
        step(module, plan, targets)  # warm-up
    for round_ in range(args.rounds):
        for name, plan in plans.items():
            seconds[name].append(step(module, plan, targets))
            print(f"round {round_}: {name}: {seconds[name][-1]:.2f} s", file=sys.stderr, flush=True)
    lengths = [len(example.input_ids) for example in examples]
    report = {
        "examples": len(examples), "real_tokens": sum(lengths), "shortest": min(lengths), "longest": max(lengths),
        "shared_prefix": batching.common_prefix(examples), "layers": args.layers,
        "micro_batch_tokens": args.tokens, "threads": args.threads, "rounds": args.rounds,
        "layouts": {name: {"micro_batches": len(plan), "decoder_calls": sum(1 if micro.batch.packed or not forward.shared_prefix(micro.batch) or not micro.share_prefix else 3 for micro in plan),
                           "computed_tokens": sum(computed_tokens(module, micro) for micro in plan),
                           "seconds_per_step": round(statistics.median(seconds[name]), 3)} for name, plan in plans.items()},
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
