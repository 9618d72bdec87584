"""Training speed next to TRL, in one run on the same model and batch (not a timed test).

SFT: tokens/s of gearshift's SFT step (the loop of gearshift.jobs.sft: head on target tokens
only, AdamW, clipping, metrics line) against TRL's SFTTrainer and a plain PyTorch loop, on
SmolLM2-135M and the same 4 prompt/completion pairs of about 133 tokens (loss on the
completion in all three). With --ranks N, also gearshift as one job on N ranks under torchrun
(FSDP2, gloo), the same global batch and the machine's threads shared among the ranks: the
scaling efficiency is its tokens/s over one rank's, and the peak resident memory of each rank is
set against one rank's (parameters, gradients and optimizer state are sharded).
APO: one gearshift APO step (1 prompt, rho=1 forced rollout per mode + gamma=1 free = 4
rollouts, at most 32 generated tokens per call, through the in-process executor, sandbox,
router, planner and reward service) against one TRL GRPOTrainer step (1 prompt x 4
completions x 32 tokens, generation with transformers).

SFT runs the trainers round-robin (a shared machine's load falls on all alike); figures are
medians over the timed steps (each run's first step is a warm-up and not counted). Every trainer
of a run uses the same malloc: jemalloc when Debian's libjemalloc2 is installed (glibc's keeps the
freed buffers of FSDP's gathers and gradients resident, and runs slower), else glibc's.

    apt-get install -y libjemalloc2   # optional; --allocator glibc to compare
    .venv/bin/python benchmarks/training_speed.py [--ranks 2] [--rounds 3] [--per-round 2] [--apo-steps 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import functools
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
from gearshift import weights  # noqa: E402
from gearshift.settings import Settings  # noqa: E402

PAIRS = [
    ("Explain in one paragraph why the sky is blue.",
     "Sunlight is made of many colours. When it enters the atmosphere, the short blue wavelengths are scattered by air "
     "molecules much more strongly than the long red ones, a process called Rayleigh scattering. That scattered blue light "
     "reaches our eyes from every direction of the sky, so the sky looks blue during the day. At sunset the light crosses much more air, the blue is scattered away before it reaches us, and the reds and oranges that remain colour the sky."),
    ("What does a compiler do? Answer briefly.",
     "A compiler translates a program written in a high-level language into a lower-level form, usually machine code or "
     "bytecode, that a computer can execute. It parses the source, checks it for errors, optimises it and emits the "
     "result, so the program can run quickly without the original source being interpreted line by line. Well-known examples are GCC and Clang for C, rustc for Rust, and javac, which emits bytecode for the JVM."),
    ("Give a short summary of photosynthesis.",
     "Photosynthesis is how plants, algae and some bacteria turn light into chemical energy. In the chloroplasts, light "
     "drives the splitting of water, which releases oxygen, and the energy captured is used to fix carbon dioxide from "
     "the air into sugars. Those sugars feed the plant and, through food chains, almost all life on Earth. The overall reaction combines six molecules of carbon dioxide and six of water into one of glucose and six of oxygen."),
    ("Why do we use version control? Be concise.",
     "Version control records every change to a project's files, with who made it and why. Teams can work in parallel "
     "on branches and merge their work, review changes before they land, find when a bug was introduced, and go back "
     "to any earlier state. It turns a folder of files into a history that is safe to experiment with. Git is the most common tool today, and hosted services add pull requests, reviews and continuous integration on top of it."),
]


JEMALLOC = Path("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")  # Debian's libjemalloc2


def median_after_warmup(values: list[float]) -> float:
    return statistics.median(values[1:] if len(values) > 1 else values)


def model_dir() -> Path:
    return weights.cache_smollm2(Settings().models_dir)


# SFT


def sft_examples(tokenizer):
    """The shared batch: chat-rendered prompt, completion as the target."""
    from gearshift.training import tokenization

    encoded = []
    for prompt, completion in PAIRS:
        prompt_ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
        ids = tokenizer(prompt_ids, add_special_tokens=False)["input_ids"]
        target = tokenizer(completion + "<|im_end|>", add_special_tokens=False)["input_ids"]
        encoded.append(tokenization.Encoded(ids + target, [False] * len(ids) + [True] * len(target)))
    return encoded


def sft_batch(tokenizer):
    from gearshift.training import tokenization

    return tokenization.collate(sft_examples(tokenizer), tokenizer.pad_token_id)


def sft_worker(path: Path, out: Path, steps: int, threads: int, scratch: Path, parallelism: str) -> None:
    """gearshift's SFT step (the loop body of gearshift.jobs.sft: the run's micro-batches of this
    rank's share, AdamW, clipping, a metrics line) on the shared batch, in this process, alone or
    as one rank of a torchrun launch. Rank 0 writes each step's seconds and every rank's peak RSS."""
    from gearshift.jobs.sft.config import SFTConfig
    from gearshift.jobs.sft.trainer import sft_loss_of
    from gearshift.training.runtime import Run

    config = SFTConfig.model_validate(
        {"model": {"base": str(path)}, "optim": {"learning_rate": 1e-5, "max_steps": steps, "threads": threads},
         "output": {"dir": str(scratch), "save_every": 10_000, "progress": False, "resume": False},
         "runtime": {"parallelism": parallelism}}
    )
    run = Run.start("sft", config)
    examples = sft_examples(run.tokenizer)
    total = sum(example.target_count for example in examples)
    seconds = []
    for step in run.steps():
        started = time.perf_counter()
        run.update(step, run.micro_batches(run.ranks.shard(examples)), sft_loss_of(run, total), {}, started)
        seconds.append(time.perf_counter() - started)
    # This process's own high-water mark (getrusage's maxrss would count the benchmark process,
    # whose memory a fork and exec pass on to it).
    peak = int(next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM")).split()[1]) / 1024
    peaks = [run.ranks.max([peak if rank == run.ranks.rank else 0.0])[0] for rank in range(run.ranks.world_size)]
    if run.ranks.main:
        tokens = sum(len(example.input_ids) for example in examples)
        out.write_text(json.dumps({"seconds": seconds, "tokens": tokens, "peak_rss_mib": peaks}))


def gearshift_sft(path: Path, ranks: int, threads: int, steps: int, scratch: Path, parallelism: str = "fsdp") -> dict:
    """sft_worker in fresh processes: one, or `ranks` under torchrun (each with threads // ranks)."""
    scratch.mkdir(parents=True, exist_ok=True)
    out = scratch / f"sft-{ranks}.json"
    worker = [__file__, "--sft-worker", str(out), "--steps", str(steps), "--threads", str(max(1, threads // ranks)),
              "--parallelism", parallelism]
    if ranks > 1:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", *worker]
    else:
        command = [sys.executable, *worker]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": str(max(1, threads // ranks))})
    if done.returncode:
        raise RuntimeError(f"the {ranks}-rank SFT worker failed:\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())


class PlainSFT:
    """The textbook loop: full logits, labels -100 off the completion, AdamW, clipping."""

    def __init__(self, path: Path, tokenizer):
        from transformers import AutoModelForCausalLM

        self.batch = sft_batch(tokenizer)
        self.labels = self.batch.input_ids.masked_fill(~self.batch.target_mask, -100)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-5)

    def steps(self, count: int) -> list[float]:
        seconds = []
        for _ in range(count):
            started = time.perf_counter()
            loss = self.model(input_ids=self.batch.input_ids, attention_mask=self.batch.attention_mask, labels=self.labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            seconds.append(time.perf_counter() - started)
        return seconds


class StepTimer:
    """A transformers TrainerCallback recording each optimizer step's wall time."""

    def __new__(cls):
        from transformers import TrainerCallback

        class Timer(TrainerCallback):
            def __init__(self):
                self.seconds, self._started = [], 0.0

            def on_step_begin(self, args, state, control, **kwargs):
                self._started = time.perf_counter()

            def on_step_end(self, args, state, control, **kwargs):
                self.seconds.append(time.perf_counter() - self._started)

        return Timer()


class TrlSFT:
    """TRL's SFTTrainer on the same pairs (prompt/completion: loss on the completion)."""

    def __init__(self, path: Path, out: Path, count: int):
        from datasets import Dataset
        from trl import SFTConfig, SFTTrainer

        rows = [{"prompt": [{"role": "user", "content": p}], "completion": [{"role": "assistant", "content": c}]} for p, c in PAIRS]
        args = SFTConfig(
            output_dir=str(out), per_device_train_batch_size=4, max_steps=count, learning_rate=1e-5, logging_steps=1,
            save_strategy="no", report_to=[], use_cpu=True, bf16=False, fp16=False, dataloader_num_workers=0, max_length=None,
            packing=False, disable_tqdm=True, seed=0,
        )
        self.timer = StepTimer()
        self.trainer = SFTTrainer(model=str(path), args=args, train_dataset=Dataset.from_list(rows * count), callbacks=[self.timer])

    def steps(self, count: int) -> list[float]:
        """count steps of trainer.train() (each call builds its optimizer: the first step is dropped)."""
        self.timer.seconds = []
        self.trainer.train()
        return self.timer.seconds[1:]


def bench_sft(path: Path, tokenizer, rounds: int, per_round: int, threads: int, ranks: int, scratch: Path) -> dict:
    """Round-robin rounds of a few steps each, so load from other processes on a shared machine
    falls on every trainer alike; medians over all steps but each run's first (a warm-up).
    gearshift runs in its own processes (alone, and with --ranks N under torchrun, the machine's
    threads shared among the ranks); TRL and the plain loop in this one."""
    runs = {"gearshift": lambda: gearshift_sft(path, 1, threads, per_round + 1, scratch / "one")}
    for parallelism in ("fsdp", "ddp") if ranks > 1 else ():
        runs[f"gearshift_{ranks}_ranks_{parallelism}"] = functools.partial(
            gearshift_sft, path, ranks, threads, per_round + 1, scratch / parallelism, parallelism
        )
    plain, trl = PlainSFT(path, tokenizer), TrlSFT(path, scratch / "trl-sft", per_round + 1)
    seconds: dict[str, list[float]] = {name: [] for name in [*runs, "trl_sfttrainer", "plain_pytorch"]}
    peaks: dict[str, list[float]] = {}
    for _ in range(rounds):
        for name, start in runs.items():
            report = start()
            seconds[name] += report["seconds"][1:]
            peaks.setdefault(name, []).append(max(report["peak_rss_mib"]))  # the largest rank's
        seconds["trl_sfttrainer"] += trl.steps(per_round + 1)
        seconds["plain_pytorch"] += plain.steps(per_round + 1)[1:]
    tokens = sft_batch(tokenizer).tokens
    rates = {name: tokens / statistics.median(values) for name, values in seconds.items()}
    report = {
        "batch_tokens": tokens,
        "threads": threads,
        "steps_timed": {name: len(values) for name, values in seconds.items()},
        "tokens_per_second": {name: round(rate, 1) for name, rate in rates.items()},
        "gearshift_vs_trl": round(rates["gearshift"] / rates["trl_sfttrainer"], 2),
        "gearshift_vs_plain": round(rates["gearshift"] / rates["plain_pytorch"], 2),
        "peak_rss_mib_of_a_rank_by_round": {name: [round(peak) for peak in values] for name, values in peaks.items()},
    }
    for parallelism in ("fsdp", "ddp") if ranks > 1 else ():
        many = f"gearshift_{ranks}_ranks_{parallelism}"
        report[f"{many}_vs_trl"] = round(rates[many] / rates["trl_sfttrainer"], 2)
        report[f"scaling_efficiency_{parallelism}"] = round(rates[many] / rates["gearshift"], 2)  # the same cores in all
        report[f"peak_rss_per_rank_vs_one_rank_{parallelism}"] = round(statistics.median(peaks[many]) / statistics.median(peaks["gearshift"]), 2)
    return report


# APO


def reward_contains(completions, reference, **kwargs):
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [1.0 if ref in text else 0.0 for text, ref in zip(texts, reference)]


def bench_trl_grpo(path: Path, steps: int, out: Path) -> list[float]:
    from datasets import Dataset
    from gearshift.protocol import prompts
    from trl import GRPOConfig, GRPOTrainer

    rows = [{"prompt": prompts.messages("What is 17*23?"), "reference": "391"}] * (4 * steps)
    args = GRPOConfig(
        output_dir=str(out), per_device_train_batch_size=4, num_generations=4, max_completion_length=32, max_steps=steps,
        learning_rate=1e-6, beta=0.0, temperature=1.0, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
        bf16=False, fp16=False, dataloader_num_workers=0, disable_tqdm=True, seed=0, epsilon=0.2, epsilon_high=0.28,
    )
    timer = StepTimer()
    trainer = GRPOTrainer(model=str(path), reward_funcs=reward_contains, args=args, train_dataset=Dataset.from_list(rows), callbacks=[timer])
    trainer.train()
    return timer.seconds


def bench_gearshift_apo(path: Path, steps: int, threads: int, out: Path) -> list[dict]:
    from gearshift.jobs.apo import trainer
    from gearshift.jobs.apo.config import APOConfig
    from gearshift.training.results import read_metrics

    config = APOConfig.model_validate(
        {"model": {"base": str(path)}, "optim": {"learning_rate": 1e-6, "max_steps": steps, "threads": threads},
         "output": {"dir": str(out), "save_every": 10_000, "progress": False, "resume": False},
         "prompts": [{"query": "What is 17*23?", "reference_answer": "391"}], "rho": 1, "gamma": 1,
         "rollout": {"max_tokens_per_turn": 32, "max_steps": 1, "temperature": 1.0}}
    )
    trainer.train(config)
    return read_metrics(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="SFT round-robin rounds")
    parser.add_argument("--per-round", type=int, default=2, help="SFT steps per trainer per round")
    parser.add_argument("--apo-steps", type=int, default=3, help="APO / GRPO steps (the first is a warm-up)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--ranks", type=int, default=1, help="also run gearshift's SFT as one job on this many ranks (torchrun)")
    parser.add_argument("--skip", nargs="*", default=[], choices=["sft", "apo"], help="parts to leave out")
    parser.add_argument("--sft-worker", type=Path, help=argparse.SUPPRESS)  # a gearshift SFT process (gearshift_sft)
    parser.add_argument("--steps", type=int, default=3, help=argparse.SUPPRESS)
    parser.add_argument("--parallelism", default="fsdp", help=argparse.SUPPRESS)
    parser.add_argument("--allocator", choices=["jemalloc", "jemalloc-eager", "glibc"], default="jemalloc",
                        help="malloc of every trainer in the run: jemalloc (when installed; what PyTorch recommends for CPU training), "
                             "jemalloc returning freed pages at once (what the ranks hold, at some speed), or glibc's")
    args = parser.parse_args()
    if args.allocator != "glibc" and JEMALLOC.exists() and str(JEMALLOC) not in os.environ.get("LD_PRELOAD", ""):
        eager = {"MALLOC_CONF": "dirty_decay_ms:0,muzzy_decay_ms:0"} if args.allocator == "jemalloc-eager" else {}
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "LD_PRELOAD": str(JEMALLOC), **eager})  # workers inherit it
    if args.sft_worker:
        out = args.sft_worker
        sft_worker(model_dir(), out, args.steps, args.threads, out.parent / f"{out.stem}-run", args.parallelism)
        return
    torch.set_num_threads(args.threads)
    # Every generation of the APO rollouts (routing, planning, turns) stays within 32 tokens.
    os.environ.update({"GEARSHIFT_ROUTER__MAX_TOKENS": "32", "GEARSHIFT_PLANNER__MAX_TOKENS": "32", "GEARSHIFT_METRICS_PORT": "0"})
    path = model_dir()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    report: dict = {"model": str(path), "threads": args.threads, "allocator": args.allocator if str(JEMALLOC) in os.environ.get("LD_PRELOAD", "") else "glibc"}
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        os.environ["GEARSHIFT_DATA_DIR"] = str(scratch / "data")  # the in-process store's SQLite file
        (scratch / "data" / "models").mkdir(parents=True)
        if "sft" not in args.skip:
            report["sft"] = bench_sft(path, tokenizer, args.rounds, args.per_round, args.threads, args.ranks, scratch)
            print(json.dumps(report["sft"]), flush=True)
        if "apo" not in args.skip:
            history = bench_gearshift_apo(path, args.apo_steps, args.threads, scratch / "apo")
            grpo = bench_trl_grpo(path, args.apo_steps, scratch / "trl-grpo")
            step = median_after_warmup([r["seconds"] for r in history])
            rollout = median_after_warmup([r["rollout_seconds"] for r in history])
            report["apo"] = {
                "gearshift_step_seconds": round(step, 2),
                "gearshift_rollout_seconds": round(rollout, 2),
                "gearshift_update_seconds": round(step - rollout, 2),
                "gearshift_rollout_tokens": [r["tokens"] for r in history],
                # A step whose groups all had equal rewards learns nothing: its time is rollouts only.
                "gearshift_steps_updated": sum(bool(r["updated"]) for r in history),
                "trl_grpo_step_seconds": round(median_after_warmup(grpo), 2),
                "gearshift_vs_trl": round(median_after_warmup(grpo) / step, 2),
            }
            print(json.dumps(report["apo"]), flush=True)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
