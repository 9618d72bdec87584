"""Context parallelism, Ulysses style (DeepSpeed-Ulysses; verl's and torchtitan's sequence
parallel attention): the ranks of a context group learn the same packed micro-batch, each holding
a contiguous 1/size of its tokens through every layer but attention. Everything outside attention
acts token by token, so it runs on the slice alone; attention needs every token, so it exchanges
(all-to-all) the slice of every head for the whole sequence of 1/size of the heads, attends as one
process would (forward.block_attention, with the pack's own bounds), and exchanges back. Each
rank's activations are 1/size of the micro-batch's, which is what lets one trajectory outgrow one
GPU.

The loss needs nothing more: a rank computes its own slice's targets (forward.TargetForward) and
the losses are sums over tokens, normalised by counts over the global batch, so the ranks' shares
add up as data-parallel ranks' do; the exchanges' backward carries each token's gradient to the
rank that holds it. An MoE's balancing loss is per sequence, not a sum over tokens: its counts are
summed over the group first (balancing.RouterLoad).

Groups are consecutive ranks (after tensor parallelism's, which is innermost): the ranks a mesh
("data", "context", "tensor") puts on its context dimension."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from gearshift.training.experts import AllToAll
from gearshift.training.tokenization import PADDING, Batch

_groups: dict[tuple[int, int], dist.ProcessGroup] = {}


@dataclass(frozen=True)
class Context:
    """This rank's place in its context group."""

    group: dist.ProcessGroup
    size: int
    rank: int

    def padded(self, batch: Batch) -> Batch:
        """A packed row made a multiple of size tokens long with padding (a sequence of its own, with
        no targets: it attends to itself alone)."""
        length = batch.input_ids.shape[1]
        extra = -length % self.size
        if not extra:
            return batch

        def pad(values: torch.Tensor, value: int) -> torch.Tensor:
            return torch.nn.functional.pad(values, (0, extra), value=value)

        return replace(batch, input_ids=pad(batch.input_ids, 0), attention_mask=pad(batch.attention_mask, 1),
                       target_mask=pad(batch.target_mask, False), position_ids=pad(batch.position_ids, 0),
                       sequence_ids=pad(batch.sequence_ids, PADDING))

    def bounds(self, length: int) -> tuple[int, int]:
        """This rank's slice of a (padded) row of length tokens."""
        part = length // self.size
        return self.rank * part, (self.rank + 1) * part

    def gather_sequence(self, states: torch.Tensor) -> torch.Tensor:
        """[1, heads, tokens / size, dim] of every head -> [1, heads / size, tokens, dim]: this
        rank's heads over the whole sequence (heads chunk j goes to rank j)."""
        _, heads, part, dim = states.shape
        received = AllToAll.apply(states.reshape(self.size, heads // self.size, part, dim), [1] * self.size, [1] * self.size, self.group)
        return received.transpose(0, 1).reshape(1, heads // self.size, self.size * part, dim)  # [source rank = sequence slice]

    def scatter_sequence(self, states: torch.Tensor) -> torch.Tensor:
        """The inverse of gather_sequence: [1, heads / size, tokens, dim] -> [1, heads, tokens / size, dim]."""
        _, heads, length, dim = states.shape
        part = length // self.size
        sent = states.reshape(heads, self.size, part, dim).transpose(0, 1)
        received = AllToAll.apply(sent, [1] * self.size, [1] * self.size, self.group)
        return received.reshape(1, heads * self.size, part, dim)  # [source rank = heads chunk]

    def with_heads_for(self, key: torch.Tensor, heads: int) -> torch.Tensor:
        """key (or value) with enough key-value heads to split over the group: as they are where the
        size divides them, else repeated up to the query heads (grouped-query attention's sharing)."""
        kv_heads = key.shape[1]
        return key if kv_heads % self.size == 0 else key.repeat_interleave(heads // kv_heads, dim=1)

    def whole(self, values: torch.Tensor, kept: torch.Tensor, total: int) -> torch.Tensor:
        """Per-target values ([this rank's targets, ...], no gradient) of the whole batch
        ([total, ...]): every rank's, each at its kept indices (forward.Targets.kept)."""
        count = torch.tensor([len(kept)], device=values.device)
        counts = [torch.zeros_like(count) for _ in range(self.size)]
        dist.all_gather(counts, count, group=self.group)
        longest = int(max(counts))
        padded = torch.nn.functional.pad(values, (0, 0) * (values.dim() - 1) + (0, longest - len(kept)))
        indices = torch.nn.functional.pad(kept.to(values.device), (0, longest - len(kept)))
        all_values, all_indices = [torch.empty_like(padded) for _ in range(self.size)], [torch.empty_like(indices) for _ in range(self.size)]
        dist.all_gather(all_values, padded.contiguous(), group=self.group)
        dist.all_gather(all_indices, indices, group=self.group)
        out = values.new_zeros(total, *values.shape[1:])
        for part, at, n in zip(all_values, all_indices, counts):
            out[at[:int(n)]] = part[:int(n)]
        return out

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum over the group, with gradients (the backward sums them over the group too)."""
        import torch.distributed.nn.functional as functional

        return functional.all_reduce(tensor, group=self.group)


def context_of(ranks, runtime) -> Context | None:
    """This rank's context group (ranks: distributed.Ranks), or None without context parallelism.
    Every rank calls it (making a group is collective)."""
    size = runtime.context_parallel
    if size == 1:
        return None
    if ranks.world_size % (size * runtime.tensor_parallel):
        raise ValueError(f"runtime.context_parallel {size} does not divide the job's {ranks.world_size} ranks")
    key = (size, runtime.tensor_parallel)
    if key not in _groups:
        from torch.distributed.device_mesh import init_device_mesh

        shape = (ranks.world_size // (size * runtime.tensor_parallel), size, runtime.tensor_parallel)
        _groups[key] = init_device_mesh(ranks.device.type, shape, mesh_dim_names=("data", "context", "tensor"))["context"].get_group()
    group = _groups[key]
    return Context(group, size, dist.get_rank(group))

