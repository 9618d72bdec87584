"""LoRA on the tiny Qwen3-MoE's routed experts (training/expert_lora.py) beside its attention, in
one process and on 2 gloo ranks with the experts spread over them (expert parallelism 2): the
same training, an adapter in the per-expert layout vLLM's LoRA loader reads (checked by vLLM's
own loader, in its virtual environment), and a merged checkpoint that transformers and the
built-in policy server load with the adapted model's outputs. vLLM's CPU build cannot run it (its
MoE LoRA layer needs the Triton kernel): tests/jobs/vllm_lora_greedy.py shows it, outside the
suite (an engine start of 2 to 3 minutes; docs/distributed-training.md)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.jobs import expert_lora_worker
from tests.jobs.greedy import transformers_and_builtin_greedy
from tests.rank_processes import run_ranks
from tests.vllm_servers import VLLM_PYTHON, vllm_environment

pytestmark = [pytest.mark.ranks, pytest.mark.slow("trainer ranks")]

LOGITS_TOLERANCE = 2e-5  # float32 on the CPU: the merged weights and W + s B A per forward round differently (seen: 8e-7)
TWO_RANKS_TOLERANCE = 1e-4  # 3 SGD steps, reduction order differing between 1 process and 2 ranks (seen: 5e-5 on merged weights)


@pytest.fixture(scope="module")
def runs(moe_dir, tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("expert-lora")
    for name, ranks in (("one", 1), ("ep2", 2)):  # ranks forked from the suite's forkserver (tests/rank_processes.py)
        run_ranks(ranks, expert_lora_worker.main, moe_dir, folder / name, ranks)
    return {"one": folder / "one", "ep2": folder / "ep2"}


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[key] - b[key]).abs().max()) for key in a)


def test_two_ranks_with_the_experts_spread_train_the_experts_lora_as_one_process(runs):
    one, two = (torch.load(out / "run.pt") for out in runs.values())
    assert two["losses"] == pytest.approx(one["losses"], rel=1e-5)
    assert one["losses"][0] != one["losses"][-1]
    assert float((one["logits"] - two["logits"]).abs().max()) < TWO_RANKS_TOLERANCE
    adapters = [load_file(out / "adapter" / "adapter_model.safetensors") for out in runs.values()]
    assert max_difference(*adapters) < TWO_RANKS_TOLERANCE
    learned = [value for name, value in adapters[0].items() if ".experts." in name and "lora_B" in name]
    assert len(learned) == 2 * 4 * 3 and all(value.abs().max() > 1e-3 for value in learned)  # every expert's B moved from 0
    assert max_difference(*(load_file(out / "model.safetensors") for out in runs.values())) < TWO_RANKS_TOLERANCE


@pytest.mark.parametrize("run", ["one", "ep2"])
def test_the_merged_export_gives_the_adapted_models_logits_in_transformers(runs, run):
    from transformers import AutoModelForCausalLM

    out = runs[run]
    adapted = torch.load(out / "run.pt")
    exported = load_file(out / "model.safetensors")
    assert "model.layers.1.mlp.experts.3.gate_proj.weight" in exported and not any("lora" in name for name in exported)
    merged = AutoModelForCausalLM.from_pretrained(out, local_files_only=True, dtype=torch.float32)
    with torch.no_grad():
        logits = merged(input_ids=adapted["tokens"]).logits
    assert float((logits - adapted["logits"]).abs().max()) < LOGITS_TOLERANCE


def test_the_adapter_is_one_matrix_per_expert_and_peft_loads_it_with_the_adapted_logits(runs, moe_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = runs["one"]
    adapter = load_file(out / "adapter" / "adapter_model.safetensors")
    prefix = "base_model.model.model.layers.0.mlp.experts.2"
    assert adapter[f"{prefix}.gate_proj.lora_A.weight"].shape == (4, 64)  # [r, hidden]
    assert adapter[f"{prefix}.up_proj.lora_B.weight"].shape == (32, 4)  # [moe_intermediate, r]
    assert adapter[f"{prefix}.down_proj.lora_A.weight"].shape == (4, 32)
    assert not any(".experts.lora_" in name or "base_layer" in name for name in adapter)  # not peft's fused layout
    config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert set(config["target_modules"]) == {"q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"}
    base = AutoModelForCausalLM.from_pretrained(moe_dir, local_files_only=True, dtype=torch.float32)
    adapted = torch.load(out / "run.pt")
    with torch.no_grad():
        logits = PeftModel.from_pretrained(base, out / "adapter")(input_ids=adapted["tokens"]).logits
    assert float((logits - adapted["logits"]).abs().max()) < LOGITS_TOLERANCE


async def test_the_built_in_server_serves_the_merged_export_with_transformers_greedy_tokens(runs, tmp_path):
    expected, served = await transformers_and_builtin_greedy(runs["ep2"], tmp_path, "What is 12*34?", 12)
    assert served == expected


def vllm(script: str, *args: str) -> subprocess.CompletedProcess:
    if not VLLM_PYTHON.exists():
        pytest.fail(f"vLLM is not installed at {VLLM_PYTHON}: run scripts/install-vllm.sh")
    return subprocess.run([str(VLLM_PYTHON), str(Path(__file__).with_name(script)), *args],
                          capture_output=True, text=True, timeout=600, env=vllm_environment(0))


@pytest.mark.vllm
def test_vllms_lora_loader_reads_every_expert_of_the_adapter(runs):
    done = vllm("vllm_lora_names.py", str(runs["ep2"] / "adapter"), "4")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    (line,) = [line.removeprefix("LOADED ") for line in done.stdout.splitlines() if line.startswith("LOADED ")]
    loaded = json.loads(line)
    adapter = load_file(runs["ep2"] / "adapter" / "adapter_model.safetensors")
    read = {name.removeprefix("base_model.model.").removesuffix(".lora_A.weight") for name in adapter if "lora_A" in name}
    assert set(loaded["modules"]) == read  # every tensor named as vLLM parses it, none refused
    for name, (a, b) in loaded["modules"].items():
        prefix = f"base_model.model.{name}"
        assert [list(adapter[f"{prefix}.lora_A.weight"].shape), list(adapter[f"{prefix}.lora_B.weight"].shape)] == [a, b]
    assert loaded["modules"]["model.layers.1.mlp.experts.3.down_proj"] == [[4, 32], [64, 4]]
    packed = [[[4, 4, 64], [4, 4, 32], [4, 4, 64]], [[4, 32, 4], [4, 64, 4], [4, 32, 4]]]  # gate, down, up: [experts, r, in], [experts, out, r]
    assert loaded["packed"] == {"model.layers.0.mlp": packed, "model.layers.1.mlp": packed}
