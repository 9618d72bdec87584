"""Checkpoints: Hugging Face safetensors directories (full weights, or LoRA adapters through peft
with merged weights beside them so the built-in policy server can load either), and resumable
training state written atomically so a crash loses at most save_every steps."""

from __future__ import annotations

import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from gearshift import weights  # noqa: E402
from gearshift.training.config import ModelConfig  # noqa: E402

ADAPTER_DIR = "adapter"
RESUME_FILE = "resume.pt"


@dataclass
class LoadedPolicy:
    """The model being trained, its tokenizer and where its starting weights came from."""

    model: torch.nn.Module
    tokenizer: object
    source_path: Path

    @property
    def is_lora(self) -> bool:
        return hasattr(self.model, "peft_config")


def load_policy(config: ModelConfig, models_dir: Path) -> LoadedPolicy:
    """Loads the starting weights in fp32, wrapped in LoRA adapters when configured."""
    path = weights.resolve(config.base, models_dir)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    if config.lora:
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(
            r=config.lora_rank,
            lora_alpha=config.lora_alpha,
            lora_dropout=config.lora_dropout,
            target_modules=config.lora_target_modules,
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, lora)
    return LoadedPolicy(model, tokenizer, path)


def load_frozen(source: str, models_dir: Path) -> torch.nn.Module:
    """A model used only for inference (a teacher, a reference policy), gradients off."""
    path = weights.resolve(source, models_dir)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    model.eval().requires_grad_(False)
    return model


def _merged_state(model) -> dict[str, torch.Tensor]:
    """The base model's weights with the LoRA deltas folded in (call between merge/unmerge)."""
    state = model.get_base_model().state_dict()
    return {key.replace(".base_layer", ""): value for key, value in state.items() if "lora_" not in key}


def save_weights(policy: LoadedPolicy, directory: Path) -> None:
    """Writes a loadable Hugging Face checkpoint into directory (atomically: a sibling folder
    renamed into place, other files already in directory are kept)."""
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / ".weights.partial"
    shutil.rmtree(partial, ignore_errors=True)
    if policy.is_lora:
        policy.model.save_pretrained(partial / ADAPTER_DIR)
        policy.model.merge_adapter()
        try:
            policy.model.get_base_model().save_pretrained(partial, state_dict=_merged_state(policy.model), safe_serialization=True)
        finally:
            policy.model.unmerge_adapter()
    else:
        policy.model.save_pretrained(partial, safe_serialization=True)
    policy.tokenizer.save_pretrained(partial)
    for item in partial.iterdir():
        target = directory / item.name
        if target.is_dir():
            shutil.rmtree(target)
        os.replace(item, target)
    partial.rmdir()


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Only what the optimizer changes (all weights, or the LoRA adapters)."""
    return {name: param.detach().clone() for name, param in model.named_parameters() if param.requires_grad}


def save_resume(directory: Path, model, optimizer, scheduler, step: int) -> None:
    """Everything needed to continue at step + 1 after a crash, in one atomically replaced file."""
    directory.mkdir(parents=True, exist_ok=True)
    state = {
        "step": step,
        "model": trainable_state(model),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
    }
    partial = directory / (RESUME_FILE + ".partial")
    torch.save(state, partial)
    os.replace(partial, directory / RESUME_FILE)


def load_resume(directory: Path, model, optimizer, scheduler) -> int:
    """Restores saved training state; returns the last completed step (0 when nothing saved)."""
    path = directory / RESUME_FILE
    if not path.exists():
        return 0
    state = torch.load(path, weights_only=False)
    missing = set(state["model"]) - {name for name, _ in model.named_parameters()}
    if missing:
        raise ValueError(f"resume state in {path} does not fit this model: {sorted(missing)[:3]}")
    model.load_state_dict(state["model"], strict=False)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    return int(state["step"])
