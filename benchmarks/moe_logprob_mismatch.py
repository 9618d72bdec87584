"""How far the log-probabilities vLLM returns with its sampled tokens (the behaviour policy of
on-policy training) are from the trainer's own for the same tokens, on the tiny Qwen3-MoE (random
weights, a decisive router) and a dense Qwen3 of its attention and size (an MLP in place of the
experts), float32 on both sides: vLLM's CPU build samples
`--samples` continuations of 48 tokens of each of 4 prompts at temperature 1 with each sampled
token's log-probability; the trainer's forward (gearshift.training.forward, as APO and
distillation score) recomputes them. Figures per model: the mean and largest |difference|, the
share of tokens whose ratio exp(trainer - vLLM) lies outside [0.8, 1.25] and outside the band
the trainers mask (rollout.off_policy.mask_band), and the mismatch as metrics.jsonl logs it.

    .venv/bin/python benchmarks/moe_logprob_mismatch.py [--samples 4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from gearshift.training.config import OffPolicyConfig  # noqa: E402

PROMPTS = ["What is 12*34?", "Name three rivers of Europe.", "Explain recursion briefly.", "Write a haiku about rain."]
VLLM_PYTHON = Path(os.environ.get("GEARSHIFT_VLLM_PYTHON", Path.home() / ".cache/gearshift/vllm-venv/bin/python"))
SAMPLER = '''
import json, sys
from vllm import LLM, SamplingParams
if __name__ == "__main__":
    model, samples, prompts = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    llm = LLM(model=model, dtype="float32", max_model_len=512, enforce_eager=True, seed=0)
    params = SamplingParams(temperature=1.0, max_tokens=48, n=samples, logprobs=0, seed=0, ignore_eos=True)
    rows = []
    for prompt, result in zip(prompts, llm.generate(prompts, params)):
        for out in result.outputs:
            rows.append({"prompt": list(result.prompt_token_ids), "tokens": list(out.token_ids),
                         "logprobs": [entry[token].logprob for token, entry in zip(out.token_ids, out.logprobs)]})
    print("ROWS", json.dumps(rows), flush=True)
'''


def tiny_dense_qwen3(directory: Path) -> Path:
    """The tiny MoE's shape with a dense MLP (vLLM's CPU attention needs head_dim 32 at least)."""
    from gearshift import weights
    from gearshift.settings import Settings
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tokenizer = weights.smollm2_tokenizer(Settings().models_dir)
    moe = weights.tiny_moe_config(len(tokenizer))
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "max_position_embeddings", "bos_token_id", "eos_token_id", "tie_word_embeddings")
    torch.manual_seed(0)
    Qwen3ForCausalLM(Qwen3Config(**{key: getattr(moe, key) for key in keys})).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def vllm_samples(model: Path, samples: int, folder: Path) -> list[dict]:
    script = folder / "sampler.py"
    script.write_text(SAMPLER)
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1"}
    done = subprocess.run([str(VLLM_PYTHON), str(script), str(model), str(samples), json.dumps(PROMPTS)], capture_output=True, text=True, env=env)
    rows = [line.removeprefix("ROWS ") for line in done.stdout.splitlines() if line.startswith("ROWS ")]
    if done.returncode or not rows:
        raise RuntimeError((done.stdout + done.stderr)[-3000:])
    return json.loads(rows[0])


def trainer_logprobs(model: Path, rows: list[dict]) -> list[list[float]]:
    from gearshift.training import forward
    from gearshift.training.tokenization import Batch
    from transformers import AutoModelForCausalLM

    module = forward.TargetForward(AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval())
    found = []
    with torch.no_grad():
        for row in rows:
            ids = torch.tensor([row["prompt"] + row["tokens"]])
            targets = torch.zeros_like(ids, dtype=torch.bool)
            targets[0, len(row["prompt"]):] = True
            found.append(forward.through(module, Batch(ids, torch.ones_like(ids), targets)).logprobs.tolist())
    return found


def compare(model: Path, samples: int, folder: Path) -> dict:
    rows = vllm_samples(model, samples, folder)
    ours = trainer_logprobs(model, rows)
    differences = torch.tensor([a - b for row, mine in zip(rows, ours) for a, b in zip(mine, row["logprobs"])], dtype=torch.float64)
    ratios = differences.exp()
    low, high = OffPolicyConfig().mask_band
    return {"tokens": len(differences), "mean_abs_difference": float(differences.abs().mean()), "max_abs_difference": float(differences.abs().max()),
            "share_outside_0.8_1.25": float(((ratios < 0.8) | (ratios > 1.25)).float().mean()),
            f"share_masked_outside_{low}_{high}": float(((ratios < low) | (ratios > high)).float().mean()),
            "mismatch_kl": float((ratios - differences - 1).mean())}  # as the trainers log it: k3 of KL(vLLM || trainer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=4, help="continuations per prompt")
    args = parser.parse_args()
    from gearshift.training.tiny import tiny_moe_checkpoint

    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        report = {name: compare(make(folder / name), args.samples, folder)
                  for name, make in (("tiny dense Qwen3", tiny_dense_qwen3), ("tiny Qwen3-MoE", tiny_moe_checkpoint))}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
