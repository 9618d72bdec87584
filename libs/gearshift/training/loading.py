"""Loading a Hugging Face checkpoint at any size: the model is built with its parameters on the
meta device (no memory), wrapped (activation checkpointing, LoRA, FSDP2), and only then given
storage on the rank's device, each rank filling only its own shards from the safetensors files.

How the shards are filled (the choice, and why): every rank reads its own rows of each tensor
straight from the files, by byte range (FSDP2 shards dim 0, so a shard is one contiguous run of
bytes), with plain reads, not a memory map, so no file page stays resident. Where tensor
parallelism splits a projection by input features (dim 1), a rank reads its rows whole and keeps
its columns: a read tensor_parallel times its shard, the price of one contiguous read. No
collective runs and no process ever holds more than its shards plus one such read; rank 0
reading and scattering would send every byte through one host and one process.
torch.distributed.checkpoint's HuggingFaceStorageReader does the same reads but knows neither
peft's names (base_model.model...base_layer.weight) nor tied weights nor the cast from the file's
dtype to the master weights' float32, which this module does in a few lines. Every rank must see the files
(models come from local directories: a shared volume on a cluster).

What the meta device loses is rebuilt: non-persistent buffers (rotary inv_freq) are computed for
real at construction (only parameters go to meta) and put back after to_empty; LoRA's A and B are
drawn from the global RNG exactly as peft draws them (the caller seeds it the same on every rank),
so one process gets the model from_pretrained + get_peft_model gave, and every rank the same."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import struct
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig  # noqa: E402

from gearshift import weights  # noqa: E402
from gearshift.training import expert_lora, layouts  # noqa: E402
from gearshift.training.config import ModelConfig  # noqa: E402

PEFT_PREFIX = "base_model.model."
SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}


class SafetensorsDirectory:
    """The tensors of a checkpoint directory (model.safetensors, or the files its index names),
    read by rows with plain file reads."""

    def __init__(self, directory: Path):
        index = directory / "model.safetensors.index.json"
        files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
        self.entries: dict[str, tuple[Path, int, torch.dtype, list[int]]] = {}
        for name in files:
            path = directory / name
            with open(path, "rb") as handle:
                (size,) = struct.unpack("<Q", handle.read(8))
                header = json.loads(handle.read(size))
            header.pop("__metadata__", None)
            for key, entry in header.items():
                self.entries[key] = (path, 8 + size + entry["data_offsets"][0], SAFETENSORS_DTYPES[entry["dtype"]], entry["shape"])

    def __contains__(self, key: str) -> bool:
        return key in self.entries

    def shape(self, key: str) -> list[int]:
        return self.entries[key][3]

    def rows(self, key: str, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Rows start:stop (dim 0) of a tensor, or the whole tensor."""
        path, offset, dtype, shape = self.entries[key]
        if not shape:
            start, stop, row_shape = 0, 1, []
        else:
            stop, row_shape = shape[0] if stop is None else stop, shape[1:]
        row_bytes = math.prod(row_shape) * dtype.itemsize
        count = stop - start
        if count * row_bytes == 0:
            return torch.empty(count, *row_shape, dtype=dtype).reshape(shape if not shape else (count, *row_shape))
        buffer = bytearray(count * row_bytes)
        with open(path, "rb") as handle:
            handle.seek(offset + start * row_bytes)
            handle.readinto(buffer)
        return torch.frombuffer(buffer, dtype=dtype).reshape(shape if not shape else (count, *row_shape))


def file_key(name: str) -> str:
    """The model's own name of a (peft-wrapped, maybe twice: fused experts) parameter."""
    return re.sub(r"(\.base_layer)+\.", ".", name.removeprefix(PEFT_PREFIX))


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside get their parameters on the meta device, their buffers for real
    (non-persistent ones, such as rotary inv_freq, are computed at construction and in no file)."""
    register = torch.nn.Module.register_parameter

    def on_meta(module: torch.nn.Module, name: str, param) -> None:
        register(module, name, param)
        if param is not None and not param.is_meta:
            module._parameters[name] = type(param)(param.to("meta"), requires_grad=param.requires_grad)

    torch.nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def build(path: Path, dtype: torch.dtype, config: ModelConfig | None = None) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The model of the checkpoint at path with its parameters on the meta device in dtype, with
    config's activation checkpointing and LoRA (adapters in float32); also LoRA's initial A and B
    (whole: they are small), drawn from the global RNG as get_peft_model draws them."""
    hf_config = AutoConfig.from_pretrained(path, local_files_only=True)
    layouts.of(hf_config)  # an unknown family is refused before anything is built
    with parameters_on_meta():
        model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    model.config._name_or_path = str(path)  # what peft's adapter_config names as the base
    if (path / "generation_config.json").exists():
        model.generation_config = GenerationConfig.from_pretrained(path, local_files_only=True)
    if config is None:
        return model, {}
    if config.gradient_checkpointing:
        # Non-reentrant: correct with frozen inputs (LoRA) and with FSDP's hooks outside the checkpoint.
        # transformers renamed the method (and its argument) in 5.2x; older releases have only the first.
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if not config.lora:
        return model, {}
    from peft import LoraConfig, get_peft_model

    # The routed experts' LoRA is this trainer's own (expert_lora), peft adapts the linear layers.
    expert_projections = expert_lora.targets(model, config.lora_target_modules)
    linear = expert_lora.linear_targets(model, config.lora_target_modules) if expert_projections else config.lora_target_modules
    if expert_projections and config.lora_dropout:
        raise ValueError("LoRA on the experts adds B A to their weights, which has no dropout: set model.lora_dropout: 0")
    if not linear:
        raise ValueError(f"LoRA on the experts of a {hf_config.model_type} model alone: name a linear layer too in model.lora_target_modules "
                         "(q_proj, k_proj, v_proj, o_proj)")
    lora = LoraConfig(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=linear,
        task_type="CAUSAL_LM",
    )
    before = torch.get_rng_state()
    with weights.peft_wrapping():
        model = get_peft_model(model, lora)  # draws A and B on the CPU, then moves them to the base's meta device
    after = torch.get_rng_state()
    torch.set_rng_state(before)
    init = lora_initialisation(model)
    if not torch.equal(torch.get_rng_state(), after):
        raise RuntimeError("peft drew its LoRA initialisation differently from lora_initialisation: update it to this peft release")
    if expert_projections:
        init |= expert_lora.attach(model, expert_projections, config.lora_rank)
        # What the saved adapter holds, by peft's module names: its per-expert layout is what
        # peft's from_pretrained (which re-fuses it) and vLLM's LoRA loader read.
        model.peft_config["default"].target_modules = set(config.lora_target_modules)
    return model, init


def lora_initialisation(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What get_peft_model gives each adapter, drawn in its order from the global RNG: A and B
    created as nn.Linear (each drawn once), then A drawn again and B zeroed (reset_lora_parameters),
    then A and B rounded to the base layer's dtype before autocast_adapter_dtype makes them float32."""
    from peft.tuners.lora import LoraLayer

    init = {}
    for name, module in model.named_modules():
        if not isinstance(module, LoraLayer) or "default" not in module.lora_A:
            continue
        a_param, b_param = module.lora_A["default"].weight, module.lora_B["default"].weight
        a, b = torch.empty(a_param.shape), torch.empty(b_param.shape)
        torch.nn.init.kaiming_uniform_(a, a=math.sqrt(5))
        torch.nn.init.kaiming_uniform_(b, a=math.sqrt(5))
        torch.nn.init.kaiming_uniform_(a, a=math.sqrt(5))
        b.zero_()
        base_dtype = module.get_base_layer().weight.dtype
        init[f"{name}.lora_A.default.weight"] = a.to(base_dtype).to(a_param.dtype)
        init[f"{name}.lora_B.default.weight"] = b.to(a_param.dtype)
    return init


def non_persistent_buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    found = {}
    for module_name, module in model.named_modules():
        for name in module._non_persistent_buffers_set:
            buffer = module._buffers.get(name)
            if buffer is not None:
                found[f"{module_name}.{name}" if module_name else name] = buffer.detach().clone()
    return found


def materialise(module: torch.nn.Module, model: torch.nn.Module, path: Path, device: torch.device, init: dict[str, torch.Tensor]) -> None:
    """Gives module (which holds model, both built by build() and possibly sharded) storage on
    device and fills model's parameters from the checkpoint at path (LoRA's from init): each rank
    reads only its shard of each tensor."""
    buffers = non_persistent_buffers(model)
    ties = tied_parameters(module)
    module.to_empty(device=device)
    for owner, name, source, source_name in ties:  # to_empty gives each module its own tensor
        owner._parameters[name] = source._parameters[source_name]
    files, layout = SafetensorsDirectory(path), layouts.of(model.config)
    non_persistent = set(buffers)
    tensors = [*model.named_parameters(), *((n, b) for n, b in model.named_buffers() if n not in non_persistent)]
    missing = [piece.name for name, tensor in tensors if name not in init
               for piece in layout.files(file_key(name), tuple(tensor.shape)) if piece.name not in files]
    if missing:
        raise ValueError(f"{path} does not hold {len(missing)} of the model's tensors, e.g. {missing[:3]}")
    with torch.no_grad():
        for name, tensor in tensors:
            local, offsets = local_block(tensor)
            offset = offsets[0] if offsets else 0
            if name in init:
                values = init[name][offset:offset + local.shape[0]] if local.dim() else init[name]
            else:
                values = layout.read(files, file_key(name), tuple(tensor.shape), offset, offset + (local.shape[0] if local.dim() else 1))
            if local.dim() > 1 and local.shape[1] != tensor.shape[1]:  # tensor parallelism's split by input features
                values = values[:, offsets[1]:offsets[1] + local.shape[1]]
            if tuple(values.shape) != tuple(local.shape):
                raise ValueError(f"{name}: the checkpoint's shard is {tuple(values.shape)}, the model's {tuple(local.shape)}")
            local.copy_(values)
        for name, value in buffers.items():
            model.get_buffer(name).copy_(value)


def tied_parameters(module: torch.nn.Module) -> list[tuple[torch.nn.Module, str, torch.nn.Module, str]]:
    """(module, name, first module, its name) for each parameter that is another module's (tied
    embeddings)."""
    first, ties = {}, []
    for owner in module.modules():
        for name, param in owner._parameters.items():
            if param is None:
                continue
            if id(param) in first:
                ties.append((owner, name, *first[id(param)]))
            else:
                first[id(param)] = (owner, name)
    return ties


def local_part(tensor: torch.Tensor) -> tuple[torch.Tensor, int]:
    """This rank's part of a parameter (a DTensor's local shard, or the tensor) and the row of the
    whole tensor it starts at (its columns, where tensor parallelism splits them: local_block)."""
    local, offsets = local_block(tensor)
    return local, (offsets[0] if offsets else 0)


def local_block(tensor: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    """This rank's part of a parameter and the index of the whole tensor it starts at, per dim: a
    run of rows (FSDP2 and expert parallelism shard dim 0), of some columns where tensor
    parallelism splits input features (dim 1). Where both split the rows (FSDP2's _StridedShard
    over tensor parallelism's output features) it is one run too: the FSDP share of the tensor
    rank's rows."""
    from torch.distributed.tensor import DTensor

    if not isinstance(tensor, DTensor):
        return tensor.data, (0,) * tensor.dim()
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
    if tuple(shape[2:]) != tuple(tensor.shape[2:]):
        raise ValueError(f"a parameter sharded on a dim other than 0 and 1 ({tensor.placements}): not supported")
    return tensor.to_local(), tuple(offset)
