"""Reads a LoRA adapter of a Qwen3-MoE with vLLM's own LoRA loader, no engine (run with vLLM's
own Python, tests/vllm_servers.VLLM_PYTHON):

    vllm-venv/bin/python tests/jobs/vllm_lora_names.py ADAPTER NUM_EXPERTS

The modules vLLM expects are its Qwen3-MoE's packed modules (qkv_proj's q/k/v) and o_proj, and
its "experts" module packed per expert as its model manager packs it for a model whose experts
are not 3-D LoRA weights (RoutedExperts.build_expert_params_mapping's checkpoint names). The
adapter goes through LoRAModel.from_local_checkpoint (its unexpected-module check and
parse_fine_tuned_lora_name), then each layer's experts through PackedLoRALayerWeights.pack_moe.
Prints one line "LOADED <JSON>": each module vLLM read, with its A's and B's shapes, and each
layer's experts packed (A's and B's shapes of w1 = gate, w2 = down, w3 = up, experts first)."""

import json
import sys

from vllm.lora.lora_model import LoRAModel
from vllm.lora.lora_weights import PackedLoRALayerWeights
from vllm.lora.peft_helper import PEFTHelper
from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
from vllm.model_executor.models.qwen3_moe import Qwen3MoeForCausalLM

if __name__ == "__main__":
    adapter, experts = sys.argv[1], int(sys.argv[2])
    per_expert = [name.rstrip(".") for _, name, _, _ in RoutedExperts.build_expert_params_mapping("gate_proj", "down_proj", "up_proj", experts)]
    expected = {*Qwen3MoeForCausalLM.packed_modules_mapping["qkv_proj"], "o_proj", *per_expert}
    model = LoRAModel.from_local_checkpoint(adapter, expected, PEFTHelper.from_local_dir(adapter, max_position_embeddings=None), device="cpu")
    loaded = {name: [list(lora.lora_a.shape), list(lora.lora_b.shape)] for name, lora in model.loras.items()}
    layers = sorted({name.split(".experts.")[0] for name in model.loras if ".experts." in name})
    packed = {}
    for layer in layers:
        members = [model.loras.get(f"{layer}.{name}") for name in per_expert]
        moe = PackedLoRALayerWeights.pack_moe(members, f"{layer}.experts")
        packed[layer] = [[list(a.shape) for a in moe.lora_a], [list(b.shape) for b in moe.lora_b]]
    print("LOADED", json.dumps({"modules": loaded, "packed": packed, "per_expert": per_expert}), flush=True)
