"""LoRA on a mixture-of-experts layer's routed experts. transformers 5 holds them fused
(mlp.experts.gate_up_proj [experts, 2 x intermediate, hidden], down_proj [experts, hidden,
intermediate]); peft's own LoRA of such parameters (target_parameters) keeps one [rank x experts,
in] matrix per weight, which neither FSDP2 nor expert parallelism can split by expert, and
re-registers a parametrization on every forward, which FSDP2's unsharded parameters do not survive.

Here each adapted projection (gate_proj, up_proj, down_proj, as lora_target_modules names them)
gets one A [experts, r, in] and one B [experts, out, r] on the experts module (experts.lora_A.<proj>,
experts.lora_B.<proj>): expert first, like the weights, so the loader fills a rank's rows, FSDP2
shards them and expert parallelism spreads them exactly as the weights. Expert e's matrices are the
LoRA of its own gate_proj, up_proj and down_proj: what a Hugging Face checkpoint's per-expert
Linear layers would get from peft, and what the adapter is saved as (layouts.FusedExperts
.adapter_files: mlp.experts.<e>.gate_proj.lora_A.weight ..., the names vLLM's LoRA loader and
peft's from_pretrained read for Qwen3-MoE).

The forward adds scaling x B @ A to the weights for the duration of the experts' forward (the
weights the forward reads, whole or this rank's experts, become W + scaling B A), as peft does for
fused experts: a transient copy of the layer's expert weights, not of the model."""

from __future__ import annotations

import math
import weakref

import torch

from gearshift.training.experts import experts_of, is_fused_experts, local_tensor

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
FUSED = {"gate_proj": "gate_up_proj", "up_proj": "gate_up_proj", "down_proj": "down_proj"}  # the fused weight each is part of
GATE_UP = ("gate_proj", "up_proj")  # gate_up_proj's rows: the gate's, then the up projection's


def targets(model: torch.nn.Module, names: list[str]) -> list[str]:
    """The expert projections names adapt on model: none for a model without fused experts."""
    if not experts_of(model):
        return []
    return [name for name in PROJECTIONS if name in names]


def linear_targets(model: torch.nn.Module, names: list[str]) -> list[str]:
    """names, for peft, restricted to linear layers: an expert projection's name becomes the full
    names of the linear layers it names (a dense MLP layer's, a shared expert's), else peft would
    adapt the fused experts itself (its transformers-5 conversion)."""
    keep = [name for name in names if name not in PROJECTIONS]
    return keep + [full for full, module in model.named_modules()
                   if isinstance(module, torch.nn.Linear) and full.rsplit(".", 1)[-1] in PROJECTIONS and full.rsplit(".", 1)[-1] in names]


def attach(model, projections: list[str], rank: int) -> dict[str, torch.Tensor]:
    """Gives every fused-experts module of a peft model A and B of each projection (float32, on
    the experts' device: meta when built to be loaded) and the hooks that apply them; returns
    their initial values, drawn from the global RNG as peft draws a Linear's (A uniform in
    +-1/sqrt(in), kaiming_uniform with a=sqrt(5); B zero)."""
    init = {}
    enabled = _adapters_enabled(model)
    for name, experts in model.named_modules():
        if not is_fused_experts(experts):
            continue
        factors = {factor: torch.nn.Module() for factor in ("lora_A", "lora_B")}
        for projection in projections:
            out_features, in_features = _shape(experts, projection)
            count, device = experts.num_experts, experts.gate_up_proj.device
            shapes = {"lora_A": (count, rank, in_features), "lora_B": (count, out_features, rank)}
            bound = 1 / math.sqrt(in_features)
            values = {"lora_A": torch.empty(shapes["lora_A"]).uniform_(-bound, bound), "lora_B": torch.zeros(shapes["lora_B"])}
            for factor, holder in factors.items():
                holder.register_parameter(projection, torch.nn.Parameter(torch.empty(shapes[factor], device=device)))
                init[f"{name}.{factor}.{projection}"] = values[factor]
        for factor, holder in factors.items():
            experts.add_module(factor, holder)
        config = model.peft_config["default"]
        experts.lora_scaling = config.lora_alpha / (math.sqrt(rank) if config.use_rslora else rank)  # peft's
        experts.lora_enabled = enabled
        experts.register_forward_pre_hook(_adapt)
        experts.register_forward_hook(_restore)
    return init


def _shape(experts: torch.nn.Module, projection: str) -> tuple[int, int]:
    """(out, in) of one expert's projection."""
    _, out_features, in_features = getattr(experts, FUSED[projection]).shape
    return (out_features // 2 if projection in GATE_UP else out_features), in_features


def _adapters_enabled(model):
    """Whether the peft model's adapters are on (off inside its disable_adapter(): a reference
    policy, the student's base as its teacher), read from the model without holding it."""
    peft_model = weakref.ref(model)
    return lambda: not getattr(peft_model(), "_adapters_disabled", False)


def factors_of(experts: torch.nn.Module, local: bool = True) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Each adapted projection's (A, B) on an experts module: as its forward sees them (local:
    whole, or this rank's experts under expert parallelism), or the parameters themselves."""
    if not (is_fused_experts(experts) and hasattr(experts, "lora_A")):
        return {}
    part = local_tensor if local else (lambda param: param)
    return {projection: (part(a), part(experts.lora_B.get_parameter(projection))) for projection, a in experts.lora_A.named_parameters()}


def adapted_weights(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The state-dict names of the fused expert weights a LoRA adapts, each with its experts module."""
    found = {}
    for name, experts in model.named_modules():
        adapted = factors_of(experts, local=False)
        for fused in {FUSED[projection] for projection in adapted}:
            found[f"{name}.{fused}"] = experts
    return found


def merged(weight: torch.Tensor, fused: str, factors: dict[str, tuple[torch.Tensor, torch.Tensor]], scaling: float) -> torch.Tensor | None:
    """A fused weight's rows (experts first) plus scaling x B @ A of each adapted projection it
    holds, the factors' rows the same experts; None when it holds none."""
    parts = GATE_UP if fused == "gate_up_proj" else ("down_proj",)
    if not any(part in factors for part in parts):
        return None
    rows = weight.shape[1] // len(parts)
    deltas = [scaling * torch.bmm(factors[part][1], factors[part][0]) if part in factors
              else torch.zeros((weight.shape[0], rows, weight.shape[2]), dtype=weight.dtype, device=weight.device)
              for part in parts]
    return weight + torch.cat(deltas, dim=1).to(weight.dtype)


def _adapt(experts: torch.nn.Module, args) -> None:
    """Before the experts' forward (after FSDP2's own hook has gathered the weights): each fused
    weight the LoRA adapts is W + scaling B A for the forward. Under expert parallelism these are
    this rank's experts, which the forward's own ScaledGradient then scales as it does W."""
    if not experts.lora_enabled():
        return
    factors = factors_of(experts)
    saved = {}
    for fused in ("gate_up_proj", "down_proj"):
        weight = experts._parameters[fused]
        adapted = merged(local_tensor(weight), fused, factors, experts.lora_scaling)
        if adapted is not None:
            saved[fused] = weight
            experts._parameters[fused] = adapted  # a tensor, not a Parameter: only for this forward
    experts.__dict__["_lora_saved"] = saved


def _restore(experts: torch.nn.Module, args, output) -> None:
    """After the experts' forward (before FSDP2 reshards): the weights themselves again."""
    experts._parameters.update(experts.__dict__.pop("_lora_saved", {}))
