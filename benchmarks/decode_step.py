"""One decode step of SmolLM2-135M: transformers' forward against the policy server's hand-written
step (services/policy_server/llama_decoder.py), both on two copies of the same cached
checkpoint in one process, steps interleaved (the machine is noisy: quote medians and ratios),
at 1 and 8 rows of a padded batch. Printed as JSON.

    .venv/bin/python benchmarks/decode_step.py [--dtype float32] [--steps 60] [--threads 2]

Run it as the server runs (GOMP_SPINCOUNT=20000 is what the server sets by default; with
spin_wait false, OMP_WAIT_POLICY=PASSIVE):

    GOMP_SPINCOUNT=20000 .venv/bin/python benchmarks/decode_step.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from gearshift import weights
from gearshift.services.policy_server import runner
from gearshift.services.policy_server.batch_cache import BatchCache
from gearshift.settings import Settings

PROMPT_TOKENS = 300  # the first row's prompt; row i has 17 * i more, so rows are padded


def batch(model: torch.nn.Module, rows: int, steps: int) -> BatchCache:
    prompts = [list(range(100, 100 + PROMPT_TOKENS + 17 * row)) for row in range(rows)]
    return BatchCache.of_rows([runner.prefill(model, prompt, None, reserve=steps)[1].row(0) for prompt in prompts], headroom=steps)


def timed(model: torch.nn.Module, cache: BatchCache) -> float:
    started = time.perf_counter()
    runner.decode(model, cache, [5] * cache.rows)
    return time.perf_counter() - started


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--steps", type=int, default=60, help="steps per row count and path (the first 5 are warm-up)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models_dir = Settings().data_dir / "models"
    checkpoint = str(weights.cache_smollm2(models_dir))
    reference = weights.load(checkpoint, models_dir, args.dtype).model
    prepared = weights.load(checkpoint, models_dir, args.dtype).model
    runner.prepare(prepared)
    figures = {"dtype": args.dtype, "threads": args.threads}
    for rows in (1, 8):
        caches = batch(reference, rows, args.steps), batch(prepared, rows, args.steps)
        samples = {"transformers": [], "hand_written": []}
        for _ in range(args.steps):
            samples["transformers"].append(timed(reference, caches[0]))
            samples["hand_written"].append(timed(prepared, caches[1]))
        medians = {name: statistics.median(times[5:]) for name, times in samples.items()}
        figures[f"rows_{rows}"] = {
            "step_ms": {name: round(seconds * 1000, 1) for name, seconds in medians.items()},
            "speedup": round(medians["transformers"] / medians["hand_written"], 2),
        }
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
