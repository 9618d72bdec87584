"""A training step's peak memory on one rank, measured by torch's FSDPMemTracker instead of
computed by hand: the job's own model building (loading.build: LoRA, activation checkpointing)
and parallel layout (distributed.parallelize: FSDP2, expert parallelism) run one step, and the
tracker follows every tensor (parameters and their shards, gathered weights, gradients,
activations, optimizer state). Over a fake process group under FakeTensorMode (predict) the step
takes no memory and no compute, so any model at its real shapes on any number of ranks runs here
in seconds; on real ranks (measure) the same step gives the live tensors' peak, to check the
prediction against.

The step: one row of `tokens` tokens through the decoder (under context parallelism a slice of
it on each rank, attention exchanging heads for the whole sequence), the chunked head on every position as a
target, backward, in bf16 compute over float32 master weights (LoRA: a bf16 base, float32
adapters). AdamW's moments exist before the tracked step (an untracked step made them); the
optimizer step's own temporaries are left out (under FakeTensorMode its kernels count copies a
GPU's fused AdamW does not make). Routing is taken as balanced: each expert gets tokens x top-k /
experts rows (FakeTensorMode cannot follow data-dependent routing). Not counted: the CUDA context
and the allocator's cache and fragmentation (a few GiB on a GPU).

Each call needs a process of its own (the process group is global): run it as
`python -m gearshift.training.memory` (predict) or under torchrun (measure)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from gearshift.training import context_parallel, distributed, forward, loading
from gearshift.training.config import ModelConfig, OptimConfig, RuntimeConfig
from gearshift.training.distributed import Ranks
from gearshift.training.experts import experts_of, local_tensor, take_forward


class StepProbe(forward.TargetForward):
    """The step's forward: input_ids [1, T] through the decoder as one packed sequence (the path
    forward.hidden_states takes: block_attention, no mask), the head on every position; under
    context parallelism, this rank's slice of them."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        length = input_ids.shape[1]
        start, end = self.context.bounds(length) if self.context is not None else (0, length)
        positions = torch.arange(start, end, device=input_ids.device)[None]
        # varlen_inputs' bounds of a one-sequence pack, given as they are (FakeTensorMode reads no values)
        hidden = self.model.get_decoder()(input_ids=input_ids[:, start:end], position_ids=positions, attention_mask=forward.NO_MASK,
                                          block_bounds=[0, length], prefix_length=0, context=self.context,
                                          use_cache=False).last_hidden_state[0]
        logprobs, _, _ = self.head(hidden, input_ids[0, start:end])
        return logprobs


class BalancedExperts(torch.nn.Module):
    """A fused-experts forward with every expert (of this rank, under expert parallelism) given an
    equal share of the (token, expert) pairs, the dispatch and combine buffers included: routing
    that depends on no value."""

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        gate_up, down = local_tensor(self.gate_up_proj), local_tensor(self.down_proj)
        top_k = top_k_index.shape[1]
        pairs = hidden_states.repeat_interleave(top_k, dim=0)
        if getattr(self, "ep_group", None) is not None:
            pairs = pairs.clone()  # what the all-to-all received
        rows = pairs.shape[0] // gate_up.shape[0]
        outputs = []
        for expert in range(gate_up.shape[0]):
            gate, up = torch.nn.functional.linear(pairs[expert * rows:(expert + 1) * rows], gate_up[expert]).chunk(2, dim=-1)
            outputs.append(torch.nn.functional.linear(self.act_fn(gate) * up, down[expert]))
        combined = torch.cat(outputs)
        combined = torch.cat([combined, combined.new_zeros(pairs.shape[0] - combined.shape[0], combined.shape[1])])
        weighted = combined.view(-1, top_k, combined.shape[-1]) * top_k_weights[..., None].to(combined.dtype)
        return weighted.sum(dim=1).to(hidden_states.dtype)


def _balanced(module: torch.nn.Module) -> None:
    for experts in experts_of(module):
        take_forward(experts, BalancedExperts)


def track_step(config_dir: Path, model: ModelConfig, runtime: RuntimeConfig, ranks: Ranks, tokens: int, fake: bool) -> dict[str, float]:
    """One step's peak on this rank, in bytes per kind of tensor and "Total" (the tracker's)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    from gearshift.training.runtime import build_optimizer

    compute = torch.bfloat16
    built, _ = loading.build(config_dir, compute if model.lora else torch.float32, model)
    context = context_parallel.context_of(ranks, runtime)
    probe = StepProbe(built, runtime.loss_chunk_tokens, context)
    forward.check_context_parallel(probe.model, runtime)
    module = distributed.parallelize(probe, ranks, runtime, compute)
    if fake:
        _balanced(module)
    mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext()
    with mode:
        module.to_empty(device=ranks.device)
        if not fake:
            for param in module.parameters():
                torch.nn.init.normal_(loading.local_part(param)[0], std=0.02)
        optimizer, _ = build_optimizer(module, OptimConfig())
        ids = torch.randint(0, built.config.vocab_size, (1, tokens), device=ranks.device)
        compute_in = distributed.autocast(module, ranks.device, compute)  # bf16 on one rank too, as Run.forward computes
        with compute_in:
            (-module(ids).sum()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if distributed.is_sharded(module):
            tracker = FSDPMemTracker(module, optimizer)
            tracker.track_inputs((ids,))
        else:  # one rank: no FSDP to follow, the same accounting of every tensor
            tracker = MemTracker()
            tracker.track_external(module, optimizer, ids)
        with tracker, compute_in:
            (-module(ids).sum()).backward()
        (snapshot,) = tracker.get_tracker_snapshot("peak").values()
    return {str(getattr(kind, "value", kind)): float(value) for kind, value in snapshot.items()}


def predict(hf_config: dict, model: ModelConfig, runtime: RuntimeConfig, world_size: int, tokens: int) -> dict[str, float]:
    """The peak of rank 0 of world_size at the config's real shapes (this process joins a fake
    process group: call it once per process)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps(hf_config))
        return track_step(Path(folder), model, runtime, Ranks(0, world_size, 0, torch.device("cpu")), tokens, fake=True)


def measure(config_dir: Path, model: ModelConfig, runtime: RuntimeConfig, tokens: int) -> dict[str, float]:
    """The same step on the ranks torchrun started (gloo on the CPU), real tensors: rank's peak
    (on a GPU also CUDA's peak allocation, "cuda_max_allocated", which includes the untracked step)."""
    ranks = distributed.start(runtime)
    if ranks.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ranks.device)
    peak = track_step(config_dir, model, runtime, ranks, tokens, fake=False)
    if ranks.device.type == "cuda":  # the allocator's own count of the same step, beside the tracker's
        peak["cuda_max_allocated"] = float(torch.cuda.max_memory_allocated(ranks.device))
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description="One training step's peak memory per rank (GiB), tracked by FSDPMemTracker")
    parser.add_argument("config", type=Path, help="a model's config.json (a checkpoint directory's)")
    parser.add_argument("--ranks", type=int, default=8, help="ranks of the fake process group (predict)")
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--model", default="{}", help="ModelConfig fields as JSON (lora, gradient_checkpointing, ...)")
    parser.add_argument("--runtime", default="{}", help="RuntimeConfig fields as JSON (expert_parallel, ...)")
    parser.add_argument("--measure", action="store_true", help="on the ranks torchrun started, real tensors")
    parser.add_argument("--out", type=Path, help="write the result (rank 0's) here as JSON")
    args = parser.parse_args()
    model = ModelConfig(base=str(args.config.parent), **json.loads(args.model))
    runtime = RuntimeConfig(**json.loads(args.runtime))
    if args.measure:
        peak = measure(args.config.parent, model, runtime, args.tokens)
    else:
        peak = predict(json.loads(args.config.read_text()), model, runtime, args.ranks, args.tokens)
    if int(os.environ.get("RANK", "0")) == 0:
        text = json.dumps({kind: value / 2**30 for kind, value in peak.items()})
        if args.out:
            args.out.write_text(text)
        print(text)


if __name__ == "__main__":
    main()
