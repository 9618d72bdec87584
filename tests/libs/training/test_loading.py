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


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    from gearshift.training.tiny import tiny_moe_checkpoint

    return tiny_moe_checkpoint(tmp_path_factory.mktemp("moe") / "tiny-moe")


def test_a_moe_checkpoint_loads_as_from_pretrained_and_exports_file_for_file(moe_dir, tmp_path):
    """transformers builds the experts fused ([experts, ...] parameters), the files hold one matrix
    per expert: the layout maps one to the other, both ways."""
    files = loading.SafetensorsDirectory(moe_dir)
    assert "model.layers.0.mlp.experts.3.up_proj.weight" in files  # what save_pretrained wrote
    policy = checkpoints.load_policy(ModelConfig(base=str(moe_dir)), tmp_path)
    reference = AutoModelForCausalLM.from_pretrained(moe_dir, local_files_only=True, dtype=torch.float32).state_dict()
    state = policy.model.state_dict()
    assert state.keys() == reference.keys() and "model.layers.0.mlp.experts.gate_up_proj" in state
    for name, value in reference.items():
        assert torch.equal(state[name], value), name
    checkpoints.save_weights(policy, tmp_path / "export", Ranks(), torch.float32)
    exported = loading.SafetensorsDirectory(tmp_path / "export")
    assert exported.entries.keys() == files.entries.keys()
    for name in files.entries:
        assert torch.equal(exported.rows(name), files.rows(name)), name


def test_a_parameters_rows_come_from_the_files_that_hold_them(moe_dir):
    """A shard's rows of fused experts (experts 1 and 2 of 4) read only those experts' matrices."""
    from gearshift.training import layouts

    files = loading.SafetensorsDirectory(moe_dir)
    layout = layouts.of(AutoModelForCausalLM.from_pretrained(moe_dir, local_files_only=True).config)
    name, shape = "model.layers.1.mlp.experts.gate_up_proj", (4, 64, 64)
    rows = layout.read(files, name, shape, 1, 3)
    for row, expert in enumerate((1, 2)):
        gate, up = (files.rows(f"model.layers.1.mlp.experts.{expert}.{kind}.weight") for kind in ("gate_proj", "up_proj"))
        assert torch.equal(rows[row], torch.cat([gate, up]))
    pieces = {piece.name: piece.of(rows, 1) for piece in layout.files(name, shape)}
    assert torch.equal(pieces["model.layers.1.mlp.experts.2.up_proj.weight"], files.rows("model.layers.1.mlp.experts.2.up_proj.weight"))
    assert pieces["model.layers.1.mlp.experts.0.gate_proj.weight"].shape == (0, 64)  # another shard's expert


def test_an_unknown_model_family_is_refused_in_one_line(tmp_path, tiny_dir):
    config = json.loads((tiny_dir / "config.json").read_text())
    (tmp_path / "mistral").mkdir()
    (tmp_path / "mistral" / "config.json").write_text(json.dumps({**config, "model_type": "mistral", "architectures": ["MistralForCausalLM"]}))
    with pytest.raises(ValueError, match=r"^no checkpoint layout for the model family 'mistral' \(known: llama, qwen2, qwen3, qwen3_moe\)$"):
        loading.build(tmp_path / "mistral", torch.float32)


def test_lora_on_the_experts_alone_is_refused_and_on_attention_loads(moe_dir, tmp_path):
    experts = ModelConfig(base=str(moe_dir), lora=True, lora_target_modules=["gate_proj", "up_proj", "down_proj"])
    with pytest.raises(ValueError, match="LoRA on the experts of a qwen3_moe model alone"):  # with them: tests/libs/training/test_expert_lora.py
        checkpoints.load_policy(experts, tmp_path)
    attention = ModelConfig(base=str(moe_dir), lora=True, lora_rank=4, lora_target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    model = checkpoints.load_policy(attention, tmp_path).model
    adapted = {name.split(".layers.1.")[-1] for name, param in model.named_parameters() if param.requires_grad and ".layers.1." in name}
    assert adapted == {f"self_attn.{p}.lora_{m}.default.weight" for p in ("q_proj", "k_proj", "v_proj", "o_proj") for m in "AB"}
