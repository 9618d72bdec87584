"""Tensor parallelism for dense decoders (Megatron-LM's layout, applied as torchtitan applies it:
DTensor's parallelize_module on each decoder layer). The query, key, value, gate and up projections
are split by output features (ColwiseParallel: each of the mesh's `tensor` ranks holds
heads / tensor_parallel attention and key-value heads and intermediate / tensor_parallel MLP
columns, and computes them alone); the attention output and down projections by input features
(RowwiseParallel: each rank's partial output is summed, one all-reduce after attention and one
after the MLP). The `tensor` ranks of a group are consecutive (one node) and learn the same
examples (Ranks.splitting); FSDP2 then shards each rank's part over the mesh's `shard` dim.

transformers' attention takes local heads as they are: it views the projections as
(..., -1, head_dim), its key-value groups are heads / key-value heads on each rank as on one, and
forward.block_attention's sdpa repeats the local key-value heads itself (enable_gqa).

Outside the projections everything is whole on every tensor rank and sharded by FSDP over `shard`
alone: the embeddings, the layer norms and forward.Head (the head is tied to the embeddings in the
small models, and computes log-probabilities of target positions indexed out of the decoder's
output, which is a plain tensor here); Qwen3's per-head norms are whole too, their gradients
summed over the tensor ranks (HEAD_NORMS). The activations between layers are whole too (Replicate), not
sequence-parallel as torchtitan's norms are: DTensor's sequence-parallel styles build a
[batch, tokens / tp, hidden] shard from each rank's local slice assuming every rank holds as many
tokens, while our rows have any length (a packed row of whole examples, a shared prefix and then
two halves of rows decoded from its cache: forward.hidden_states); context parallelism
(context_parallel.py) is what splits long sequences over ranks.

Gradients: each tensor rank computes the same whole loss, and Run.accumulate scales it by the
world size for FSDP's average over its mesh, which under tensor parallelism spans world /
tensor_parallel ranks: every gradient would come out tensor_parallel times one process's (the
projections' partial sums are exact: DTensor all-reduces the input gradient of the column-split
layers). The model's outputs carry their gradient back divided by tensor_parallel
(scale_output_gradients), which makes them equal."""

from __future__ import annotations

import torch

COLUMNS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
ROWS = ("self_attn.o_proj", "mlp.down_proj")
# Qwen3 normalises each head ([batch, tokens, heads, head_dim]): whole weights that meet only the
# rank's own heads, so their gradient is a sum over the tensor ranks. As sequence parallel over the
# heads dim (torchtitan's plan for them) their gradients are DTensors marked Partial, which FSDP2
# all-reduces over the tensor ranks before its own reduction.
HEAD_NORMS = ("self_attn.q_norm", "self_attn.k_norm")


def model_config(module: torch.nn.Module):
    """The transformers config of the model inside module (a TargetForward's, or the model's own)."""
    config = next((m.config for m in module.modules() if hasattr(m, "config") and hasattr(m.config, "num_attention_heads")), None)
    if config is None:
        raise ValueError(f"{type(module).__name__} holds no transformers model with attention heads")
    return config


def split_sizes(config) -> dict[str, int]:
    """What tensor parallelism splits over its ranks, each a whole number on every rank."""
    return {"attention heads": config.num_attention_heads,
            "key-value heads": getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
            "MLP width (intermediate_size)": config.intermediate_size}


def layer_plan(layer: torch.nn.Module) -> dict:
    """The parallelize_module plan of a Llama, Qwen2 or Qwen3 decoder layer: whole inputs in, whole
    outputs out, local (plain) tensors in between."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    plan = {**{name: ColwiseParallel() for name in COLUMNS}, **{name: RowwiseParallel() for name in ROWS}}
    names = {name for name, _ in layer.named_modules()}
    return {**plan, **{name: SequenceParallel(sequence_dim=2, use_local_output=True) for name in HEAD_NORMS if name in names}}


def parallelize_dense(module: torch.nn.Module, layers: list[torch.nn.Module], tensor_mesh) -> None:
    """Each decoder layer's projections split over tensor_mesh (their parameters become DTensors,
    still on the meta device before loading), and module's outputs' gradients scaled for FSDP's
    average (the module docstring)."""
    from torch.distributed.tensor.parallel import parallelize_module

    for layer in layers:
        parallelize_module(layer, tensor_mesh, layer_plan(layer))
    scale_output_gradients(module, 1.0 / tensor_mesh.size())


def scale_output_gradients(module: torch.nn.Module, factor: float) -> None:
    """module's floating-point outputs (a tensor, or those of a tuple) pass their gradient back
    times factor (a hook on each: FSDP2 wants the root's outputs themselves, not views of them)."""

    def hook(_module, _inputs, output):
        values = output if isinstance(output, tuple) else (output,)
        trained = {id(value): value for value in values if isinstance(value, torch.Tensor) and value.requires_grad}
        for value in trained.values():
            value.register_hook(lambda grad: grad * factor)

    module.register_forward_hook(hook)
