"""The run's step on one process: micro-batches accumulate to the batch they split, activation
checkpointing recomputes the same gradients, bf16 compute stays near fp32."""

from __future__ import annotations

import pytest
import torch
from gearshift.jobs.sft.config import SFTConfig
from gearshift.jobs.sft.trainer import sft_loss_of, train_on
from gearshift.training import batching, tokenization
from gearshift.training.runtime import Run

from tests.libs.training.trajectories import forced_agentic, routed_instant

BF16_LOSS_TOLERANCE = 0.01  # relative, every step of 5 (measured: at most 0.11%)


def config(tiny_dir, tmp_path, **extra) -> SFTConfig:
    body = {
        "model": {"base": str(tiny_dir)},
        "optim": {"learning_rate": 1e-2, "max_steps": 5, "seed": 0, "threads": 1},
        "output": {"dir": str(tmp_path / "out"), "progress": False, "resume": False},
        "batch_size": 4,
    }
    for key, value in extra.items():
        body[key] = {**body.get(key, {}), **value} if isinstance(value, dict) else value
    return SFTConfig.model_validate(body)


def examples(run: Run) -> list[tokenization.Encoded]:
    trajectories = [routed_instant("a"), forced_agentic("b"), routed_instant("c"), forced_agentic("d")]
    return [tokenization.encode_trajectory(run.tokenizer, t, 1024, True) for t in trajectories]


def gradients(run: Run) -> tuple[float, dict[str, torch.Tensor], int]:
    """The loss and gradients of one step's accumulation over the four examples, and how many
    micro-batches it took."""
    batch = examples(run)
    plan = run.micro_batches(batch)
    loss = run.accumulate(plan, sft_loss_of(run, sum(e.target_count for e in batch)))
    grads = {name: param.grad.clone() for name, param in run.model.named_parameters() if param.grad is not None}
    run.optimizer.zero_grad(set_to_none=True)
    return loss, grads, len(plan)


def assert_same_gradients(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys() and a
    for name in a:
        assert torch.allclose(a[name], b[name], atol=1e-6, rtol=1e-4), name


def test_four_micro_batches_accumulate_to_the_batch_of_four(tiny_dir, tmp_path):
    whole_loss, whole, whole_steps = gradients(Run.start("sft", config(tiny_dir, tmp_path, runtime={"micro_batch_tokens": 0})))
    longest = max(len(e.input_ids) for e in examples(Run.start("sft", config(tiny_dir, tmp_path))))
    split = Run.start("sft", config(tiny_dir, tmp_path, runtime={"micro_batch_tokens": longest}))
    split_loss, parts, split_steps = gradients(split)
    assert whole_steps == 1 < split_steps  # at most the longest example's tokens each (two short ones share one, the prefix once)
    assert split_loss == pytest.approx(whole_loss, rel=1e-6)
    assert_same_gradients(whole, parts)


@pytest.mark.parametrize("lora", [False, True])
def test_activation_checkpointing_gives_the_gradients_of_a_plain_backward(tiny_dir, tmp_path, lora):
    model = {"lora": lora, "lora_rank": 4}
    plain_loss, plain, _ = gradients(Run.start("sft", config(tiny_dir, tmp_path, model=model)))
    checkpointed = Run.start("sft", config(tiny_dir, tmp_path, model=model | {"gradient_checkpointing": True}))
    assert checkpointed.model.get_decoder().gradient_checkpointing
    loss, grads, _ = gradients(checkpointed)
    assert loss == pytest.approx(plain_loss, rel=1e-5)
    assert_same_gradients(plain, grads)


def test_bf16_compute_stays_near_fp32_over_five_steps(tiny_dir, tmp_path):
    trajectories = [routed_instant("a"), forced_agentic("b"), routed_instant("c", "medium"), forced_agentic("d", "medium")]
    fp32 = train_on(config(tiny_dir, tmp_path / "fp32", runtime={"precision": "fp32"}), trajectories)
    bf16 = train_on(config(tiny_dir, tmp_path / "bf16", runtime={"precision": "bf16"}), trajectories)
    from gearshift.training.results import read_metrics

    fp32_losses = [r["loss"] for r in read_metrics(tmp_path / "fp32" / "out")]
    bf16_losses = [r["loss"] for r in read_metrics(tmp_path / "bf16" / "out")]
    assert len(bf16_losses) == 5 and bf16_losses[-1] < 0.8 * bf16_losses[0]  # it learns
    assert bf16_losses == pytest.approx(fp32_losses, rel=BF16_LOSS_TOLERANCE)
    assert bf16_losses != fp32_losses  # the compute did change
    assert (bf16["metrics"]["steps"], fp32["metrics"]["steps"]) == (5, 5)
    from safetensors import safe_open

    with safe_open(tmp_path / "bf16" / "out" / "model.safetensors", "pt") as saved:
        assert {saved.get_tensor(key).dtype for key in saved.keys()} == {torch.bfloat16}  # saved in the training precision


def test_micro_batch_plan_bounds_padded_tokens_and_covers_every_row_once():
    rows = [tokenization.Encoded([1] * n, [False] * (n - 1) + [True]) for n in (30, 5, 12, 12, 60, 7, 29)]
    plan = batching.plan(rows, 64, pad_id=0)
    assert sorted(i for micro in plan for i in micro.indices) == list(range(len(rows)))
    assert all(micro.batch.input_ids.numel() <= 64 for micro in plan)
    assert [len(micro.indices) for micro in plan] == [1, 2, 4]  # longest first: 60 | 30, 29 | 12, 12, 7, 5
    assert len(batching.plan(rows, 0, pad_id=0)) == 1
    assert len(batching.plan([tokenization.Encoded([1] * 100, [True] * 100)], 64, pad_id=0)) == 1  # too long: alone


def test_under_lora_in_bf16_the_frozen_base_is_bf16_and_the_adapters_float32(tiny_dir, tmp_path):
    run = Run.start("sft", config(tiny_dir, tmp_path, model={"lora": True, "lora_rank": 4}, runtime={"precision": "bf16"}))
    dtypes = {name: param.dtype for name, param in run.model.named_parameters()}
    assert {dtype for name, dtype in dtypes.items() if "lora_" in name} == {torch.float32}  # master weights of what trains
    assert {dtype for name, dtype in dtypes.items() if "lora_" not in name} == {torch.bfloat16}
    loss, grads, _ = gradients(run)
    assert loss == loss and grads and all(g.dtype == torch.float32 for g in grads.values())
