"""One job across ranks (torchrun, gloo on the CPU, the tiny model) learns what one process learns.

The data is what the platform produces: episodes the executor ran (a ScriptedPolicy answering
products right with python and by reasoning, wrong at once), scored by the reward service and
stored (tests/jobs/conftest.py: ranks_data). SFT runs as users launch it (`torchrun -m
gearshift.cli train sft`) and reads the store; APO and distillation run their trainers' own
`learn` on rollouts collected once (tests/jobs/ranks_worker.py, every case in one launch per
number of ranks with the other rank modules': tests/jobs/rank_runs.py), so 1 rank and 2 learn from
the same episodes."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.jobs.rank_runs import (
    PARALLELISMS,
    PRODUCTS,
    WEIGHTS_TOLERANCE,
    assert_same_run,
    base_config,
    first_error,
    launch,
    max_difference,
    metrics,
    out_dir,
    run_cases,
    run_worker,
    sft_config,
    write_config,
)

# The worker runs' launches are the set-up of the first test that uses them: 260 s on the seventh stop's 2-core machine.
pytestmark = [pytest.mark.slow, pytest.mark.ranks, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def store(ranks_store, ranks_data):
    """The store holding the platform's episodes (task_source "ranks")."""
    return ranks_store


def train_sft(ranks: int, config: dict, folder: Path) -> subprocess.CompletedProcess:
    folder.mkdir(parents=True, exist_ok=True)
    path = write_config(folder / "sft.json", config)
    return launch(ranks, "-m", "gearshift.cli", "train", "sft", "--config", str(path))


@pytest.fixture(scope="module")
def sft_alone(tiny_dir, store, tmp_path_factory):
    """SFT in one process: the reference of every comparison."""
    out = tmp_path_factory.mktemp("sft") / "one"
    done = train_sft(1, sft_config(tiny_dir, out, store), out.parent / "config-one")
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.mark.parametrize("parallelism", ["fsdp", "ddp"])
def test_sft_under_torchrun_is_one_job_that_learns_what_one_process_learns(tiny_dir, store, sft_alone, tmp_path, parallelism):
    out = tmp_path / "two"
    config = sft_config(tiny_dir, out, store, runtime={"parallelism": parallelism})
    done = train_sft(2, config, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(done.stdout.strip().splitlines()) == 1  # one summary: rank 0's
    history, alone = metrics(out), metrics(sft_alone)
    assert [r["step"] for r in history] == [1, 2, 3]  # one line per step, not one per rank
    assert [r["loss"] for r in history] == pytest.approx([r["loss"] for r in alone], rel=1e-5)
    assert [r["grad_norm"] for r in history] == pytest.approx([r["grad_norm"] for r in alone], rel=1e-4)
    assert [r["target_tokens"] for r in history] == [r["target_tokens"] for r in alone]
    assert max_difference(load_file(out / "model.safetensors"), load_file(sft_alone / "model.safetensors")) < WEIGHTS_TOLERANCE
    result = json.loads((out / "result.json").read_text())
    assert store.checkpoint(result["checkpoint_id"]).uri == str(out.resolve())  # registered once, by rank 0
    retried = train_sft(2, config, tmp_path)  # a retry after the registration completes
    assert retried.returncode == 0, retried.stderr[-3000:]
    assert json.loads((out / "result.json").read_text())["checkpoint_id"] == result["checkpoint_id"]
    assert [r["step"] for r in metrics(out)] == [1, 2, 3]


def test_sft_normalised_per_rank_differs_from_one_process(sft_alone, worker_runs):
    """The comparison above catches a loss normalised by each rank's own token count."""
    per_rank = worker_runs[2]["sft-per-rank"]
    alone = [r["loss"] for r in metrics(sft_alone)]
    assert per_rank["losses"] != pytest.approx(alone, rel=1e-5)  # what the comparison above asserts
    difference = max_difference(torch.load(per_rank["weights"]), load_file(sft_alone / "model.safetensors"))
    assert difference > 10 * WEIGHTS_TOLERANCE, difference


@pytest.mark.parametrize("job", ["apo", "distill"])
@pytest.mark.parametrize("parallelism, lora", PARALLELISMS)
def test_on_policy_updates_on_two_ranks_equal_one_process(worker_runs, job, parallelism, lora):
    """Under LoRA, APO's KL reference is the base with the adapter off."""
    one, two = worker_runs[1][f"{job}-lora-{lora}"], worker_runs[2][f"{job}-{parallelism}-lora-{lora}"]
    assert_same_run(one, two)
    assert one["losses"][0] != one["losses"][-1]  # it learned something to compare


def test_a_rank_that_dies_fails_the_job_and_a_rerun_on_one_rank_resumes_to_the_same_weights(
    tiny_dir, store, sft_alone, ranks_data, tmp_path
):
    config = sft_config(tiny_dir, tmp_path / "out")  # saves every 2 steps
    with pytest.raises(AssertionError):  # the launch failed
        run_cases(2, {"died": ("sft", config, ranks_data.sft_trajectories)}, tmp_path / "died", die_at=3, die_rank=1)
    died = (tmp_path / "died" / "stderr.txt").read_text()
    assert re.search(r"rank\s*:\s*1 \(local_rank: 1\)\n\s*exitcode\s*:\s*-9", died), died[-3000:]  # torchrun names it
    assert not (tmp_path / "out" / "result.json").exists()
    resumed = run_worker(1, "sft", config, ranks_data.sft_trajectories, tmp_path)  # saved at 2 ranks, loaded at 1
    assert resumed["resumed_from"] == 2
    assert resumed["losses"] == pytest.approx([r["loss"] for r in metrics(sft_alone)], rel=1e-5)  # one line per step
    assert max_difference(torch.load(resumed["weights"]), load_file(sft_alone / "model.safetensors")) < WEIGHTS_TOLERANCE


def test_state_saved_at_one_rank_resumes_at_two(sft_alone, worker_runs):
    resumed = worker_runs[2]["resumed"]
    assert resumed["resumed_from"] == 2
    assert max_difference(torch.load(resumed["weights"]), load_file(sft_alone / "model.safetensors")) < WEIGHTS_TOLERANCE


def test_distillation_under_torchrun_rolls_out_on_rank_zero_and_learns_on_every_rank(tiny_dir, teacher_dir, store, tmp_path):
    """The whole job: rank 0's in-process stack runs the episodes with a copy of the sharded
    student (refreshed after each update), both ranks learn their share, rank 0 stores and registers."""
    out = tmp_path / "out"
    prompts = [{"query": f"What is {a}*{b}?", "mode": mode} for (a, b), mode in zip(PRODUCTS, ["instant", "agentic"] * 3)]
    config = base_config(tiny_dir, out, store_addr=store.address, default_teacher=str(teacher_dir), prompts=prompts, batch_size=4,
                         rollout={"max_tokens_per_turn": 12, "max_steps": 1, "temperature": 0.0}, optim={"max_steps": 2})
    done = launch(2, "-m", "gearshift.cli", "train", "distill", "--config", str(write_config(tmp_path / "distill.json", config)))
    assert done.returncode == 0, first_error(done.stderr)
    history = metrics(out)
    assert [r["step"] for r in history] == [1, 2] and all(r["updated"] and r["sampled_tokens"] > 0 for r in history)
    result = json.loads((out / "result.json").read_text())
    assert len(result["trajectory_ids"]) == 8  # 4 episodes a step, run once (on rank 0), not once per rank
    assert sorted(t.id for t in store.export(run_id=f"distill-{result['checkpoint_id']}")) == result["trajectory_ids"]
    assert store.checkpoint(result["checkpoint_id"]).job == "distill"


def test_lora_in_bf16_under_fsdp_learns_what_one_process_learns(worker_runs):
    """The GPU default for LoRA on gloo: a bf16 base and float32 adapters in one FSDP group."""
    one, two = worker_runs[1]["lora-bf16"], worker_runs[2]["lora-bf16"]
    assert two["losses"] == pytest.approx(one["losses"], rel=1e-2)  # bf16 rounding differs with the split
    assert one["losses"][-1] < one["losses"][0]
    assert {v.dtype for k, v in torch.load(two["weights"]).items() if "lora_" not in k} == {torch.bfloat16}


@pytest.mark.parametrize("job, ranks, layout", [("sft", 2, ""), ("apo", 2, ""), ("distill", 2, ""), ("sft", 2, "-ep2"),
                                                ("distill", 2, "-ep2"), ("distill", 4, "-ep2x2"),
                                                ("sft", 2, "-cp2"), ("apo", 2, "-cp2"), ("distill", 2, "-cp2"), ("sft", 2, "-cp2-ep2"),
                                                ("sft", 4, "-cp2x2-ep2")])
def test_a_moe_trains_on_several_ranks_as_in_one_process_with_its_balancing_loss(worker_runs, job, ranks, layout):
    """The tiny Qwen3-MoE sharded by FSDP, with its experts spread over 2 ranks (expert
    parallelism) on 2 ranks and on a 2 x 2 mesh, or each micro-batch's tokens split over 2 ranks
    (context parallelism), alone, with expert parallelism and beside 2 data ranks: the same losses
    (the balancing loss in them), gradients (weights after the steps), per-expert counts and
    exported files as one process."""
    one, two = worker_runs[1][f"moe-{job}"], worker_runs[ranks][f"moe-{job}{layout}"]
    assert_same_run(one, two)
    if job == "sft":  # the job whose worker run exports (the others run their learn() alone)
        exported = [load_file(out_dir(run) / "model.safetensors") for run in (one, two)]
        assert "model.layers.1.mlp.experts.3.down_proj.weight" in exported[1]  # the checkpoint layout: a matrix per expert
        assert max_difference(*exported) < WEIGHTS_TOLERANCE
    alone, many = metrics(out_dir(one)), metrics(out_dir(two))
    assert [r["expert_tokens"] for r in many] == [r["expert_tokens"] for r in alone]
    assert [r["balance_loss"] for r in many] == pytest.approx([r["balance_loss"] for r in alone], rel=1e-5)
    counts = alone[0]["expert_tokens"]
    assert len(counts) == 2 and all(len(layer) == 4 for layer in counts)  # per layer, per expert
    assert len({sum(layer) for layer in counts}) == 1 and sum(counts[0]) > 0  # every token counted twice (top-2) in each layer


def test_the_balancing_loss_trains_the_routers(worker_runs):
    """With router_aux_loss_coef at 0 the routers learn otherwise: the loss is in their gradient."""
    balanced, unbalanced = (torch.load(worker_runs[1][name]["weights"]) for name in ("moe-sft", "moe-sft-unbalanced"))
    routers = [name for name in balanced if name.endswith("mlp.gate.weight")]
    assert routers and all(not torch.equal(balanced[name], unbalanced[name]) for name in routers)
    assert metrics(out_dir(worker_runs[1]["moe-sft"]))[0]["balance_loss"] > 0


def test_lora_on_a_moe_exports_an_adapter_the_built_in_server_loads(worker_runs, tmp_path):
    """LoRA on the attention of the tiny MoE: the adapter peft wrote loads in the built-in server's
    loader (weights.load folds it into its base) and answers the merged export's greedy tokens."""
    from gearshift import weights
    from transformers import AutoModelForCausalLM

    out = out_dir(worker_runs[1]["moe-lora"])
    served = weights.load(str(out / "adapter"), tmp_path)
    merged = AutoModelForCausalLM.from_pretrained(out, local_files_only=True, dtype=torch.float32)
    prompt = served.tokenizer("What is 12*34?", return_tensors="pt").input_ids
    tokens = [model.generate(prompt, max_new_tokens=12, do_sample=False)[0].tolist() for model in (served.model, merged)]
    assert tokens[0] == tokens[1]
    assert max_difference(served.model.state_dict(), merged.state_dict()) < 1e-5


def test_a_moe_loaded_with_its_experts_spread_over_two_ranks_exports_its_files(worker_runs, moe_dir):
    """Each rank read its own experts (and its FSDP shard of the rest); the export gathers them
    back to the checkpoint's tensors, unchanged; the loaded state is from_pretrained's."""
    from gearshift.training.loading import SafetensorsDirectory
    from transformers import AutoModelForCausalLM

    run = worker_runs[2]["moe-export-ep2"]
    source, exported = SafetensorsDirectory(moe_dir), SafetensorsDirectory(out_dir(run))
    assert exported.entries.keys() == source.entries.keys()
    assert all(torch.equal(exported.rows(name), source.rows(name)) for name in source.entries)
    reference = AutoModelForCausalLM.from_pretrained(moe_dir, local_files_only=True, dtype=torch.float32).state_dict()
    assert max_difference(torch.load(run["weights"]), reference) == 0


async def test_an_exported_moe_answers_transformers_greedy_tokens_on_the_builtin_server_and_vllm(worker_runs, tmp_path):
    """The checkpoint SFT exported after training with its experts spread over 2 ranks, served."""
    from tests.jobs.greedy import transformers_and_builtin_greedy
    from tests.vllm_servers import VLLM_PYTHON, vllm_environment

    out, prompt, count = out_dir(worker_runs[2]["moe-sft-ep2"]), "What is 12*34?", 12
    expected, served = await transformers_and_builtin_greedy(out, tmp_path, prompt, count)
    assert served == expected
    vllm = subprocess.run([str(VLLM_PYTHON), str(Path(__file__).with_name("vllm_greedy.py")), str(out), prompt, str(count)],
                          capture_output=True, text=True, timeout=300, env=vllm_environment(0))
    assert vllm.returncode == 0, (vllm.stdout + vllm.stderr)[-3000:]
    (tokens,) = [line.removeprefix("TOKENS ") for line in vllm.stdout.splitlines() if line.startswith("TOKENS ")]
    assert json.loads(tokens) == expected
