"""LoRA on the routed experts of the tiny Qwen3-MoE in one process (training/expert_lora.py): what
the default targets adapt, the adapter off giving the base, the per-expert adapter names and the
refusals. Two ranks with expert parallelism, the export, vLLM: tests/jobs/test_expert_lora.py."""

import pytest
import torch
from gearshift.training import checkpoints, layouts
from gearshift.training.config import ModelConfig
from transformers import AutoModelForCausalLM


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    from gearshift.training.tiny import tiny_moe_checkpoint

    return tiny_moe_checkpoint(tmp_path_factory.mktemp("moe") / "tiny-moe")


@pytest.fixture(scope="module")
def adapted(moe_dir, tmp_path_factory):
    """The default targets on the MoE, every B drawn away from 0 (as if trained)."""
    torch.manual_seed(0)
    policy = checkpoints.load_policy(ModelConfig(base=str(moe_dir), lora=True, lora_rank=4), tmp_path_factory.mktemp("models"))
    with torch.no_grad():
        for name, param in policy.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    return policy


def test_the_default_targets_adapt_each_experts_projections_expert_first(adapted):
    trainable = {name.split(".layers.1.")[-1]: tuple(param.shape) for name, param in adapted.model.named_parameters()
                 if param.requires_grad and ".layers.1." in name}
    assert {name: shape for name, shape in trainable.items() if "experts" in name} == {
        "mlp.experts.lora_A.gate_proj": (4, 4, 64), "mlp.experts.lora_B.gate_proj": (4, 32, 4),
        "mlp.experts.lora_A.up_proj": (4, 4, 64), "mlp.experts.lora_B.up_proj": (4, 32, 4),
        "mlp.experts.lora_A.down_proj": (4, 4, 32), "mlp.experts.lora_B.down_proj": (4, 64, 4),
    }  # [experts, r, in] and [experts, out, r]
    assert len(trainable) == 6 + 8  # and q, k, v, o through peft


def test_the_experts_lora_changes_the_output_and_the_adapter_off_gives_the_base(adapted, moe_dir):
    ids = torch.randint(0, 1000, (2, 9), generator=torch.Generator().manual_seed(1))
    base = AutoModelForCausalLM.from_pretrained(moe_dir, local_files_only=True, dtype=torch.float32)
    with torch.no_grad():
        expected = base(input_ids=ids).logits
        with adapted.model.disable_adapter():
            off = adapted.model(input_ids=ids).logits
        on = adapted.model(input_ids=ids).logits
        attention_only = {name: param.clone() for name, param in adapted.model.named_parameters() if ".experts.lora_B" in name}
        for name, param in adapted.model.named_parameters():
            if ".experts.lora_B" in name:
                param.zero_()
        without_experts = adapted.model(input_ids=ids).logits
        for name, param in adapted.model.named_parameters():
            if name in attention_only:
                param.copy_(attention_only[name])
    torch.testing.assert_close(off, expected, rtol=0, atol=1e-6)
    assert float((on - without_experts).abs().max()) > 1e-3  # the experts' LoRA is in the forward


def test_the_adapter_holds_one_matrix_per_expert_named_as_peft_names_linear_experts():
    layout = layouts.of(type("Config", (), {"model_type": "qwen3_moe"})())
    pieces = layout.adapter_files("base_model.model.model.layers.0.mlp.experts.lora_B.up_proj", (4, 32, 8))
    assert [(p.name, p.shape) for p in pieces] == [(f"base_model.model.model.layers.0.mlp.experts.{e}.up_proj.lora_B.weight", (32, 8))
                                                   for e in range(4)]
    rows = torch.arange(4 * 32 * 8.0).reshape(4, 32, 8)
    assert torch.equal(pieces[2].of(rows, 0), rows[2])
    assert layout.adapter_files("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight", (8, 64)) is None  # peft's own


@pytest.mark.parametrize("model, message", [
    ({"lora_target_modules": ["gate_proj", "up_proj", "down_proj"]}, r"^LoRA on the experts of a qwen3_moe model alone: name a linear layer"),
    ({"lora_dropout": 0.1}, r"^LoRA on the experts adds B A to their weights, which has no dropout: set model.lora_dropout: 0$"),
])
def test_what_the_experts_lora_cannot_do_is_refused_in_one_line(moe_dir, tmp_path, model, message):
    with pytest.raises(ValueError, match=message):
        checkpoints.load_policy(ModelConfig(base=str(moe_dir), lora=True, **model), tmp_path)


def test_the_saved_adapter_reloads_in_peft_with_the_adapted_logits(adapted, moe_dir, tmp_path):
    """What the trainers publish (checkpoints.save_adapter: the export's adapter, and on-policy
    training's adapter for vLLM each step), read back by peft, which fuses the experts' matrices."""
    from gearshift.training.distributed import Ranks
    from peft import PeftModel

    checkpoints.save_adapter(adapted.model, checkpoints.full_state(adapted.model, Ranks(), trainable_only=True), tmp_path / "adapter")
    ids = torch.randint(0, 1000, (2, 9), generator=torch.Generator().manual_seed(2))
    base = AutoModelForCausalLM.from_pretrained(moe_dir, local_files_only=True, dtype=torch.float32)
    with torch.no_grad():
        reloaded = PeftModel.from_pretrained(base, tmp_path / "adapter")(input_ids=ids).logits
        expected = adapted.model(input_ids=ids).logits
    torch.testing.assert_close(reloaded, expected, rtol=0, atol=1e-5)
