"""Training on a GPU, next to TRL, in one run (scripts/gpu-check.sh runs it on a lent machine).

A randomly initialised Llama of a realistic size (default 1.2B: TinyLlama-1.1B's shape with the
SmolLM2 tokenizer's vocabulary; no weights travel, and speed does not depend on them) trains on
synthetic rows of token ids, the prompt masked and the completion learned:
- gearshift SFT: the SFT job's step (runtime micro-batches, the head on target tokens only,
  fused AdamW, clipping) in bf16 over float32 master weights, on cuda;
- TRL SFTTrainer on the same model directory and rows (completion-only loss, bf16 autocast over
  float32 weights, the same batch, AdamW), or a plain transformers loop where TRL is missing;
- one APO update: 12 rollouts of one group (rho = gamma = 3), the policy-gradient loss over
  their sampled tokens, through apo_update as the job runs it;
- load: a 7B-shaped random checkpoint (Llama-2-7B's layers, bf16 files) loaded as a run loads it
  (meta device, then each tensor read straight into its place), full fine-tune (float32 master
  weights) and LoRA (the base in bf16): peak GPU and host memory against the weights' own size;
- fsdp: with two GPUs or more, the SFT phase again as one job across all of them (torchrun, FSDP2);
- moe: a random Qwen3-MoE (1.4B, 32 experts, 4 per token) through the SFT job's steps with the
  routers' balancing loss, and one step's peak memory as torch's FSDPMemTracker predicts it over a
  fake process group against the same step measured (gearshift.training.memory);
- varlen: --rows sequences of --length tokens packed in one row, forward.block_attention and (where
  flash_attn imports) flash attention's varlen, against padded rows: seconds, memory, agreement;
- stream: with two GPUs or more, the model's bf16 export streamed in buckets (weight_stream, the
  transport of rollout.weight_transfer nccl) from this process's GPU to a receiver process on the
  next over NCCL: seconds, GB/s, the most bytes held; with one GPU a note, skipped; on the CPU
  (the dry run) the same over gloo;
- context: with two GPUs or more, one step on one sequence of 8 x --length tokens on one GPU and
  split over two by context parallelism (Ulysses): a rank's peak measured and predicted; with one
  GPU, skipped.
For each: tokens/s (median over timed steps after warm-up), model FLOPs utilisation, peak GPU
memory. MFU counts model FLOPs as PaLM does (6 per weight per token, plus 12 * layers * hidden *
sequence for attention; the head only on target tokens, since only they need it) against both the
H200 datasheet's dense bf16 peak and this run's own measured bf16 matrix product.

Every phase's figures reach OUT/report.json as the phase ends; a phase that fails is recorded
there with its error and the next one runs; memory is freed between phases.

    python benchmarks/gpu_training.py --tokenizer .gpu/tokenizer --out OUT [--shape 1b] [--steps 6] [--phases sft,apo]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

DATASHEET_BF16_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0}  # dense, SXM
SHAPES = {
    "1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4),
    "7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32),
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


# Qwen3-MoE shapes (Agents-A1's kind): "1b" is about 1.4B parameters (32 experts, 4 per token), a
# full fine-tune of which fits one 80 GiB GPU at 2k-token rows; "tiny" runs the same path on a CPU.
MOE_SHAPES = {
    "1b": dict(hidden_size=1024, moe_intermediate_size=768, num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=4,
               head_dim=128, num_experts=32, num_experts_per_tok=4),
    "tiny": dict(hidden_size=64, moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                 head_dim=32, num_experts=4, num_experts_per_tok=2),
}


def make_moe(shape: str, tokenizer_dir: Path, folder: Path) -> tuple[Path, int]:
    """A seeded random Qwen3-MoE of the shape (every layer sparse), saved as save_pretrained writes
    it (one tensor per expert) with the tokenizer; returns it and its parameters."""
    from transformers import AutoTokenizer, Qwen3MoeConfig, Qwen3MoeForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    shape_of = MOE_SHAPES[shape]
    config = Qwen3MoeConfig(vocab_size=len(tokenizer), intermediate_size=2 * shape_of["hidden_size"], decoder_sparse_step=1, mlp_only_layers=[],
                            max_position_embeddings=4096, tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id,
                            eos_token_id=tokenizer.eos_token_id, **shape_of)
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(config)
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
    from gearshift.job_table import BY_NAME

    return BY_NAME[job].config_class().model_validate({
        "model": {"base": str(model_dir), "gradient_checkpointing": args.checkpointing},
        "optim": {"learning_rate": learning_rate, "max_steps": args.steps},
        "output": {"dir": str(scratch / job), "save_every": 10_000, "progress": False, "resume": False},
        "runtime": {"device": args.device, "micro_batch_tokens": args.micro_batch_tokens},
        **extra,
    })


def gearshift_sft(model_dir: Path, examples, args, scratch: Path) -> list[float]:
    """The SFT job's steps; under torchrun each rank its share of the rows, as the job does."""
    from gearshift.jobs.sft.trainer import sft_loss_of
    from gearshift.training.runtime import Run

    config = job_config("sft", model_dir, args, scratch, 1e-5)
    run = Run.start("sft", config)
    total = sum(e.target_count for e in examples)
    seconds = []
    for step in run.steps():
        sync(run.ranks.device)
        started = time.perf_counter()
        run.update(step, run.micro_batches(run.ranks.shard(examples)), sft_loss_of(run, total), {}, started)
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


def random_checkpoint(shape: str, tokenizer_dir: Path, folder: Path) -> int:
    """A seeded random Llama of the shape in bf16 safetensors, one file per decoder layer, written
    tensor by tensor (never whole in memory, as a 7B model's 13 GiB would be); returns its
    parameters."""
    from gearshift.training import loading
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, LlamaConfig

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(vocab_size=len(tokenizer), max_position_embeddings=4096, tie_word_embeddings=False,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, dtype="bfloat16", **SHAPES[shape])
    folder.mkdir(parents=True)
    config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    from transformers import LlamaForCausalLM

    with loading.parameters_on_meta():
        meta = LlamaForCausalLM(config)
    files: dict[str, dict[str, torch.Tensor]] = {}
    for name, param in meta.named_parameters():
        layer = name.split(".")[2] if ".layers." in name else "rest"
        files.setdefault(f"model-{layer}.safetensors", {})[name] = param
    generator = torch.Generator().manual_seed(0)
    weight_map, total = {}, 0
    for file, members in files.items():
        tensors = {name: (torch.randn(param.shape, generator=generator) * 0.02).to(torch.bfloat16) for name, param in members.items()}
        save_file(tensors, folder / file, metadata={"format": "pt"})
        weight_map |= dict.fromkeys(tensors, file)
        total += sum(t.numel() for t in tensors.values())
        del tensors
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 2 * total}, "weight_map": weight_map}))
    return total


def peak_host_gib() -> float:
    """This process's peak resident memory since reset_host_peak()."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def reset_host_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def load_memory(args, scratch: Path) -> dict:
    """A checkpoint of --load-shape (7B) loaded as a run loads it, full fine-tune then LoRA: peak GPU and host
    memory (the latter above what the process held before) against the weights' own size."""
    from gearshift.training import checkpoints
    from gearshift.training.config import ModelConfig, RuntimeConfig

    folder = scratch / f"load-{args.load_shape}"
    started = time.perf_counter()
    parameters = random_checkpoint(args.load_shape, args.tokenizer, folder)
    figures = {"parameters": parameters, "write_seconds": round(time.perf_counter() - started, 1)}
    device = device_of(args)
    for lora in (False, True):
        before = peak_host_gib()
        reset_host_peak()
        with Memory(device) as memory:
            started = time.perf_counter()
            policy = checkpoints.load_policy(ModelConfig(base=str(folder), lora=lora), folder.parent, torch.bfloat16,
                                             runtime=RuntimeConfig(device=args.device))
            sync(device)
            seconds = time.perf_counter() - started
        weights_gib = parameters * (2 if lora else 4) / 2**30  # the bf16 base, or float32 master weights
        figures["lora" if lora else "full"] = {
            "seconds": round(seconds, 1), "weights_gib": round(weights_gib, 2),
            "peak_gpu_gib": memory.peak_gib and round(memory.peak_gib, 2),
            "peak_gpu_over_weights": memory.peak_gib and round(memory.peak_gib / weights_gib, 3),
            "host_peak_gib": round(peak_host_gib(), 2), "host_before_gib": round(before, 2),
        }
        print(json.dumps(figures), flush=True)
        del policy
        free()
    return figures


def fsdp_sft(args, model_dir: Path) -> dict:
    """The SFT phase as one job across every GPU of this machine (torchrun, FSDP2)."""
    gpus = torch.cuda.device_count()
    if gpus < 2:
        return {"skipped": f"{gpus} GPU: FSDP across GPUs needs two or more"}
    out = args.out / "fsdp"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}", __file__,
               "--tokenizer", str(args.tokenizer), "--out", str(out), "--model-dir", str(model_dir), "--phases", "sft",
               "--shape", args.shape, "--rows", str(args.rows * gpus), "--length", str(args.length), "--steps", str(args.steps),
               "--warmup", str(args.warmup), "--micro-batch-tokens", str(args.micro_batch_tokens)] + (["--checkpointing"] if args.checkpointing else [])
    subprocess.run(command, check=True, timeout=1200)
    return {"gpus": gpus, **json.loads((out / "report.json").read_text())["sft"][0]}


def memory_step(model_dir: Path, tokens: int, out: Path, device: str, measure: bool, ranks: int = 1, context_parallel: int = 1) -> dict:
    """gearshift.training.memory's one-step peak (GiB per kind) on rank 0 of ranks: predicted over a
    fake process group, or measured on a real one (torchrun), each in a process of its own."""
    runtime = json.dumps({"device": device, "context_parallel": context_parallel})
    command = [sys.executable, "-m", "gearshift.training.memory", str(model_dir / "config.json"), "--ranks", str(ranks),
               "--tokens", str(tokens), "--runtime", runtime, "--out", str(out)]
    if measure:
        command[1:3] = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", "-m", "gearshift.training.memory"]
        command.append("--measure")
    subprocess.run(command, check=True, timeout=900)
    return json.loads(out.read_text())


def moe_sft(args, scratch: Path, peaks: dict) -> dict:
    """A random MoE (MOE_SHAPES) through the SFT job's steps, the routers' balancing loss in the
    objective; then one step of one row of --length tokens: the tracker's predicted peak against
    the same step measured (the tracker's live tensors, and CUDA's own peak allocation)."""
    model_dir, parameters = make_moe(args.moe_shape, args.tokenizer, scratch / "moe-model")
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    examples = rows(config.vocab_size, args.rows, args.length, args.length // 4, seed=2)
    tokens = args.rows * args.length
    active = config.num_experts_per_tok / config.num_experts  # the expert FLOPs a token runs
    expert = 3 * config.hidden_size * config.moe_intermediate_size * config.num_experts * config.num_hidden_layers
    flops = 6 * (parameters - expert * (1 - active)) * tokens
    with Memory(device_of(args)) as memory:
        seconds = gearshift_sft(model_dir, examples, args, scratch / "moe")
    last = json.loads((scratch / "moe" / "sft" / "metrics.jsonl").read_text().splitlines()[-1])
    predicted = memory_step(model_dir, args.length, scratch / "predicted.json", args.device, measure=False)
    measured = memory_step(model_dir, args.length, scratch / "measured.json", args.device, measure=True)
    return {"shape": args.moe_shape, "parameters": parameters, "experts": config.num_experts, "per_token": config.num_experts_per_tok,
            **figures("gearshift", seconds, tokens, flops, memory, peaks),
            "balance_loss": last.get("balance_loss"), "expert_tokens_last_layer": (last.get("expert_tokens") or [None])[-1],
            "step_tokens": args.length, "predicted_gib": round(predicted["Total"], 3), "measured_tracker_gib": round(measured["Total"], 3),
            "measured_cuda_max_allocated_gib": measured.get("cuda_max_allocated") and round(measured["cuda_max_allocated"], 3),
            "predicted_over_measured": round(predicted["Total"] / measured["Total"], 3)}


def context_parallel(args, model_dir: Path, scratch: Path) -> dict:
    """One step on one sequence of 8 x --length tokens: on one GPU, and split over two by context
    parallelism (Ulysses) when there are two; a rank's peak measured (the tracker's live tensors and
    CUDA's own allocation) beside the tracker's prediction."""
    gpus, tokens = torch.cuda.device_count(), 8 * args.length
    if gpus < 2:
        return {"skipped": f"{gpus} GPU: context parallelism across GPUs needs two or more"}
    report = {"tokens": tokens}
    for ranks in (1, 2):
        measured = memory_step(model_dir, tokens, scratch / f"cp{ranks}-measured.json", args.device, True, ranks, ranks)
        predicted = memory_step(model_dir, tokens, scratch / f"cp{ranks}-predicted.json", args.device, False, ranks, ranks)
        report[f"context_parallel_{ranks}"] = {"measured_tracker_gib": round(measured["Total"], 3), "predicted_gib": round(predicted["Total"], 3),
                                               "measured_cuda_max_allocated_gib": round(measured.get("cuda_max_allocated", 0.0), 3)}
    return report


def varlen_packing(args, model_dir: Path, peaks: dict) -> dict:
    """--rows sequences of --length tokens, packed in one row (forward.block_attention on sdpa,
    then flash attention's varlen where flash_attn imports) against padded rows, in bf16: each
    layout's forward and backward of the target tokens' log-probabilities, median seconds and peak
    memory, and how far its log-probabilities are from the padded ones."""
    from transformers import AutoModelForCausalLM

    from gearshift.training import batching, forward

    device = device_of(args)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(device)
    module = forward.TargetForward(model)  # sdpa runs as block_attention
    examples = rows(model.config.vocab_size, args.rows, args.length, args.length // 4, seed=3)
    layouts = {"padded": batching.plan(examples, 0, 0)[0], "packed, blocks": batching.pack(examples, 0, 0, share_prefix=False)[0]}
    layouts["padded"].share_prefix = False
    try:
        import flash_attn  # noqa: F401 - only whether it is there
        flash = True
    except ImportError:
        flash = False

    def run(micro) -> tuple[torch.Tensor, list[float], Memory]:
        seconds = []
        with Memory(device) as memory:
            for _ in range(args.steps):
                sync(device)
                started = time.perf_counter()
                out = forward.through(module, micro.batch.to(device), False)
                out.logprobs.float().sum().backward()
                sync(device)
                seconds.append(time.perf_counter() - started)
                module.zero_grad(set_to_none=True)
        return out.logprobs.detach().float(), seconds[args.warmup:], memory

    tokens = sum(len(e.input_ids) for e in examples)
    report, reference = {"sequences": args.rows, "length": args.length, "flash_attn": flash}, None
    for name, micro in layouts.items():
        logprobs, seconds, memory = run(micro)
        reference = logprobs if reference is None else reference
        report[name] = {"step_seconds": round(statistics.median(seconds), 4), "tokens_per_second": round(tokens / statistics.median(seconds)),
                        "peak_gpu_gib": memory.peak_gib and round(memory.peak_gib, 3),
                        "max_abs_logprob_difference": float((logprobs - reference).abs().max())}
    if flash:
        model.set_attn_implementation("flash_attention_2")
        logprobs, seconds, memory = run(layouts["packed, blocks"])
        report["packed, flash varlen"] = {"step_seconds": round(statistics.median(seconds), 4),
                                          "tokens_per_second": round(tokens / statistics.median(seconds)),
                                          "peak_gpu_gib": memory.peak_gib and round(memory.peak_gib, 3),
                                          "max_abs_logprob_difference": float((logprobs - reference).abs().max())}
    return report


def stream_weights(args, model_dir: Path) -> dict:
    """The model's bf16 export streamed bucket by bucket (--bucket-mib) to a receiver process, as
    rollout.weight_transfer nccl streams it into vLLM (which is not installed here: the receiver is
    weight_stream's own): from cuda:0 to a process on the second GPU over NCCL, or over gloo on the
    CPU; what each side counted, and rank 0's most bytes held against the bucket size."""
    from gearshift.testing.ports import free_port
    from gearshift.training import checkpoints, weight_stream
    from gearshift.training.config import ModelConfig
    from gearshift.training.distributed import Ranks

    device = device_of(args)
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    if device.type == "cuda" and gpus < 2:
        note = f"{gpus} GPU: streaming weights over NCCL takes two (the trainer's and the receiver's); the stream phase is skipped"
        print(note, flush=True)
        return {"skipped": note}
    backend, address, out = ("nccl" if gpus else "gloo"), f"127.0.0.1:{free_port()}", args.out / "stream"
    env = {**os.environ, **({"CUDA_VISIBLE_DEVICES": "1"} if gpus else {})}
    receiver = subprocess.Popen([sys.executable, "-m", "gearshift.training.weight_stream", "--address", address, "--backend", backend,
                                 "--out", str(out)], env=env)
    try:
        policy = checkpoints.load_policy(ModelConfig(base=str(model_dir)), model_dir.parent, ranks=Ranks(device=device))
        group = weight_stream.join(backend, address, 0, 2, device)
        tensors = checkpoints.export_tensors(policy, torch.bfloat16)
        streamed = asyncio.run(weight_stream.to_receivers(tensors, args.bucket_mib << 20, group))
        receiver.wait(timeout=300)
    finally:
        receiver.kill()
    received = json.loads((out / "report.json").read_text())[0]
    return {"backend": backend, "bucket_bytes": args.bucket_mib << 20, "buckets": len(streamed.buckets), "tensors": streamed.tensors,
            "bytes": streamed.bytes, "seconds": round(streamed.seconds, 3), "gb_per_second": round(streamed.bytes / streamed.seconds / 1e9, 2),
            "largest_bucket": max(nbytes for nbytes, _ in streamed.buckets), "peak_held_bytes": streamed.peak_held,
            "received_bytes": received["bytes"], "received_tensors": len(received["names"]), "receiver_seconds": received["seconds"]}


def free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def attempt(report: dict, name: str, phase, out: Path) -> None:
    """Runs a phase into report[name]; a failure is recorded (report["failed"]) and the next phase
    runs. The report is written after every phase, on rank 0."""
    try:
        report[name] = phase()
        print(json.dumps({name: report[name]}), flush=True)
    except Exception as exc:  # noqa: BLE001 - every phase's failure is a finding for the report
        traceback.print_exc()
        report.setdefault("failed", {})[name] = f"{type(exc).__name__}: {exc}"
    finally:
        free()
        if int(os.environ.get("RANK", "0")) == 0:
            out.mkdir(parents=True, exist_ok=True)
            (out / "report.json").write_text(json.dumps(report, indent=2))


PHASES = ("sft", "trl", "apo", "load", "fsdp", "moe", "varlen", "stream", "context")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", type=Path, required=True, help="a tokenizer directory (scripts/gpu-check.sh prepare saves SmolLM2's)")
    parser.add_argument("--out", type=Path, required=True, help="folder for report.json")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated, of {', '.join(PHASES)}")
    parser.add_argument("--load-shape", choices=sorted(SHAPES), default="7b", help="the load phase's model")
    parser.add_argument("--moe-shape", choices=sorted(MOE_SHAPES), default="1b", help="the moe phase's model")
    parser.add_argument("--model-dir", type=Path, help="train this checkpoint instead of making one (the fsdp phase's ranks)")
    parser.add_argument("--rows", type=int, default=8, help="SFT rows per step")
    parser.add_argument("--length", type=int, default=2048, help="tokens per SFT row (a quarter of them the masked prompt)")
    parser.add_argument("--rollouts", type=int, default=12, help="APO rollouts (one group)")
    parser.add_argument("--rollout-length", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2, help="first steps left out of the medians")
    parser.add_argument("--micro-batch-tokens", type=int, default=16384)
    parser.add_argument("--checkpointing", action="store_true", help="activation checkpointing in every trainer")
    parser.add_argument("--bucket-mib", type=int, default=256, help="the stream phase's bucket size")
    args = parser.parse_args()
    phases = args.phases.split(",")
    if unknown := set(phases) - set(PHASES):
        parser.error(f"unknown phases {sorted(unknown)}: choose among {', '.join(PHASES)}")
    device = device_of(args)
    report: dict = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "torch": torch.__version__,
                    "gpus": torch.cuda.device_count(), "shape": args.shape, "rows": args.rows, "length": args.length,
                    "checkpointing": args.checkpointing, "phases": phases}
    measured = matmul_tflops(device)
    peaks = {name: tflops for name, tflops in DATASHEET_BF16_TFLOPS.items() if name in report["device"]}
    peaks = {f"{name.lower()}_datasheet": tflops for name, tflops in peaks.items()} | ({"measured_matmul": measured} if measured else {})
    report["bf16_matmul_tflops"] = measured and round(measured, 1)
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        os.environ["GEARSHIFT_DATA_DIR"] = str(scratch / "data")
        if args.model_dir:
            model_dir = args.model_dir
        else:
            model_dir, report["parameters"] = make_model(args.shape, args.tokenizer, scratch / "model")
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model_dir)
        sft_rows = rows(config.vocab_size, args.rows, args.length, args.length // 4)
        tokens, targets = args.rows * args.length, sum(e.target_count for e in sft_rows)
        flops = model_flops(config, tokens, targets, args.length)

        def timed(trainer):
            with Memory(device) as memory:
                name, seconds = trainer()
            return figures(name, seconds, tokens, flops, memory, peaks)

        if "sft" in phases:
            attempt(report, "sft", lambda: [timed(lambda: ("gearshift", gearshift_sft(model_dir, sft_rows, args, scratch)))], args.out)
        if "trl" in phases:
            attempt(report, "sft_reference", lambda: timed(lambda: trl_sft(model_dir, sft_rows, args, scratch)), args.out)
        if report.get("sft") and report.get("sft_reference"):
            report["sft_gearshift_vs_reference"] = round(report["sft"][0]["tokens_per_second"] / report["sft_reference"]["tokens_per_second"], 2)
        if "apo" in phases:
            apo_rows = rows(config.vocab_size, args.rollouts, args.rollout_length, args.rollout_length // 4, seed=1)
            apo_tokens, apo_targets = args.rollouts * args.rollout_length, sum(e.target_count for e in apo_rows)

            def apo():
                with Memory(device) as memory:
                    seconds = gearshift_apo(model_dir, apo_rows, args, scratch)
                return figures("gearshift", seconds, apo_tokens, model_flops(config, apo_tokens, apo_targets, args.rollout_length), memory, peaks)

            attempt(report, "apo_update", apo, args.out)
        if "load" in phases:
            attempt(report, f"load_{args.load_shape}", lambda: load_memory(args, scratch), args.out)
        if "fsdp" in phases:
            attempt(report, "fsdp_sft", lambda: fsdp_sft(args, model_dir), args.out)
        if "moe" in phases:
            attempt(report, "moe_sft", lambda: moe_sft(args, scratch, peaks), args.out)
        if "varlen" in phases:
            attempt(report, "varlen_packing", lambda: varlen_packing(args, model_dir, peaks), args.out)
        if "stream" in phases:
            attempt(report, "weight_stream", lambda: stream_weights(args, model_dir), args.out)
        if "context" in phases:
            attempt(report, "context_parallel", lambda: context_parallel(args, model_dir, scratch), args.out)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
