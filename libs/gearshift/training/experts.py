"""Expert parallelism: each mixture-of-experts layer's experts spread over the `ep` ranks of the
device mesh, experts/ep on each, as torchtitan's and Megatron's all-to-all dispatchers place them.
A rank routes its own tokens, sends each (token, chosen expert) pair to the rank holding that
expert (all-to-all), runs its experts on what it received, and sends the outputs back the same way
(all-to-all); the backward runs the two exchanges in reverse. FSDP2 then shards each rank's
experts over the data-parallel ranks that hold the same ones (the mesh's `shard_mod_ep` dim), while
the dense layers shard over every data-parallel rank, as before.

Gradients: a rank's experts receive the gradients of every token of its `ep` group, so FSDP's
average over `shard_mod_ep` alone would count them ep times: they are divided by ep on their way
to the parameters (a gradient divide factor would need PREMUL_SUM, which gloo lacks)."""

from __future__ import annotations

import torch
import torch.distributed as dist

FUSED = ("gate_up_proj", "down_proj")  # transformers' fused experts (layouts.FusedExperts)


class ScaledGradient(torch.autograd.Function):
    """The identity, its gradient times a factor."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.factor, None


class AllToAll(torch.autograd.Function):
    """dist.all_to_all_single with variable splits; its backward is the exchange reversed."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, received: list[int], sent: list[int], group) -> torch.Tensor:
        ctx.received, ctx.sent, ctx.group = received, sent, group
        out = rows.new_empty((sum(received), *rows.shape[1:]))
        dist.all_to_all_single(out, rows.contiguous(), received, sent, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out = grad.new_empty((sum(ctx.sent), *grad.shape[1:]))
        dist.all_to_all_single(out, grad.contiguous(), ctx.sent, ctx.received, group=ctx.group)
        return out, None, None, None


def is_fused_experts(module: torch.nn.Module) -> bool:
    """A transformers MoE layer's experts, fused: [experts, ...] parameters gate_up_proj and down_proj."""
    return all(isinstance(getattr(module, name, None), torch.nn.Parameter) for name in FUSED) and hasattr(module, "num_experts")


def experts_of(module: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in module.modules() if is_fused_experts(m)]


_SWAPPED: dict[tuple[type, type], type] = {}


def take_forward(module: torch.nn.Module, forward_class: type) -> None:
    """Gives module forward_class's forward in place (one subclass per pair, made once)."""
    key = (forward_class, type(module))
    if key not in _SWAPPED:
        _SWAPPED[key] = type(f"{forward_class.__name__}{type(module).__name__}", key, {})
    module.__class__ = _SWAPPED[key]


def local_tensor(param: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor (its experts), or the tensor."""
    return param.to_local() if hasattr(param, "to_local") else param


class ParallelExperts(torch.nn.Module):
    """The forward a fused-experts module takes when its experts are spread over an ep group
    (its class is swapped in place, as forward.Head's is: same parameters, same names)."""

    ep_group = None

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        group, ranks = self.ep_group, dist.get_world_size(self.ep_group)
        # [experts / ep, ...] after FSDP's all-gather; their gradients over ep (the module docstring)
        gate_up, down = (ScaledGradient.apply(local_tensor(param), 1.0 / ranks) for param in (self.gate_up_proj, self.down_proj))
        local = gate_up.shape[0]
        top_k = top_k_index.shape[1]
        chosen = top_k_index.reshape(-1)
        order = torch.argsort(chosen, stable=True)  # (token, slot) pairs by expert: by destination rank, then expert
        counts = torch.bincount(chosen, minlength=self.num_experts).reshape(ranks, local)
        received = torch.empty_like(counts)
        dist.all_to_all_single(received, counts, group=group)  # [source rank, my expert]: how many pairs come
        sent_rows, received_rows = counts.sum(dim=1).tolist(), received.sum(dim=1).tolist()
        inputs = AllToAll.apply(hidden_states[order // top_k], received_rows, sent_rows, group)
        expert_of_row = torch.arange(local, device=counts.device).repeat(ranks).repeat_interleave(received.flatten())
        by_expert = torch.argsort(expert_of_row, stable=True)
        outputs = torch.cat([self._expert(inputs[rows], gate_up[expert], down[expert])
                             for expert, rows in enumerate(by_expert.split(received.sum(dim=0).tolist()))])
        back = torch.empty_like(outputs).index_copy(0, by_expert, outputs)  # in the order the pairs came
        returned = AllToAll.apply(back, sent_rows, received_rows, group)
        weighted = returned * top_k_weights.reshape(-1)[order, None]
        return torch.zeros_like(hidden_states).index_add_(0, order // top_k, weighted.to(hidden_states.dtype))

    def _expert(self, rows: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
        gate, up = torch.nn.functional.linear(rows, gate_up).chunk(2, dim=-1)
        return torch.nn.functional.linear(self.act_fn(gate) * up, down)


def parallelize_experts(module: torch.nn.Module, mesh, fsdp_options: dict) -> None:
    """Each fused-experts module of module: its parameters sharded by expert over mesh["ep"]
    (DTensors, still on the meta device before loading), its forward the all-to-all one, and
    FSDP2 over mesh["shard_mod_ep"]."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard, distribute_tensor

    ep_mesh = mesh["ep"]
    for experts in experts_of(module):
        for name, param in list(experts.named_parameters()):  # the fused weights, and a LoRA's factors (expert_lora): expert first
            owner, _, leaf = name.rpartition(".")
            experts.get_submodule(owner).register_parameter(leaf, torch.nn.Parameter(distribute_tensor(param.data, ep_mesh, [Shard(0)]),
                                                                                     requires_grad=param.requires_grad))
        take_forward(experts, ParallelExperts)
        experts.ep_group = ep_mesh.get_group()
        fully_shard(experts, **{**fsdp_options, "mesh": mesh["shard_mod_ep"]})
