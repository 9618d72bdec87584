"""Training on a GPU, next to TRL, in one run (scripts/gpu-check.sh runs it on a lent machine).

A randomly initialised Llama of a realistic size (default 1.2B: TinyLlama-1.1B's shape with the
SmolLM2 tokenizer's vocabulary; no weights travel, and speed does not depend on them) trains on
synthetic rows of token ids, the prompt masked and the completion learned:
- gearshift SFT: the SFT job's step (runtime micro-batches, the head on target tokens only,
  fused AdamW, clipping) in bf16 over float32 master weights, on cuda;
- TRL SFTTrainer on the same model directory and rows (completion-only loss, bf16 autocast over
  float32 weights, the same batch, AdamW), or a plain transformers loop where TRL is missing;
- one APO update: 12 rollouts of one group (rho = gamma = 3), the policy-gradient loss over
  their sampled tokens, through apo_update as the job runs it.
For each: tokens/s (median over timed steps after warm-up), model FLOPs utilisation, peak GPU
memory. MFU counts model FLOPs as PaLM does (6 per weight per token, plus 12 * layers * hidden *
sequence for attention; the head only on target tokens, since only they need it) against both the
H200 datasheet's dense bf16 peak and this run's own measured bf16 matrix product.

    python benchmarks/gpu_training.py --tokenizer .gpu/tokenizer --out OUT [--shape 1b] [--steps 6]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

DATASHEET_BF16_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0}  # dense, SXM
SHAPES = {
    "1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2),
}


def make_model(shape: str, tokenizer_dir: Path, folder: Path) -> tuple[Path, int]:
    """A seeded random Llama of the shape, saved with the tokenizer; returns it and its parameters."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(vocab_size=len(tokenizer), max_position_embeddings=4096, tie_word_embeddings=True,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, **SHAPES[shape])
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, sum(p.numel() for p in model.parameters())


def rows(vocab: int, count: int, length: int, prompt: int, seed: int = 0):
    """Synthetic examples: random ids, the first `prompt` masked, the rest learned."""
    from gearshift.training.tokenization import Encoded

    draw = random.Random(seed)
    return [Encoded([draw.randrange(vocab) for _ in range(length)], [False] * prompt + [True] * (length - prompt)) for _ in range(count)]


def model_flops(config, tokens: int, targets: int, length: int) -> float:
    hidden, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    kv = hidden * config.num_key_value_heads // config.num_attention_heads
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * config.intermediate_size  # q, o; k, v; the MLP
    return 6 * layers * per_layer * tokens + 6 * vocab * hidden * targets + 12 * layers * hidden * length * tokens


def matmul_tflops(device: torch.device) -> float:
    """This device's bf16 matrix product, measured (8192^3, mean of 10 after 3 warm-ups)."""
    if device.type != "cuda":
        return None
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ a
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(10):
        a @ a
    torch.cuda.synchronize()
    return 10 * 2 * 8192**3 / (time.perf_counter() - started) / 1e12


class Memory:
    """Peak device memory of what runs inside."""

    def __init__(self, device: torch.device):
        self.device, self.peak_gib = device, None

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            self.peak_gib = torch.cuda.max_memory_allocated(self.device) / 2**30


def figures(name: str, seconds: list[float], tokens: int, flops: float, memory: Memory, peaks: dict) -> dict:
    step = statistics.median(seconds)
    achieved = flops / step / 1e12
    return {"trainer": name, "steps_timed": len(seconds), "step_seconds": round(step, 3), "tokens_per_second": round(tokens / step),
            "model_tflops": round(achieved, 1), **{f"mfu_vs_{k}": round(achieved / v, 3) for k, v in peaks.items()},
            "peak_gpu_gib": None if memory.peak_gib is None else round(memory.peak_gib, 2)}


def job_config(job: str, model_dir: Path, args, scratch: Path, learning_rate: float, **extra):
    """The job's config as this benchmark runs it (the device, checkpointing, micro-batches)."""
    from gearshift.training.jobs import BY_NAME

    return BY_NAME[job].config_class().model_validate({
        "model": {"base": str(model_dir), "gradient_checkpointing": args.checkpointing},
        "optim": {"learning_rate": learning_rate, "max_steps": args.steps},
        "output": {"dir": str(scratch / job), "save_every": 10_000, "progress": False, "resume": False},
        "runtime": {"device": args.device, "micro_batch_tokens": args.micro_batch_tokens},
        **extra,
    })


def gearshift_sft(model_dir: Path, examples, args, scratch: Path) -> list[float]:
    from gearshift.jobs.sft.trainer import sft_loss_of
    from gearshift.training.runtime import Run

    config = job_config("sft", model_dir, args, scratch, 1e-5)
    run = Run.start("sft", config)
    total = sum(e.target_count for e in examples)
    seconds = []
    for step in run.steps():
        sync(run.ranks.device)
        started = time.perf_counter()
        run.update(step, run.micro_batches(examples), sft_loss_of(total), {}, started)
        sync(run.ranks.device)
        seconds.append(time.perf_counter() - started)
    return seconds[args.warmup:]


def trl_sft(model_dir: Path, examples, args, scratch: Path) -> tuple[str, list[float]]:
    """TRL's SFTTrainer on the same rows; the plain loop where TRL cannot be imported."""
    try:
        from datasets import Dataset
        from transformers import TrainerCallback
        from trl import SFTConfig, SFTTrainer
    except ImportError as exc:
        print(f"TRL is missing ({exc}): the reference is a plain transformers loop", flush=True)
        return "plain_transformers", plain_sft(model_dir, examples, args)

    class Timer(TrainerCallback):
        seconds: list[float] = []

        def on_step_begin(self, *_, **__):
            sync(device_of(args))
            self.started = time.perf_counter()

        def on_step_end(self, *_, **__):
            sync(device_of(args))
            self.seconds.append(time.perf_counter() - self.started)

    data = Dataset.from_list([{"input_ids": e.input_ids, "completion_mask": [int(t) for t in e.target]} for e in examples] * args.steps)
    cuda = args.device != "cpu"
    config = SFTConfig(
        output_dir=str(scratch / "trl"), per_device_train_batch_size=len(examples), max_steps=args.steps, learning_rate=1e-5,
        bf16=cuda, use_cpu=not cuda, completion_only_loss=True, max_length=None, packing=False, save_strategy="no", report_to=[],
        logging_steps=1, disable_tqdm=True, dataloader_num_workers=0, gradient_checkpointing=args.checkpointing, seed=0,
        model_init_kwargs={"dtype": torch.float32},
    )
    timer = Timer()
    SFTTrainer(model=str(model_dir), args=config, train_dataset=data, callbacks=[timer]).train()
    return "trl_sfttrainer", timer.seconds[args.warmup:]


def plain_sft(model_dir: Path, examples, args) -> list[float]:
    """The textbook loop: full logits, labels -100 off the completion, bf16 autocast, AdamW."""
    from gearshift.training.tokenization import collate
    from transformers import AutoModelForCausalLM

    device = device_of(args)
    batch = collate(examples, 0).to(device)
    labels = batch.input_ids.masked_fill(~batch.target_mask, -100)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    seconds = []
    for _ in range(args.steps):
        sync(device)
        started = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync(device)
        seconds.append(time.perf_counter() - started)
    return seconds[args.warmup:]


def gearshift_apo(model_dir: Path, rollouts, args, scratch: Path) -> list[float]:
    from gearshift.jobs.apo.trainer import RolloutBatch, apo_update
    from gearshift.training import advantages, losses
    from gearshift.training.runtime import Run

    config = job_config("apo", model_dir, args, scratch, 1e-6, prompts=[{"query": "q", "reference_answer": "a"}])
    run = Run.start("apo", config)
    rewards = torch.tensor([1.0, 0.0] * (len(rollouts) // 2))
    groups = torch.zeros(len(rollouts), dtype=torch.long)
    targets = torch.tensor([e.target_count for e in rollouts])
    batch = RolloutBatch(rollouts, rewards, groups, advantages.group_zscore(rewards, groups), losses.trajectory_weights(targets, groups))
    seconds = []
    for _ in range(args.steps):
        sync(run.ranks.device)
        started = time.perf_counter()
        apo_update(run, batch, config)
        sync(run.ranks.device)
        seconds.append(time.perf_counter() - started)
    return seconds[args.warmup:]


def device_of(args) -> torch.device:
    return torch.device("cuda" if args.device != "cpu" else "cpu")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", type=Path, required=True, help="a tokenizer directory (scripts/gpu-check.sh prepare saves SmolLM2's)")
    parser.add_argument("--out", type=Path, required=True, help="folder for report.json")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--rows", type=int, default=8, help="SFT rows per step")
    parser.add_argument("--length", type=int, default=2048, help="tokens per SFT row (a quarter of them the masked prompt)")
    parser.add_argument("--rollouts", type=int, default=12, help="APO rollouts (one group)")
    parser.add_argument("--rollout-length", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2, help="first steps left out of the medians")
    parser.add_argument("--micro-batch-tokens", type=int, default=16384)
    parser.add_argument("--checkpointing", action="store_true", help="activation checkpointing in every trainer")
    args = parser.parse_args()
    device = device_of(args)
    report: dict = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "torch": torch.__version__,
                    "shape": args.shape, "rows": args.rows, "length": args.length, "checkpointing": args.checkpointing}
    measured = matmul_tflops(device)
    peaks = {name: tflops for name, tflops in DATASHEET_BF16_TFLOPS.items() if name in report["device"]}
    peaks = {f"{name.lower()}_datasheet": tflops for name, tflops in peaks.items()} | ({"measured_matmul": measured} if measured else {})
    report["bf16_matmul_tflops"] = measured and round(measured, 1)
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        os.environ["GEARSHIFT_DATA_DIR"] = str(scratch / "data")
        model_dir, parameters = make_model(args.shape, args.tokenizer, scratch / "model")
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model_dir)
        report["parameters"] = parameters
        sft_rows = rows(config.vocab_size, args.rows, args.length, args.length // 4)
        tokens, targets = args.rows * args.length, sum(e.target_count for e in sft_rows)
        flops = model_flops(config, tokens, targets, args.length)
        with Memory(device) as memory:
            seconds = gearshift_sft(model_dir, sft_rows, args, scratch)
        report["sft"] = [figures("gearshift", seconds, tokens, flops, memory, peaks)]
        print(json.dumps(report["sft"][-1]), flush=True)
        with Memory(device) as memory:
            name, seconds = trl_sft(model_dir, sft_rows, args, scratch)
        report["sft"].append(figures(name, seconds, tokens, flops, memory, peaks))
        print(json.dumps(report["sft"][-1]), flush=True)
        report["sft_gearshift_vs_reference"] = round(report["sft"][0]["tokens_per_second"] / report["sft"][1]["tokens_per_second"], 2)
        apo_rows = rows(config.vocab_size, args.rollouts, args.rollout_length, args.rollout_length // 4, seed=1)
        apo_tokens, apo_targets = args.rollouts * args.rollout_length, sum(e.target_count for e in apo_rows)
        with Memory(device) as memory:
            seconds = gearshift_apo(model_dir, apo_rows, args, scratch)
        report["apo_update"] = figures("gearshift", seconds, apo_tokens, model_flops(config, apo_tokens, apo_targets, args.rollout_length), memory, peaks)
        print(json.dumps(report["apo_update"]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
