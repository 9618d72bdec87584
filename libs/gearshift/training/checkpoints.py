"""Checkpoints: Hugging Face safetensors directories gathered on rank 0 in the training precision
(full weights, or a LoRA adapter through peft, with the merged weights beside it when asked), and
resumable training state, sharded through torch.distributed.checkpoint and written atomically,
so a crash loses at most save_every steps and a run saved at N ranks resumes at M."""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import os
import random
import shutil
import struct
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import safetensors.torch  # noqa: E402
import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict, set_state_dict  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from gearshift import weights  # noqa: E402
from gearshift.training import distributed, expert_lora, layouts, loading  # noqa: E402
from gearshift.training.config import ModelConfig, RuntimeConfig  # noqa: E402
from gearshift.training.distributed import Ranks  # noqa: E402
from gearshift.training.results import ADAPTER_DIR  # noqa: E402

log = logging.getLogger("gearshift.training")

LATEST = "latest"  # names the newest complete resume state in the resume directory
TRAINER_STATE = "trainer.json"
MAX_FILE_BYTES = 5 * 2**30  # per exported safetensors file, as transformers' save_pretrained splits them


Wrap = Callable[[torch.nn.Module], torch.nn.Module]


@dataclass
class LoadedPolicy:
    """The model being trained, its tokenizer, where its starting weights came from, and module:
    the model inside what wrap made of it (a TargetForward), wrapped for the ranks (FSDP, DDP)."""

    model: torch.nn.Module
    tokenizer: object
    source_path: Path
    module: torch.nn.Module | None = None

    @property
    def is_lora(self) -> bool:
        return hasattr(self.model, "peft_config")


def load_policy(config: ModelConfig, models_dir: Path, compute_dtype: torch.dtype = torch.float32, ranks: Ranks | None = None,
                runtime: RuntimeConfig | None = None, wrap: Wrap | None = None) -> LoadedPolicy:
    """Loads the starting weights on the rank's device (default: one process on the CPU): in
    float32, the master weights of what trains; under LoRA the frozen base in compute_dtype (it
    needs no master copy), the adapters in float32 (peft's autocast_adapter_dtype). Built on the
    meta device and sharded before any weight is read: a rank holds only its shards
    (gearshift.training.loading)."""
    path = weights.resolve(config.base, models_dir)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model, init = loading.build(path, compute_dtype if config.lora else torch.float32, config)
    module = _load(model, path, init, ranks or Ranks(), runtime or RuntimeConfig(), compute_dtype, wrap)
    return LoadedPolicy(model, tokenizer, path, module)


def load_frozen(source: str, models_dir: Path, dtype: torch.dtype, ranks: Ranks | None = None, runtime: RuntimeConfig | None = None,
                wrap: Wrap | None = None) -> torch.nn.Module:
    """A model used only for inference (a teacher, a reference policy) in dtype, gradients off, as
    wrap makes it (default: the model itself), on the rank's device: sharded with FSDP across the
    ranks (is_sharded: then every rank must call it in lockstep), else whole on every rank."""
    path = weights.resolve(source, models_dir)
    model, _ = loading.build(path, dtype)
    model.eval().requires_grad_(False)
    from gearshift.training.experts import experts_of

    # A dense teacher of an MoE student has no experts to spread.
    runtime = (runtime or RuntimeConfig()).model_copy(update={"compile": False, **({} if experts_of(model) else {"expert_parallel": 1})})
    return _load(model, path, {}, ranks or Ranks(), runtime, dtype, wrap, frozen=True)


def _load(model: torch.nn.Module, path: Path, init: dict, ranks: Ranks, runtime: RuntimeConfig, compute_dtype: torch.dtype,
          wrap: Wrap | None, frozen: bool = False) -> torch.nn.Module:
    """wrap(model) sharded (FSDP) or compiled, then given its weights, then replicated (DDP)."""
    module = wrap(model) if wrap else model
    replicated = ranks.distributed and runtime.parallelism == "ddp"
    if not replicated:
        module = distributed.parallelize(module, ranks, runtime, compute_dtype)
    loading.materialise(module, model, path, ranks.device, init)
    if replicated and not frozen:
        module = distributed.parallelize(module, ranks, runtime, compute_dtype)
    return module


def full_state(model: torch.nn.Module, ranks: Ranks, trainable_only: bool = False) -> dict[str, torch.Tensor]:
    """The model's whole state dict on rank 0's CPU (gathered from the shards; other ranks get {}),
    a tied weight once (under its first name: the head's is the embedding's). trainable_only (LoRA's
    adapters): gathered one parameter at a time, the frozen base never."""
    if ranks.distributed and trainable_only:
        trainable = [(name, param) for name, param in model.named_parameters() if param.requires_grad]
        state = {name: _whole(param, param.dtype).cpu() for name, param in trainable}
        return state if ranks.main else {}
    if ranks.distributed:
        options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=trainable_only)
        state = get_model_state_dict(model, options=options)
    else:
        trainable = {name for name, param in model.named_parameters() if param.requires_grad}
        state = {name: value.detach().cpu() for name, value in model.state_dict().items() if not trainable_only or name in trainable}
    aliases = _tied_aliases(model)
    return {name: value for name, value in state.items() if name not in aliases}


def load_full_state(model: torch.nn.Module, state: dict[str, torch.Tensor], trainable_only: bool = False) -> None:
    """Loads a full_state() into a whole model of the same architecture (rank 0's copy)."""
    names = set(model.state_dict())
    expected = {name for name, param in model.named_parameters() if param.requires_grad} if trainable_only else names
    absent, unexpected = expected - set(state) - _tied_aliases(model), set(state) - names
    if absent or unexpected:
        raise ValueError(f"the state does not fit the model: missing {sorted(absent)[:3]}, unexpected {sorted(unexpected)[:3]}")
    model.load_state_dict(state, strict=False)


def _tied_aliases(model: torch.nn.Module) -> set[str]:
    """Names of parameters that are another, earlier named parameter."""
    seen, aliases = set(), set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen:
            aliases.add(name)
        seen.add(id(param))
    return aliases


def merged_lora_state(state: dict[str, torch.Tensor], scaling: float, adapter: str = "default") -> dict[str, torch.Tensor]:
    """A peft LoRA model's state dict with each adapted weight W replaced by W + scaling * B @ A,
    under the base model's own names: what merge_and_unload() gives, from a gathered state dict."""
    merged = {}
    for key, value in state.items():
        if ".lora_" in key:
            continue
        if key.endswith(".base_layer.weight"):
            module = key.removesuffix(".base_layer.weight")
            a, b = state[f"{module}.lora_A.{adapter}.weight"], state[f"{module}.lora_B.{adapter}.weight"]
            value = value + scaling * (b.float() @ a.float()).to(value.dtype)
        merged[key.removeprefix("base_model.model.").replace(".base_layer", "")] = value
    return merged


def lora_scaling(model) -> float:
    config = model.peft_config["default"]
    return config.lora_alpha / (math.sqrt(config.r) if config.use_rslora else config.r)


def save_weights(policy: LoadedPolicy, directory: Path, ranks: Ranks, dtype: torch.dtype = torch.float32, merged: bool = True,
                 max_file_bytes: int = MAX_FILE_BYTES) -> None:
    """Writes a loadable Hugging Face checkpoint of the policy into directory, in dtype (every rank
    calls it: gathering the shards is a collective). For LoRA: the adapter in directory/adapter,
    and with merged the adapter folded into the base weights in directory. The weights stream to
    disk a tensor at a time (write_safetensors): no process holds the whole model. Atomic: a
    sibling folder renamed into place; other files already in directory are kept."""
    partial = directory / ".weights.partial"
    if ranks.main:
        directory.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
    if policy.is_lora:
        adapter = full_state(policy.model, ranks, trainable_only=True)  # small: the adapters alone
        if ranks.main:
            save_adapter(policy.model, adapter, partial / ADAPTER_DIR)
    if merged or not policy.is_lora:
        base = policy.model.get_base_model() if policy.is_lora else policy.model
        write_safetensors(partial, export_tensors(policy, dtype), ranks, max_file_bytes)
        if ranks.main:
            base.config.save_pretrained(partial)
            if base.can_generate() and base.generation_config is not None:
                base.generation_config.save_pretrained(partial)
            _record_dtype(partial, dtype)
    if not ranks.main:
        return
    policy.tokenizer.save_pretrained(partial)
    for item in partial.iterdir():
        target = directory / item.name
        if target.is_dir():
            shutil.rmtree(target)
        os.replace(item, target)
    partial.rmdir()


def save_adapter(model, state: dict[str, torch.Tensor], directory: Path) -> None:
    """A peft model's adapter (its trainable state, whole: full_state) as peft's files; the
    tensors peft does not know (the experts' LoRA) in the family's layout beside peft's own
    (layouts: one matrix per expert, as vLLM reads it)."""
    layout = layouts.of(model.config)
    ours = {name: pieces for name, value in state.items() if (pieces := layout.adapter_files(name, tuple(value.shape)))}
    model.save_pretrained(directory, state_dict={name: value for name, value in state.items() if name not in ours})
    if ours:
        path = directory / weights.ADAPTER_WEIGHTS
        tensors = safetensors.torch.load_file(path) | {piece.name: piece.of(state[name], 0).contiguous() for name, pieces in ours.items() for piece in pieces}
        safetensors.torch.save_file(tensors, path, metadata={"format": "pt"})


SAFETENSORS_NAMES = {dtype: name for name, dtype in loading.SAFETENSORS_DTYPES.items()}


@dataclass
class ExportedTensor:
    """A tensor of the exported checkpoint: its name, shape and dtype, the parameter it is laid out
    like (a DTensor sharded by rows under FSDP, and by columns too under tensor parallelism), and
    how to make this rank's part of it (under
    LoRA a collective too: every rank calls rows in the same order)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    like: torch.Tensor
    rows: Callable[[], torch.Tensor]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def _local(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """This rank's rows of a parameter (all of it unless sharded) in dtype."""
    local, _ = loading.local_part(tensor.detach())
    return local.to(dtype) if local.is_floating_point() else local


def _whole(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A (small) parameter made whole in dtype, gathered from every rank's shard."""
    tensor = tensor.detach()
    tensor = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
    return tensor.to(dtype)


def export_tensors(policy: LoadedPolicy, dtype: torch.dtype) -> list[ExportedTensor]:
    """The checkpoint's tensors in the family's layout (layouts.py), a tied weight once; under LoRA
    each adapted weight W + scaling * B @ A (merged_lora_state), made on each rank for its own rows
    of W and B (sharded alike, by output rows) with the whole A (r rows)."""
    model = policy.model
    layout = layouts.of(model.config)
    state = {name: value for name, value in model.state_dict().items() if name not in _tied_aliases(model)}
    adapted_experts = expert_lora.adapted_weights(model)  # merged on the rank holding their rows, as A and B are sharded alike
    exported = []
    for name, value in state.items():
        if ".lora_" in name:
            continue
        out_dtype = dtype if value.is_floating_point() else value.dtype
        if policy.is_lora and name in adapted_experts:
            def local(name=name, w=value, experts=adapted_experts[name]) -> torch.Tensor:
                factors = {projection: (_local(a, dtype), _local(b, dtype)) for projection, (a, b) in expert_lora.factors_of(experts, local=False).items()}
                return expert_lora.merged(_local(w, dtype), name.rsplit(".", 1)[1], factors, experts.lora_scaling)
        elif policy.is_lora and name.endswith(".base_layer.weight"):
            module = name.removesuffix(".base_layer.weight")
            a, b = state[f"{module}.lora_A.default.weight"], state[f"{module}.lora_B.default.weight"]

            def local(name=name, w=value, a=a, b=b, scaling=lora_scaling(model)) -> torch.Tensor:
                module = name.removesuffix(".base_layer.weight")
                parts = {name: _local(w, dtype), f"{module}.lora_A.default.weight": _whole(a, dtype), f"{module}.lora_B.default.weight": _local(b, dtype)}
                return next(iter(merged_lora_state(parts, scaling).values()))
        else:
            def local(value=value) -> torch.Tensor:
                return loading.local_part(value.detach())[0]
        for piece in layout.files(loading.file_key(name), tuple(value.shape)):
            def rows(piece=piece, value=value, local=local, out_dtype=out_dtype) -> torch.Tensor:
                _, offset = loading.local_part(value)
                part = piece.of(local(), offset) if value.dim() else local()
                return part.to(out_dtype)  # cut before the cast: an expert's matrix, not the rank's every expert
            exported.append(ExportedTensor(piece.name, piece.shape, out_dtype, value, rows))
    return exported


def write_safetensors(directory: Path, tensors: list[ExportedTensor], ranks: Ranks, max_file_bytes: int = MAX_FILE_BYTES) -> None:
    """tensors as safetensors files in directory (model.safetensors, or model-0000k-of-0000n files
    of at most max_file_bytes each and the index transformers reads). Rank 0 writes each tensor's
    rows as they come, run by run in row order (_stream_rows): no process ever holds more of a
    tensor than a run of its rows (a shard, or a shard's tensor-parallel columns joined) besides
    its own shards. The headers come first, from the shapes and dtypes alone."""
    files: list[list[ExportedTensor]] = [[]]
    for tensor in tensors:
        if files[-1] and sum(t.nbytes for t in files[-1]) + tensor.nbytes > max_file_bytes:
            files.append([])
        files[-1].append(tensor)
    names = ["model.safetensors"] if len(files) == 1 else [f"model-{i + 1:05d}-of-{len(files):05d}.safetensors" for i in range(len(files))]
    for name, members in zip(names, files):
        handle = open(directory / name, "wb") if ranks.main else None
        try:
            if handle:
                handle.write(_safetensors_header(members))
            for tensor in members:
                written = _stream_rows(tensor, handle, ranks)
                if handle and written != tensor.nbytes:
                    raise ValueError(f"{tensor.name}: wrote {written} bytes of {tensor.nbytes}")
        finally:
            if handle:
                handle.close()
    if ranks.main and len(files) > 1:
        index = {"metadata": {"total_size": sum(t.nbytes for t in tensors)},
                 "weight_map": {t.name: name for name, members in zip(names, files) for t in members}}
        (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def _stream_rows(tensor: ExportedTensor, handle, ranks: Ranks) -> int:
    """Writes a tensor's bytes with handle (rank 0's; None elsewhere) from its rows on each rank:
    one run of rows at a time, in row order, through point-to-point messages from the ranks holding
    one replica's parts (_parts); a run split by columns (tensor parallelism's input features) is
    joined on rank 0 before it is written. Returns the bytes written."""
    from torch.distributed.tensor import DTensor

    rows = tensor.rows()
    if not isinstance(tensor.like, DTensor) or not ranks.distributed:
        return _write(handle, rows) if handle else 0
    import torch.distributed as dist

    runs = _parts(tensor.like)
    if ranks.rank not in {holder for run in runs for holder in run}:
        return 0  # another replica: rank 0's has the same rows
    if not handle:
        shape = torch.tensor(list(rows.shape) or [1], dtype=torch.int64, device=rows.device)
        dist.send(shape, dst=0)
        if rows.numel():
            dist.send(rows.contiguous(), dst=0)
        return 0
    written = 0
    for run in runs:
        parts = [rows if holder == ranks.rank else _received(holder, tensor, rows.device) for holder in run]
        written += _write(handle, parts[0] if len(parts) == 1 else torch.cat(parts, dim=1))
        del parts
    return written


def _received(holder: int, tensor: ExportedTensor, device: torch.device) -> torch.Tensor:
    """A holder's rows of tensor, as _stream_rows sends them: their shape, then them."""
    import torch.distributed as dist

    shape = torch.zeros(max(1, len(tensor.shape)), dtype=torch.int64, device=device)
    dist.recv(shape, src=holder)
    part = torch.empty(shape.tolist(), dtype=tensor.dtype, device=device)
    if part.numel():
        dist.recv(part, src=holder)
    return part


def _parts(like) -> list[list[int]]:
    """The ranks whose parts of a DTensor make it once, by runs of rows in row order: for each run,
    the ranks holding its columns, in column order (one rank unless tensor parallelism splits
    them). On replicated dims (HSDP's replicas) the first rank in mesh order holds a part: rank
    0's replica; what tensor parallelism leaves whole lies on each tensor rank's own mesh, of
    which rank 0's holds it (none on the others')."""
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    mesh, first = like.device_mesh, {}
    if not (mesh.mesh == 0).any():
        return []  # a replica on another tensor rank's mesh: rank 0's has the same rows
    for coordinate in itertools.product(*(range(size) for size in mesh.shape)):
        _, offset = _compute_local_shape_and_global_offset(like.shape, mesh.shape, list(coordinate), like.placements)
        first.setdefault(tuple(offset), int(mesh.mesh[coordinate]))
    runs: dict[int, list[int]] = {}
    for offset in sorted(first):
        runs.setdefault(offset[0] if offset else 0, []).append(first[offset])
    return list(runs.values())


def _write(handle, rows: torch.Tensor) -> int:
    rows = rows.detach().to("cpu").contiguous()
    if rows.numel():
        handle.write(rows.view(torch.uint8).numpy())  # the tensor's own memory: no bytes copy
    return rows.numel() * rows.element_size()


def _safetensors_header(tensors: list[ExportedTensor]) -> bytes:
    """The 8-byte length and the JSON header of a safetensors file holding tensors in this order
    (padded with spaces to 8 bytes, as the safetensors library writes it)."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for tensor in tensors:
        header[tensor.name] = {"dtype": SAFETENSORS_NAMES[tensor.dtype], "shape": list(tensor.shape), "data_offsets": [offset, offset + tensor.nbytes]}
        offset += tensor.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def _record_dtype(directory: Path, dtype: torch.dtype) -> None:
    """config.json's dtype says what the files hold (transformers writes the parameters' dtype,
    float32 master weights, whatever the state dict saved)."""
    path = directory / "config.json"
    config = json.loads(path.read_text())
    config["dtype"] = str(dtype).removeprefix("torch.")
    path.write_text(json.dumps(config, indent=2) + "\n")


# Resumable state: <dir>/step-00000012/ holds the model's and optimizer's shards (DCP), every
# rank's RNG and trainer.json (step, scheduler); <dir>/latest names the newest complete one.


def _state_dicts(model, optimizer) -> dict:
    options = StateDictOptions(ignore_frozen_params=True)  # LoRA: the adapters; the base is reloaded
    model_state, optimizer_state = get_state_dict(model, optimizer, options=options)
    return {"model": model_state, "optimizer": optimizer_state}


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


@contextlib.contextmanager
def _one_process_quietly():
    """DCP warns that it assumes one process when no process group exists: that is the intent."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def save_resume(directory: Path, model, optimizer, scheduler, step: int, ranks: Ranks) -> None:
    """Everything needed to continue at step + 1 (every rank calls it). The state is written to a
    .partial folder, renamed complete, and only then named in `latest`: a crash mid-save leaves
    the previous state usable."""
    name = f"step-{step:08d}"
    partial, final = directory / f"{name}.partial", directory / name
    if ranks.main:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    ranks.barrier()
    torch.save(_rng_state(), partial / f"rng-{ranks.rank}.pt")
    with _one_process_quietly():
        dcp.save(_state_dicts(model, optimizer), checkpoint_id=partial, no_dist=not ranks.distributed)
    if ranks.main:
        trainer = {"step": step, "world_size": ranks.world_size, "scheduler": scheduler.state_dict()}
        (partial / TRAINER_STATE).write_text(json.dumps(trainer))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(partial, final)
        pointer = directory / f"{LATEST}.partial"
        pointer.write_text(name)
        os.replace(pointer, directory / LATEST)
        for older in directory.glob("step-*"):
            if older != final:
                shutil.rmtree(older, ignore_errors=True)
    ranks.barrier()


def load_resume(directory: Path, model, optimizer, scheduler, ranks: Ranks) -> int:
    """Restores the newest saved state, whatever the number of ranks that saved it; returns its
    step (0 when nothing was saved)."""
    pointer = directory / LATEST
    if not pointer.exists():
        return 0
    path = directory / pointer.read_text().strip()
    trainer = json.loads((path / TRAINER_STATE).read_text())
    state = _state_dicts(model, optimizer)
    try:
        with _one_process_quietly():
            dcp.load(state, checkpoint_id=path, no_dist=not ranks.distributed)
    except (RuntimeError, KeyError, ValueError) as exc:
        raise ValueError(f"resume state in {path} does not fit this model: {exc}") from exc
    options = StateDictOptions(ignore_frozen_params=True)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"], options=options)
    scheduler.load_state_dict(trainer["scheduler"])
    rng = path / f"rng-{ranks.rank}.pt"
    if rng.exists():
        _set_rng_state(torch.load(rng, weights_only=True))
    else:
        log.info("rank %d has no saved RNG state (saved at %d ranks): it keeps its seeded one", ranks.rank, trainer["world_size"])
    return int(trainer["step"])
