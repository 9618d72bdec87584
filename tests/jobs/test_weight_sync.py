"""New weights reach a running policy server during on-policy training, without a restart, and the
next rollout samples them: vLLM (real CPU servers, tests/vllm_servers.py) serves each step's LoRA
adapter under a new name while the old one goes, and reloads full weights in place; the built-in
server loads the saved checkpoint. Every check compares the server's greedy output with the trained
model's own (transformers, in this process)."""

from __future__ import annotations

import json

import pytest
import torch
from gearshift import weights
from gearshift.embedded import embedded
from gearshift.errors import FailedPrecondition, InvalidArgument
from gearshift.training import on_policy
from gearshift.jobs.apo.config import APOConfig
from gearshift.jobs.distill import trainer as distill
from gearshift.jobs.distill.config import DistillConfig
from gearshift.policy_client import BUILTIN, VLLM, PolicyClient, newest_version, versioned
from gearshift.services.policy_server.server import running
from gearshift.settings import ExecutorSettings, PolicyServerSettings, Settings
from gearshift.training.runtime import Run

ALIAS = on_policy.SERVED_NAME  # what the stack's policy clients ask for while a LoRA run trains
PROMPT = "The capital of France is"
# Long enough to fill vLLM's prefix-cache blocks: a reload that kept them would answer from stale KV.
LONG_PROMPT = " ".join(["The history of the city goes back many centuries and"] * 40) + " " + PROMPT
NOT_CALLED = "127.0.0.1:9"  # an executor address for tests that only publish (no episode runs)


def apo_config(out, base, policy_url: str, lora: bool) -> APOConfig:
    return APOConfig.model_validate({
        "model": {"base": str(base), "lora": lora},
        "optim": {"max_steps": 2},  # threads: OMP_NUM_THREADS, the worker's share (tests/workers.py)
        "output": {"dir": str(out), "progress": False},
        "prompts": [{"query": "q", "reference_answer": "a"}],
        "rollout": {"executor_addr": NOT_CALLED, "policy_url": policy_url},
    })


def update(run: Run, seed: int, scale: float) -> None:
    """A change of the trained weights (the adapters under LoRA) big enough to change greedy output."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in run.model.named_parameters():
            if param.requires_grad and ("lora_B" in name or "mlp" in name):
                param.add_(scale * torch.randn(param.shape, generator=generator))


def teach(run: Run, answer: str, steps: int = 8) -> None:
    """Trains the trained weights (the adapter) at a high rate until PROMPT's greedy continuation
    starts with answer: an update that changes greedy output for sure, to one the model is sure of."""
    ids = run.tokenizer(PROMPT + answer, return_tensors="pt").input_ids
    labels = ids.clone()
    labels[:, : len(run.tokenizer(PROMPT).input_ids)] = -100
    optimizer = torch.optim.AdamW([param for param in run.model.parameters() if param.requires_grad], lr=1e-3)
    for _ in range(steps):
        run.model(input_ids=ids, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def own_greedy(run: Run, prompt: str, tokens: int) -> str:
    """The trained model's greedy continuation, generated here."""
    ids = run.tokenizer(prompt, return_tensors="pt").input_ids
    run.model.eval()
    with torch.no_grad():
        out = run.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens, do_sample=False)
    run.model.train()
    return run.tokenizer.decode(out[0, ids.shape[1]:])


async def served_greedy(policy: PolicyClient, prompt: str, tokens: int) -> str:
    return (await policy.complete(prompt, max_tokens=tokens)).text


def test_an_alias_names_its_newest_version():
    names = ["smollm2", "default", "policy-in-training@9", "policy-in-training@10", "policy-in-training@x", "policy@11"]
    assert newest_version("policy-in-training", names) == "policy-in-training@10"  # by number, not by text
    assert newest_version("policy", names) == "policy@11" and newest_version("smollm2", names) is None


@pytest.mark.model
@pytest.mark.vllm
async def test_each_update_reaches_vllm_as_a_new_adapter_and_the_old_name_goes(vllm_servers, tmp_path, monkeypatch):
    url = vllm_servers[0]
    monkeypatch.setenv("GEARSHIFT_POLICY_CLIENT__MODEL", ALIAS)
    run = Run.start("apo", apo_config(tmp_path / "out", "smollm2", url, lora=True))
    async with on_policy.rollout_services(run, run.config.rollout, "") as rollouts, PolicyClient(url, ALIAS) as policy:
        assert rollouts.remote.adapters and await policy.engine() == VLLM
        texts = [await served_greedy(policy, PROMPT, 8)]  # the start: the adapter as initialised (zero)
        assert policy.served_model == versioned(ALIAS, 0) and texts[0] == own_greedy(run, PROMPT, 8)
        for step, answer in ((1, " Berlin. Berlin is a city"), (2, " Rome. Rome is a city")):
            teach(run, answer)
            await rollouts.publish(step)
            texts.append(await served_greedy(policy, PROMPT, 8))  # the same client, following the alias
            assert policy.served_model == versioned(ALIAS, step)
            assert texts[-1] == own_greedy(run, PROMPT, 8) and texts[-1].startswith(answer)
        assert [name for name in await policy.models() if name.startswith(ALIAS)] == [versioned(ALIAS, 2)]
        async with PolicyClient(url, versioned(ALIAS, 1)) as old:
            with pytest.raises(InvalidArgument, match="does not exist"):
                await old.complete(PROMPT, max_tokens=2)
    assert [path.name for path in (run.output / on_policy.SERVING_DIR).iterdir()] == ["adapter-step-00000002"]


@pytest.mark.model
@pytest.mark.vllm
async def test_full_weights_reach_vllm_in_place_and_its_cached_prefixes_go(vllm_servers, tmp_path):
    url = vllm_servers[1]  # the other server: its base weights change here, and are put back at the end
    run = Run.start("apo", apo_config(tmp_path / "out", "smollm2", url, lora=False))
    async with on_policy.rollout_services(run, run.config.rollout, "") as rollouts, PolicyClient(url, "smollm2") as policy:
        assert not rollouts.remote.adapters
        try:
            before = await served_greedy(policy, LONG_PROMPT, 8)  # its prefix is cached now
            update(run, seed=1, scale=0.02)
            await rollouts.publish(1)
            after = await served_greedy(policy, LONG_PROMPT, 8)
            assert after != before and after == own_greedy(run, LONG_PROMPT, 8)
        finally:
            await policy.switch_weights(str(weights.cache_smollm2(Settings().models_dir)))
        assert await served_greedy(policy, LONG_PROMPT, 8) == before


@pytest.mark.model
@pytest.mark.vllm
async def test_vllm_counts_the_workers_of_its_weight_transfer_group(vllm_servers):
    """rollout.weight_transfer nccl sizes vLLM's NCCL group (the trainer's rank 0 and every worker)
    from /server_info; the transfer itself needs GPUs (weight_transfer.py, test_weight_stream.py)."""
    async with PolicyClient(vllm_servers[1], "smollm2") as policy:
        assert await policy.vllm_workers() == 1


@pytest.mark.parametrize("lora", [False, True])
async def test_the_builtin_server_loads_each_updates_checkpoint(tiny_dir, tmp_path, lora):
    settings = Settings(data_dir=tmp_path, log_level="WARNING", policy_server=PolicyServerSettings(port=0, model=str(tiny_dir)))
    async with running(settings) as server, PolicyClient(server.base_url, "smollm2") as policy:
        run = Run.start("apo", apo_config(tmp_path / "out", tiny_dir, server.base_url, lora))
        async with on_policy.rollout_services(run, run.config.rollout, "") as rollouts:
            assert not rollouts.remote.adapters and await policy.engine() == BUILTIN
            before = await served_greedy(policy, PROMPT, 8)
            update(run, seed=1, scale=0.5)
            await rollouts.publish(1)
            after = await served_greedy(policy, PROMPT, 8)
            assert after != before and after == own_greedy(run, PROMPT, 8)


@pytest.mark.model
@pytest.mark.vllm
async def test_a_lora_run_refuses_an_alias_vllm_serves_itself(vllm_servers, tmp_path, monkeypatch):
    monkeypatch.setenv("GEARSHIFT_POLICY_CLIENT__MODEL", "smollm2")  # vLLM's base model: clients would never reach the adapter
    run = Run.start("apo", apo_config(tmp_path / "out", "smollm2", vllm_servers[0], lora=True))
    with pytest.raises(FailedPrecondition, match="GEARSHIFT_POLICY_CLIENT__MODEL=policy-in-training"):
        async with on_policy.rollout_services(run, run.config.rollout, ""):
            pass


@pytest.mark.model
@pytest.mark.vllm
async def test_a_distillation_job_trains_on_episodes_of_a_remote_executor_whose_vllm_follows_it(vllm_servers, tmp_path, monkeypatch):
    """The job end to end: its starting adapter and each update's reach vLLM, and the remote stack's
    episodes (executor and services with policy_client.model the alias) sample the newest one."""
    url = vllm_servers[0]
    monkeypatch.setenv("GEARSHIFT_POLICY_CLIENT__MODEL", ALIAS)
    stack = Settings(data_dir=tmp_path / "stack", log_level="WARNING", metrics_port=0).with_policy(url, model=ALIAS)
    stack = stack.model_copy(update={"executor": ExecutorSettings(max_tokens_per_turn=24, max_steps_other=1)})
    async with embedded(stack) as platform:
        config = DistillConfig.model_validate({
            "model": {"base": "smollm2", "lora": True},
            "optim": {"max_steps": 2, "learning_rate": 1e-3},
            "output": {"dir": str(tmp_path / "out"), "progress": False},
            "prompts": [{"query": "What is the capital of France?", "mode": "instant"}],
            "default_teacher": "smollm2",  # the student's own base: under LoRA the student with its adapter off
            "batch_size": 1,
            "rollout": {"executor_addr": platform.settings.executor_addr, "policy_url": url, "temperature": 1.0},
        })
        await distill.train_async(config)
        async with PolicyClient(url, ALIAS) as policy:
            assert [name for name in await policy.models() if name.startswith(ALIAS)] == [versioned(ALIAS, 2)]
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert record["updated"] and record["sampled_tokens"] > 0  # step 2's episode ran after version 0 was unloaded
        assert 0 < record["sync_seconds"] < record["seconds"] and 0 < record["rollout_seconds"] < record["seconds"]
