"""Checkpoints: Hugging Face safetensors directories gathered on rank 0 in the training precision
(full weights, or a LoRA adapter through peft, with the merged weights beside it when asked), and
resumable training state, sharded through torch.distributed.checkpoint and written atomically,
so a crash loses at most save_every steps and a run saved at N ranks resumes at M."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict, set_state_dict  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from gearshift import weights  # noqa: E402
from gearshift.training.config import ModelConfig  # noqa: E402
from gearshift.training.distributed import Ranks  # noqa: E402
from gearshift.training.results import ADAPTER_DIR  # noqa: E402

log = logging.getLogger("gearshift.training")

LATEST = "latest"  # names the newest complete resume state in the resume directory
TRAINER_STATE = "trainer.json"


@dataclass
class LoadedPolicy:
    """The model being trained, its tokenizer and where its starting weights came from."""

    model: torch.nn.Module
    tokenizer: object
    source_path: Path

    @property
    def is_lora(self) -> bool:
        return hasattr(self.model, "peft_config")


def load_policy(config: ModelConfig, models_dir: Path, compute_dtype: torch.dtype = torch.float32) -> LoadedPolicy:
    """Loads the starting weights on the CPU: in float32, the master weights of what trains; under
    LoRA the frozen base in compute_dtype (it needs no master copy), the adapters in float32
    (peft's autocast_adapter_dtype)."""
    path = weights.resolve(config.base, models_dir)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    dtype = compute_dtype if config.lora else torch.float32
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype)
    if config.gradient_checkpointing:
        # Non-reentrant: correct with frozen inputs (LoRA) and with FSDP's hooks outside the checkpoint.
        # transformers renamed the method (and its argument) in 5.2x; older releases have only the first.
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if config.lora:
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(
            r=config.lora_rank,
            lora_alpha=config.lora_alpha,
            lora_dropout=config.lora_dropout,
            target_modules=config.lora_target_modules,
            task_type="CAUSAL_LM",
        )
        with weights.peft_wrapping():
            model = get_peft_model(model, lora)
    return LoadedPolicy(model, tokenizer, path)


def load_frozen(source: str, models_dir: Path, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """A model used only for inference (a teacher, a reference policy) on device in dtype, gradients
    off. Each rank holds it whole: no master weights, and no collectives in its forward."""
    path = weights.resolve(source, models_dir)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype)
    return model.to(device).eval().requires_grad_(False)


def full_state(model: torch.nn.Module, ranks: Ranks, trainable_only: bool = False) -> dict[str, torch.Tensor]:
    """The model's whole state dict on rank 0's CPU (gathered from the shards; other ranks get {}),
    a tied weight once (under its first name: the head's is the embedding's)."""
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


def save_weights(policy: LoadedPolicy, directory: Path, ranks: Ranks, dtype: torch.dtype = torch.float32, merged: bool = True) -> None:
    """Writes a loadable Hugging Face checkpoint of the policy into directory, in dtype, from rank 0
    (every rank calls it: gathering the shards is a collective). For LoRA: the adapter in
    directory/adapter, and with merged the adapter folded into the base weights in directory.
    Atomic: a sibling folder renamed into place; other files already in directory are kept."""
    state = full_state(policy.model, ranks)
    if not ranks.main:
        return
    state = {key: value.to(dtype) if value.is_floating_point() else value for key, value in state.items()}
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / ".weights.partial"
    shutil.rmtree(partial, ignore_errors=True)
    if policy.is_lora:
        policy.model.save_pretrained(partial / ADAPTER_DIR, state_dict=state)
        if merged:
            base = policy.model.get_base_model()
            base.save_pretrained(partial, state_dict=merged_lora_state(state, lora_scaling(policy.model)))
            _record_dtype(partial, dtype)
    else:
        policy.model.save_pretrained(partial, state_dict=state)
        _record_dtype(partial, dtype)
    policy.tokenizer.save_pretrained(partial)
    for item in partial.iterdir():
        target = directory / item.name
        if target.is_dir():
            shutil.rmtree(target)
        os.replace(item, target)
    partial.rmdir()


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
