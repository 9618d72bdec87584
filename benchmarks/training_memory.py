"""Peak GPU memory per rank of a training step, predicted by torch's FSDPMemTracker over a fake
process group under FakeTensorMode (gearshift.training.memory: the job's own model building and
parallel layout, one step at the real shapes, no memory or compute spent), for the models the
platform trains: Qwen2.5-32B (dense), Qwen3-30B-A3B and a 35B-class MoE (Qwen3-30B-A3B's layer
with 56 layers, 35.5B parameters, Agents-A1's size), on 8, 16 and 32 GPUs (one FSDP2 mesh over
all of them: runtime.mesh_shape [1, N]), with and without expert parallelism over 8 GPUs (a
node), full fine-tune and LoRA (r=16; the attention of an MoE, every linear layer of a dense
model), with context parallelism (each sequence's tokens split over --context-parallel ranks) and
tensor parallelism (a dense model's heads and MLP over --tensor-parallel ranks), one micro-batch
of 8k or 32k tokens (or --tokens), activation checkpointing on (without it a 32B
model's activations alone pass 80 GiB at 8k tokens). bf16 compute, float32 master weights and
AdamW moments. Each configuration runs in a process of its own, two at a time.

tests/jobs/test_memory_tracker.py holds the prediction to within 15% of the same step on 2 real
gloo ranks (it was within 0.3% on the tiny dense model and the tiny MoE).

    .venv/bin/python benchmarks/training_memory.py [--tokens 8192 32768] [--gpus 8 16 32] [--models ...]
        [--context-parallel 1 2 8] [--tensor-parallel 1 8] [--full-only]
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

QWEN3_30B_A3B = {
    "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 151936, "hidden_size": 2048,
    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
    "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1,
    "mlp_only_layers": [], "norm_topk_prob": True, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "tie_word_embeddings": False, "hidden_act": "silu",
}
MODELS = {
    "Qwen2.5-32B": {
        "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 152064, "hidden_size": 5120,
        "intermediate_size": 27648, "num_hidden_layers": 64, "num_attention_heads": 40, "num_key_value_heads": 8,
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": False,
        "hidden_act": "silu",
    },
    "Qwen3-30B-A3B": QWEN3_30B_A3B,
    "35B-class MoE": {**QWEN3_30B_A3B, "num_hidden_layers": 56},
}
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
EXPERT_PARALLEL = 8
FITS_GIB = 75  # of 80: the CUDA context and the allocator's cache take the rest


def configurations(models: list[str], gpus: list[int], tokens: list[int], context: list[int], tensor: list[int],
                   lora_too: bool = True) -> list[dict]:
    rows = []
    for name, count, length, lora, cp, tp in itertools.product(models, gpus, tokens, (False, True) if lora_too else (False,), context, tensor):
        moe = "num_experts" in MODELS[name]
        if tp > 1 and (moe or lora):  # tensor parallelism: dense models, full weights
            continue
        for parallel in ((1, EXPERT_PARALLEL) if moe else (1,)):
            model = {"gradient_checkpointing": True, **({"lora": True, "lora_rank": 16} if lora else {}),
                     **({"lora_target_modules": ATTENTION} if lora and moe else {})}
            runtime = {"expert_parallel": parallel, "context_parallel": cp, "tensor_parallel": tp, "micro_batch_tokens": length}
            rows.append({"model": name, "gpus": count, "tokens": length, "lora": lora, "expert_parallel": parallel, "context_parallel": cp,
                         "tensor_parallel": tp, "model_config": model, "runtime": runtime})
    return rows


def predict(row: dict, folder: Path) -> dict:
    config = folder / f"{row['model']}.json".replace(" ", "-")
    config.write_text(json.dumps(MODELS[row["model"]]))
    done = subprocess.run([sys.executable, "-m", "gearshift.training.memory", str(config), "--ranks", str(row["gpus"]),
                           "--tokens", str(row["tokens"]), "--model", json.dumps(row["model_config"]), "--runtime", json.dumps(row["runtime"])],
                          capture_output=True, text=True)
    described = {key: value for key, value in row.items() if key not in ("model_config", "runtime")}
    refusal = next((line for line in reversed(done.stderr.splitlines()) if "ValueError: " in line), None)
    if done.returncode and refusal:  # a layout the runtime refuses (degrees that do not divide the heads)
        return described | {"refused": refusal.split("ValueError: ", 1)[1]}
    if done.returncode:
        raise RuntimeError(f"{row['model']} on {row['gpus']}: {done.stderr[-2000:]}")
    peak = json.loads(done.stdout.splitlines()[-1])
    return described | {"peak_gib": round(peak["Total"], 1),
                        "parts_gib": {kind: round(value, 2) for kind, value in peak.items() if kind != "Total" and value >= 0.01}}


def markdown(rows: list[dict]) -> str:
    lines = ["| model | GPUs | tokens | weights | expert / context / tensor parallel | peak per GPU | on an 80 GiB GPU |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        if "refused" in row:
            continue
        fits = "yes" if row["peak_gib"] <= FITS_GIB else "tight" if row["peak_gib"] <= 80 else "no"
        lines.append(f"| {row['model']} | {row['gpus']} | {row['tokens'] // 1024}k | {'LoRA' if row['lora'] else 'full'} | "
                     f"{row['expert_parallel']} / {row['context_parallel']} / {row['tensor_parallel']} | {row['peak_gib']} GiB | {fits} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--gpus", nargs="*", type=int, default=[8, 16, 32])
    parser.add_argument("--tokens", nargs="*", type=int, default=[8192, 32768])
    parser.add_argument("--context-parallel", nargs="*", type=int, default=[1], help="runtime.context_parallel degrees")
    parser.add_argument("--tensor-parallel", nargs="*", type=int, default=[1], help="runtime.tensor_parallel degrees (dense, full weights)")
    parser.add_argument("--full-only", action="store_true", help="full fine-tunes alone, no LoRA rows")
    parser.add_argument("--no-unparallel-moe", action="store_true", help="skip MoE rows without expert parallelism (minutes each here)")
    args = parser.parse_args()
    rows = configurations(args.models, args.gpus, args.tokens, args.context_parallel, args.tensor_parallel, not args.full_only)
    if args.no_unparallel_moe:
        rows = [row for row in rows if row["expert_parallel"] > 1 or "num_experts" not in MODELS[row["model"]]]
    with tempfile.TemporaryDirectory() as folder, ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda row: predict(row, Path(folder)), rows))
    print(json.dumps(results, indent=1))
    print(markdown(results))


if __name__ == "__main__":
    main()
