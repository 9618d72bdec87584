"""Training steps under glibc's default malloc against malloc keeping freed memory in its heap
(the GLIBC_TUNABLES tests/conftest.py sets for the suite), side by side, alternating runs:

    .venv/bin/python benchmarks/malloc_steps.py [--runs 3]

Each run is a fresh process: a random 4-layer Llama (hidden 256, vocab 32k), 6 AdamW steps on
2 x 256 tokens, one thread. Prints the median step seconds, CPU seconds (user, system) and
minor page faults of each setting and their ratios."""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys

KEEP_FREED = "glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=4294967296"
STEPS = """
import time, torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.set_num_threads(1); torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(vocab_size=32000, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                                     num_attention_heads=4, num_key_value_heads=2))
optimizer = torch.optim.AdamW(model.parameters(), 1e-4)
tokens = torch.randint(0, 32000, (2, 256))
started = time.perf_counter()
for _ in range(6):
    model(tokens, labels=tokens).loss.backward(); optimizer.step(); optimizer.zero_grad()
print(time.perf_counter() - started)
"""


def run(tunables: str) -> dict[str, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {**os.environ, "GLIBC_TUNABLES": tunables}
    done = subprocess.run([sys.executable, "-c", STEPS], capture_output=True, text=True, env=env, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"steps_s": float(done.stdout.split()[-1]), "user_s": after.ru_utime - before.ru_utime,
            "system_s": after.ru_stime - before.ru_stime, "minor_faults": after.ru_minflt - before.ru_minflt}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    runs = parser.parse_args().runs
    results: dict[str, list[dict]] = {"default": [], "keep freed": []}
    for _ in range(runs):
        results["default"].append(run(""))
        results["keep freed"].append(run(KEEP_FREED))
    medians = {name: {key: statistics.median(r[key] for r in rs) for key in rs[0]} for name, rs in results.items()}
    for name, figures in medians.items():
        print(f"{name:>10}: " + ", ".join(f"{key} {value:,.2f}" for key, value in figures.items()))
    print("  ratio: " + ", ".join(f"{key} {medians['keep freed'][key] / medians['default'][key]:.2f}" for key in medians["default"]))


if __name__ == "__main__":
    main()
