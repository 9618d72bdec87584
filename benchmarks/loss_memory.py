"""Peak tensor memory and seconds of the loss's head, the whole-vocabulary logits (the path before
issue 49: logits [targets, vocabulary], upcast to float32) against the chunked head
(gearshift.training.forward.Head), side by side in one run: SFT (log-probabilities), APO
(log-probabilities and entropy) and distillation (reverse KL to a teacher, whole vocabulary),
forward and backward. Peak bytes of live tensors are counted op by op
(gearshift.testing.tensor_memory), exact on the CPU; seconds are medians of --repeats.

    .venv/bin/python benchmarks/loss_memory.py                      # 152,064 vocabulary, 2,048 targets
    .venv/bin/python benchmarks/loss_memory.py --chunks 256 1024 --targets 2048 --hidden 256
    .venv/bin/python benchmarks/loss_memory.py --losses distill --targets 1024 --chunks 128 256  # the KL's whole path holds ~8 copies
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from gearshift.testing.tensor_memory import LiveTensors
from gearshift.training import forward, losses

MIB = 2**20


def whole(kind: str, head: torch.nn.Linear, teacher: torch.Tensor):
    def loss(hidden, tokens, teacher_hidden):
        logits = torch.nn.functional.linear(hidden, head.weight)
        if kind == "distill":
            with torch.no_grad():
                teacher_logits = torch.nn.functional.linear(teacher_hidden, teacher)
            return losses.reverse_kl(logits, teacher_logits).sum()
        logp = losses.token_logprobs(logits, tokens)
        if kind == "apo":
            losses.entropy(logits.detach())
        return -logp.sum()

    return loss


def chunked(kind: str, head: forward.Head, teacher: torch.Tensor):
    def loss(hidden, tokens, teacher_hidden):
        if kind == "distill":
            view = forward.Teacher(torch.arange(len(tokens)), teacher_hidden, teacher)
            return head(hidden, tokens, teachers=(view,))[2].sum()
        return -head(hidden, tokens, entropy=kind == "apo")[0].sum()

    return loss


def measure(loss, targets: int, width: int, vocabulary: int, repeats: int) -> tuple[float, float]:
    peaks, seconds = [], []
    for repeat in range(repeats):
        generator = torch.Generator().manual_seed(repeat)
        hidden = torch.randn(targets, width, generator=generator, requires_grad=True)
        teacher_hidden = torch.randn(targets, width, generator=generator)
        tokens = torch.randint(0, vocabulary, (targets,), generator=generator)
        started = time.perf_counter()
        with LiveTensors() as live:
            loss(hidden, tokens, teacher_hidden).backward()
        seconds.append(time.perf_counter() - started)
        peaks.append(live.peak)
    return max(peaks) / MIB, statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocabulary", type=int, default=152_064, help="Qwen2.5's")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--targets", type=int, default=2048)
    parser.add_argument("--chunks", type=int, nargs="+", default=[1024])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--losses", nargs="+", choices=["sft", "apo", "distill"], default=["sft", "apo", "distill"])
    args = parser.parse_args()
    torch.manual_seed(0)
    head = torch.nn.Linear(args.hidden, args.vocabulary, bias=False)
    teacher = torch.randn(args.vocabulary, args.hidden) / args.hidden**0.5
    logits_mib = args.targets * args.vocabulary * 4 / MIB
    print(f"vocabulary {args.vocabulary:,}, hidden {args.hidden}, {args.targets:,} targets: whole float32 logits {logits_mib:,.0f} MiB")
    print(f"{'loss':8} {'head':>12} {'peak MiB':>10} {'x whole':>8} {'seconds':>8}")
    for kind in args.losses:
        head.__class__ = torch.nn.Linear
        base, base_seconds = measure(whole(kind, head, teacher), args.targets, args.hidden, args.vocabulary, args.repeats)
        print(f"{kind:8} {'whole':>12} {base:10,.0f} {1:8.2f} {base_seconds:8.2f}")
        head.__class__ = forward.Head
        for chunk in args.chunks:
            head.chunk_tokens = chunk
            peak, seconds = measure(chunked(kind, head, teacher), args.targets, args.hidden, args.vocabulary, args.repeats)
            print(f"{kind:8} {f'chunk {chunk}':>12} {peak:10,.0f} {peak / base:8.2f} {seconds:8.2f}")


if __name__ == "__main__":
    main()
