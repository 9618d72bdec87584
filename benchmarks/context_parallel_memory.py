"""A rank's peak memory of one training step on a long sequence, at 1 rank and split over 2 and 4
ranks by context parallelism (Ulysses), measured on real gloo ranks and predicted by the tracker
side by side, in one run (not a timed test).

The step is gearshift.training.memory's: one sequence of --tokens tokens through the decoder as
one packed row (forward.block_attention), the head on every position, backward, under FSDP2 over
the ranks; torch's memory tracker follows every live tensor (activations, gathered weights,
gradients, AdamW moments) on rank 0. Context parallel N holds N ranks, so N=1 is one process.
The model: a Llama of 6 layers, hidden 512, 8 heads (2 key-value heads) and an 8k vocabulary,
random weights, fp32 on the CPU: activations grow with the sequence, the rest does not.

    .venv/bin/python benchmarks/context_parallel_memory.py [--tokens 16384] [--degrees 1 2 4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

MODEL = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 8192, "hidden_size": 512, "intermediate_size": 1408,
         "num_hidden_layers": 6, "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 131072,
         "tie_word_embeddings": True}
ROOT = Path(__file__).resolve().parents[1]


def peak(config: Path, degree: int, tokens: int, measure: bool) -> dict:
    """rank 0's peak, in GiB by kind, at context_parallel degree on degree ranks."""
    runtime = json.dumps({"context_parallel": degree})
    args = ["-m", "gearshift.training.memory", str(config), "--tokens", str(tokens), "--runtime", runtime]
    if measure and degree > 1:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={degree}", *args, "--measure"]
    else:
        command = [sys.executable, *args, *(["--measure"] if measure else ["--ranks", str(degree)])]
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // degree))}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode:
        raise RuntimeError(f"context_parallel {degree}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--degrees", nargs="*", type=int, default=[1, 2, 4])
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "config.json"
        config.write_text(json.dumps(MODEL))
        for degree in args.degrees:
            measured, predicted = peak(config, degree, args.tokens, True), peak(config, degree, args.tokens, False)
            rows.append({"context_parallel": degree, "measured_gib": round(measured["Total"], 3), "predicted_gib": round(predicted["Total"], 3),
                         "activations_gib": round(measured["Activation"], 3)})
    base = rows[0]["measured_gib"]
    print(json.dumps(rows, indent=1))
    print("| context parallel | a rank's peak, measured | of 1 rank's | predicted | activations |\n|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['context_parallel']} | {row['measured_gib']} GiB | {row['measured_gib'] / base:.2f} | {row['predicted_gib']} GiB | "
              f"{row['activations_gib']} GiB |")


if __name__ == "__main__":
    main()
