"""Model sources: a LoRA adapter directory is folded into its base once and then served like any
checkpoint; the cache is per machine (models_dir), not per data directory."""

from __future__ import annotations

import json
import warnings
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from gearshift import weights
from gearshift.settings import Settings


def test_an_adapter_is_folded_into_its_base_once(tmp_path):
    models = tmp_path / "models"
    base = weights.resolve(weights.TINY, Settings().models_dir)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)  # a trained adapter changes the outputs; a fresh one (B = 0) would not
    adapter = tmp_path / "adapter"
    model.save_pretrained(adapter)
    config = json.loads((adapter / weights.ADAPTER_CONFIG).read_text())
    (adapter / weights.ADAPTER_CONFIG).write_text(json.dumps(config | {"base_model_name_or_path": str(base)}))

    merged = weights.resolve(str(adapter), models)
    assert (merged / "config.json").exists() and merged.parent == models
    assert weights.resolve(str(adapter), models) == merged  # cached: the second call folds nothing
    ids = torch.tensor([[1, 5, 9, 42, 7]])
    with torch.no_grad():
        expected = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter)(ids).logits
        served = weights.load(str(adapter), models).model(ids).logits
        plain = AutoModelForCausalLM.from_pretrained(base)(ids).logits
    assert torch.allclose(served, expected, atol=1e-4) and not torch.allclose(served, plain, atol=1e-2)


def test_models_are_cached_per_machine_not_per_data_directory(tmp_path):
    assert Settings(data_dir=tmp_path / "a").models_dir == Settings(data_dir=tmp_path / "b").models_dir


def test_folding_an_adapter_says_nothing_of_deprecated_transformers_names(tmp_path):
    """peft reads transformers' deprecated is_gradient_checkpointing when it wraps a model; a
    user folding (or training) an adapter is not shown the FutureWarning that gives."""
    base = weights.resolve(weights.TINY, Settings().models_dir)
    model = AutoModelForCausalLM.from_pretrained(base)
    with pytest.warns(FutureWarning, match="is_gradient_checkpointing"):
        model.is_gradient_checkpointing  # noqa: B018  (the alias, read as peft reads it)
    adapter = tmp_path / "adapter"
    get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"])).save_pretrained(adapter)
    config = json.loads((adapter / weights.ADAPTER_CONFIG).read_text())
    (adapter / weights.ADAPTER_CONFIG).write_text(json.dumps(config | {"base_model_name_or_path": str(base)}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        weights.resolve(str(adapter), tmp_path / "models")
    assert not [w for w in caught if "is_gradient_checkpointing" in str(w.message)]


def test_writers_filling_one_cache_at_once_leave_it_whole(tmp_path):
    """Replicas on one models volume, or test workers, expand the same cache at once: each writes
    a copy of its own, the first rename wins, and no half-written folder is left or read."""
    base = weights.resolve(weights.TINY, Settings().models_dir)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(base), AutoTokenizer.from_pretrained(base)
    target = tmp_path / "models" / "cache"
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: weights._save_atomically(model, tokenizer, target), range(4)))
    assert [path.name for path in target.parent.iterdir()] == ["cache"]
    reloaded = AutoModelForCausalLM.from_pretrained(target)
    assert all(torch.equal(a, b) for a, b in zip(reloaded.state_dict().values(), model.state_dict().values()))


def test_the_tokenizer_converted_from_the_gguf_is_kept_and_loads_the_same(tmp_path):
    """Without the expanded weights, the SmolLM2 tokenizer is converted from the GGUF once and kept:
    every tiny checkpoint asks for it. A models directory it cannot write still gets one."""
    models = tmp_path / "models"
    converted = weights.smollm2_tokenizer(models)
    assert (models / weights.SMOLLM2_TOKENIZER_CACHE / "tokenizer_config.json").exists()
    kept = weights.smollm2_tokenizer(models)
    chat = [{"role": "user", "content": "What is 12*34?"}]
    assert kept.get_vocab() == converted.get_vocab() and kept.chat_template == converted.chat_template
    assert kept.apply_chat_template(chat, add_generation_prompt=True) == converted.apply_chat_template(chat, add_generation_prompt=True)
    unwritable = tmp_path / "a-file"  # no folder can be made under it, whoever runs the test
    unwritable.write_text("")
    assert weights.smollm2_tokenizer(unwritable / "models").get_vocab() == converted.get_vocab()
