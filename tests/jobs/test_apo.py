"""APO: the clipped policy loss falls on a fixed rollout batch; a full run rolls out through the
in-process executor (forced and free rollouts), scores with the reward service and saves."""

import json

import pytest
import torch
from gearshift.api.common.v1.common_pb2 import Mode, RoutingStrategy
from gearshift.jobs.apo import trainer
from gearshift.jobs.apo.config import APOConfig, APOPrompt
from gearshift.jobs.apo.rollouts import Group, group_requests
from gearshift.training.config import RolloutConfig
from gearshift.training.results import read_metrics
from gearshift.training.runtime import Run

from tests.libs.training.trajectories import forced_agentic, routed_instant


def config(tiny_dir, out, **extra) -> APOConfig:
    body = {
        "model": {"base": str(tiny_dir)},
        "optim": {"learning_rate": 1e-2, "max_steps": 2, "seed": 0, "threads": 1},
        "output": {"dir": str(out), "save_every": 1, "progress": False},
        "prompts": [{"query": "What is 2+2?", "reference_answer": "4"}],
        "rho": 1,
        "gamma": 1,
        "rollout": {"max_tokens_per_turn": 12, "max_steps": 1},
    }
    body.update(extra)
    return APOConfig.model_validate(body)


def test_group_requests_force_each_mode_rho_times_then_gamma_free(tiny_dir):
    cfg = config(tiny_dir, "/tmp/unused", rho=2, gamma=3)
    requests = group_requests(APOPrompt(query="q", reference_answer="a"), cfg, "run", step=1, index=0)
    modes = [r.mode for r in requests]
    assert modes == [Mode.MODE_INSTANT] * 2 + [Mode.MODE_REASONING] * 2 + [Mode.MODE_AGENTIC] * 2 + [Mode.MODE_UNSPECIFIED] * 3
    assert len({r.trajectory_id for r in requests}) == cfg.group_size == 9
    again = group_requests(APOPrompt(query="q", reference_answer="a"), cfg, "run", step=1, index=0)
    assert [r.trajectory_id for r in again] == [r.trajectory_id for r in requests]  # a resumed step finds them
    # Each rollout samples with its own seed, the same when the step is run again; another run seed, others.
    assert len({r.sampling.seed for r in requests}) == 9 and [r.sampling for r in again] == [r.sampling for r in requests]
    reseeded = group_requests(APOPrompt(query="q", reference_answer="a"), config(tiny_dir, "/tmp/unused", rho=2, gamma=3, optim={"seed": 1}), "run", 1, 0)
    assert not {r.sampling.seed for r in reseeded} & {r.sampling.seed for r in requests}


def test_policy_loss_falls_on_a_fixed_rollout_batch(tiny_dir, tmp_path):
    cfg = config(tiny_dir, tmp_path / "out", updates_per_batch=8, optim={"learning_rate": 3e-3, "max_steps": 1, "threads": 1},
                 rollout={"exact_tokens": False})  # hand-written rollouts keep no sampled ids
    run = Run.start("apo", cfg)
    groups = [Group(APOPrompt(query="q", reference_answer="a"), [routed_instant(), forced_agentic()], [1.0, 0.0], 1.0, [True, False])]
    rollouts = trainer.encode_groups(run.tokenizer, groups, cfg)
    assert rollouts.advantages.tolist() == pytest.approx([0.7071, -0.7071], abs=1e-3)
    results = trainer.apo_update(run, rollouts, cfg)
    values = [r["loss"] for r in results]
    assert values[0] == pytest.approx(0.0, abs=1e-6)  # ratio 1: the advantages cancel within the group
    assert values[-1] < -0.05  # the good rollout's probability rose, the bad one's fell
    assert max(r["clipped_high"] for r in results) > 0  # clip-higher bounded the push


def test_apo_run_through_the_executor(tiny_dir, tmp_path, store):
    cfg = config(tiny_dir, tmp_path / "apo", store_addr=store.address)
    result = trainer.train(cfg)
    history = read_metrics(tmp_path / "apo")
    assert [r["step"] for r in history] == [1, 2]
    assert all(r["rollouts"] == 4 for r in history)
    # A random tiny model rarely answers right: a group whose rewards are all equal is dropped,
    # not trained on (its advantages would all be 0).
    assert all(r["updated"] == (r["groups_dropped"] == 0) == (r["tokens"] > 0) for r in history)
    assert len(result["trajectory_ids"]) == 8 and result["job"] == "apo"
    assert json.loads((tmp_path / "apo" / "result.json").read_text())["checkpoint_id"] == result["checkpoint_id"]
    assert (tmp_path / "apo" / "model.safetensors").exists()
    stored = store.export(run_id=f"apo-{result['checkpoint_id']}")
    assert sorted(t.id for t in stored) == sorted(result["trajectory_ids"])
    forced = [t for t in stored if t.routing_strategy == RoutingStrategy.ROUTING_STRATEGY_FORCED]
    assert sorted(t.requested_mode for t in forced) == sorted([Mode.MODE_INSTANT, Mode.MODE_REASONING, Mode.MODE_AGENTIC] * 2)
    assert len(stored) - len(forced) == 2  # gamma free rollouts per step, routed by the model (or its fallback)
    registered = store.checkpoint(result["checkpoint_id"])
    assert registered.job == "apo" and len(registered.trajectory_ids) == 8


def test_rollouts_that_fail_are_dropped_and_counted_and_the_run_goes_on(tiny_dir, tmp_path):
    """A prompt longer than the tiny policy's context: the policy server refuses every call of its
    episodes, so each ends in an error; they are dropped and counted, and the other prompt's group
    trains as before."""
    too_long = {"query": "Count these words: " + "word " * 3000, "reference_answer": "3000"}
    cfg = config(tiny_dir, tmp_path / "apo", prompts=[{"query": "What is 2+2?", "reference_answer": "4"}, too_long], prompts_per_step=2)
    result = trainer.train(cfg)
    history = read_metrics(tmp_path / "apo")
    assert [r["step"] for r in history] == [1, 2]
    assert all(r["failed_episodes"] == 4 and r["rollouts"] == 4 for r in history), history
    assert len(result["trajectory_ids"]) == 8  # only the finished rollouts are the run's lineage
    assert all(r.get("truncated_rollouts", 0) == 0 for r in history)


def by_mode(body: dict) -> str:
    """A scripted policy: right in instant and agentic mode, wrong in reasoning mode; left to
    itself it routes to tools. A facts question gets "Everest" (instant) or a denial (else)."""
    last = body["messages"][-1]["content"]
    mountain = "mountain" in str(body["messages"])
    if "</classification>" in (body.get("stop") or []):
        return "A tool is safest.\n<classification>\ntoolcalling_agent\n</classification>"
    if last.startswith("You regulate"):
        return "ACT"
    if last.endswith("<answer>"):
        return "It is Everest.</answer>" if mountain else "4</answer>"
    if last.endswith("<reasoning>"):
        return "Hmm.</reasoning>\n<answer>Not Everest</answer>" if mountain else "2 and 3.</reasoning>\n<answer>5</answer>"
    return "compute</plan>\n<answer>Not Everest</answer>" if mountain else "compute</plan>\n<answer>4</answer>"


async def test_rollout_rewards_and_advantages_match_a_hand_computation(settings, tiny_dir):
    from gearshift.embedded import embedded
    from gearshift.evaluation.suites import get_suite
    from gearshift.jobs.apo.rollouts import collect, informative
    from gearshift.testing.scripted_policy import serve_scripted

    everest = next(i for split in ("train", "dev", "test") for i in get_suite("facts").items(split) if i.answer == "Mount Everest")
    cfg = config(tiny_dir, "/tmp/unused", prompts=[
        {"query": "What is 2+2?", "reference_answer": "4"},
        {"query": "What is 3+3?", "reference_answer": "6"},
        {"query": everest.question, "reference_answer": everest.answer, "suite": "facts", "labels": {"item_id": everest.id}},
    ])
    async with serve_scripted(by_mode) as url, embedded(settings.with_policy(url)) as platform:
        stack = platform.settings
        groups = await collect(stack, stack.executor_addr, stack.reward_addr, cfg.prompts, cfg, "apo-by-hand", step=1)
    two, three, mountain = groups
    # Slots: forced instant, reasoning, agentic, then one free rollout that chose agentic.
    # 2+2: p = 1 (forced instant right) >= tau, so the free rollout, right in a dearer mode than
    # needed, gets r_adaptive = 1 - 1**2 = 0; forced rollouts are never penalised.
    assert two.correct == [True, False, True, True] and two.rewards == [1.0, 0.0, 1.0, 0.0]
    assert two.forced_instant_success_rate == 1.0
    assert three.rewards == [0.0] * 4  # all wrong: nothing to learn
    assert mountain.correct == [True, False, False, False]  # the suite's grader: "Not Everest" is no answer
    assert mountain.rewards == [1.0, 0.0, 0.0, 0.0]
    assert informative(groups, None) == [two, mountain]
    assert informative(groups, (0.125, 0.5)) == [mountain]  # 2+2's pass rate 0.75 is outside
    run = Run.start("apo", config(tiny_dir, settings.data_dir / "run"))
    batch = trainer.encode_groups(run.tokenizer, [two, mountain], cfg.model_copy(update={"rollout": RolloutConfig(exact_tokens=False)}))
    # Group z-scores with the sample std: [1, 0, 1, 0] -> mean 0.5, std sqrt(1/3); [1, 0, 0, 0] ->
    # mean 0.25, std 0.5.
    assert batch.advantages.tolist() == pytest.approx([0.8660, -0.8660, 0.8660, -0.8660, 1.5, -0.5, -0.5, -0.5], abs=1e-3)


def test_the_apo_reward_needs_forced_rollouts(tiny_dir):
    with pytest.raises(ValueError, match="rho >= 1"):
        config(tiny_dir, "/tmp/unused", rho=0, gamma=4)
    assert config(tiny_dir, "/tmp/unused", rho=0, gamma=4, reward="sr2am").group_size == 4


def parameters_in_memory() -> int:
    """Elements of every distinct parameter alive in this process."""
    import gc

    gc.collect()
    found = {id(obj.untyped_storage()): obj.numel() for obj in gc.get_objects() if isinstance(obj, torch.nn.Parameter)}
    return sum(found.values())


@pytest.mark.parametrize("lora", [True, False])
def test_the_kl_reference_under_lora_is_the_base_with_the_adapter_off_not_a_copy(tiny_dir, tmp_path, lora):
    from gearshift.training.batching import MicroBatch
    from gearshift.training.tokenization import collate, encode_trajectory
    from transformers import AutoModelForCausalLM

    from tests.libs.training.reference import target_logprobs

    base = AutoModelForCausalLM.from_pretrained(tiny_dir)
    base_parameters = sum(p.numel() for p in base.parameters())
    before = parameters_in_memory()
    cfg = config(tiny_dir, tmp_path / "out", kl_coef=0.1, model={"base": str(tiny_dir), "lora": lora, "lora_rank": 4})
    run = Run.start("apo", cfg)
    reference = run.frozen(cfg.reference or cfg.model.base)
    held = parameters_in_memory() - before
    if not lora:  # the control: a full fine-tune's reference is a second copy, and the count sees it
        assert reference.module is not None and held > 1.9 * base_parameters
        return
    assert reference.module is None and held < 1.1 * base_parameters  # one copy of the base, plus the adapters
    with torch.no_grad():
        for name, param in run.model.named_parameters():
            if "lora_B" in name:
                param.add_(0.05)  # the policy now differs from its base
    micro = MicroBatch([0], collate([encode_trajectory(run.tokenizer, forced_agentic(), 1024, True)], run.pad_id))
    expected = target_logprobs(base, micro.batch)
    assert torch.allclose(run.score(reference, micro).logprobs, expected, atol=1e-5)
    assert not torch.allclose(run.forward(micro).logprobs, expected, atol=1e-3)


@pytest.mark.parametrize("change, says", [
    ({"rollout": {"executor_addr": "127.0.0.1:1", "max_async_steps": 1, "temperature": 0.7}}, "temperature 1 and top_p 1"),
    ({"rollout": {"executor_addr": "127.0.0.1:1", "max_async_steps": 1, "top_p": 0.9}}, "temperature 1 and top_p 1"),
    ({"rollout": {"off_policy": {"mask_band": [2.0, 5.0]}}}, "0 < low <= 1 <= high"),
    ({"dual_clip": 0.5}, "dual_clip must be above 1"),
])
def test_off_policy_settings_that_would_mis_weight_tokens_are_refused(change, says):
    body = {"output": {"dir": "/tmp/unused"}, "prompts": [{"query": "q", "reference_answer": "a"}]}
    with pytest.raises(ValueError, match=says):
        APOConfig.model_validate(body | change)
