"""Meta-device loading gives the model from_pretrained and get_peft_model gave; the streamed export
reloads in transformers, split into several files with an index when asked."""

import json

import pytest
import torch
from gearshift import weights
from gearshift.training import checkpoints, loading
from gearshift.training.config import ModelConfig
from gearshift.training.distributed import Ranks
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM


def _old_load(path, config: ModelConfig, dtype):
    """What load_policy did before meta loading: whole, on the CPU, then peft."""
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype)
    if config.lora:
        with weights.peft_wrapping():
            model = get_peft_model(model, LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha,
                                                     target_modules=config.lora_target_modules, task_type="CAUSAL_LM"))
    return model


@pytest.mark.parametrize("lora", [False, True])
def test_meta_loading_gives_the_from_pretrained_model(tiny_dir, tmp_path, lora):
    config = ModelConfig(base=str(tiny_dir), lora=lora, lora_rank=4)
    dtype = torch.bfloat16 if lora else torch.float32  # LoRA: the frozen base in the compute dtype
    torch.manual_seed(3)
    old = _old_load(tiny_dir, config, dtype)
    rng_after_old = torch.get_rng_state()
    torch.manual_seed(3)
    policy = checkpoints.load_policy(config, tmp_path, dtype)
    assert torch.equal(torch.get_rng_state(), rng_after_old)  # what trains next draws the same numbers
    new = policy.model
    old_state, new_state = old.state_dict(), new.state_dict()
    assert old_state.keys() == new_state.keys()
    for name, value in old_state.items():  # buffers (rotary inv_freq) and LoRA's A and B included
        assert new_state[name].dtype == value.dtype and torch.equal(new_state[name], value), name
    base = new.get_base_model() if lora else new
    assert base.lm_head.weight is base.model.embed_tokens.weight  # still tied
    assert not any(param.is_meta for param in new.parameters())
    ids = torch.tensor([[1, 5, 9, 200]])
    with torch.no_grad():
        assert torch.equal(old(input_ids=ids).logits, new(input_ids=ids).logits)


def test_export_in_several_files_reloads_in_transformers(tiny_dir, tmp_path):
    policy = checkpoints.load_policy(ModelConfig(base=str(tiny_dir)), tmp_path)
    with torch.no_grad():
        for param in policy.model.parameters():
            param.add_(0.01 * torch.randn_like(param))
    checkpoints.save_weights(policy, tmp_path / "ckpt", Ranks(), torch.bfloat16, max_file_bytes=200_000)
    index = json.loads((tmp_path / "ckpt" / "model.safetensors.index.json").read_text())
    files = set(index["weight_map"].values())
    assert len(files) > 1 and all((tmp_path / "ckpt" / name).exists() for name in files)
    assert "lm_head.weight" not in index["weight_map"]  # tied: written once, as transformers writes it
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["dtype"] == "bfloat16"
    assert not (tmp_path / "ckpt" / ".weights.partial").exists()
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", local_files_only=True, dtype=torch.bfloat16)
    for name, value in reloaded.state_dict().items():
        assert torch.equal(value, policy.model.state_dict()[name].to(value.dtype)), name


def test_rows_are_read_without_the_rest_of_the_tensor(tiny_dir):
    files = loading.SafetensorsDirectory(tiny_dir)
    whole = files.rows("model.embed_tokens.weight")
    assert torch.equal(files.rows("model.embed_tokens.weight", 7, 19), whole[7:19])
    assert files.rows("model.embed_tokens.weight", 5, 5).shape == (0, whole.shape[1])
