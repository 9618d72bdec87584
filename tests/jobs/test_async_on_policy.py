"""On-policy rollouts from an inference fleet (issue 49): the trajectories keep the log-probability
of every sampled token under the policy that sampled it (the behaviour policy), and every rank of
a torchrun job rolls out its own groups through one executor, generating step n+1's while step n
trains, at most rollout.max_async_steps updates stale, with those log-probabilities weighting
APO's decoupled loss (issue 59)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch
from gearshift.embedded import embedded
from gearshift.errors import GearshiftError
from gearshift.training import on_policy
from gearshift.jobs.apo.config import APOConfig
from gearshift.jobs.apo.rollouts import collect
from gearshift.policy_client import VERSION_MARK, PolicyClient, versioned
from gearshift.settings import ExecutorSettings, PlannerSettings, Settings
from gearshift.training import tokenization
from gearshift.training.results import read_metrics
from gearshift.training.runtime import Run

from tests import workers


def apo_config(base, out, **extra) -> APOConfig:
    body = {
        "model": {"base": str(base)},
        "optim": {"max_steps": 1},  # threads: OMP_NUM_THREADS, the worker's share (tests/workers.py)
        "output": {"dir": str(out), "progress": False},
        "prompts": [{"query": "What is 2+2?", "reference_answer": "4"}],
        "rho": 1,
        "gamma": 1,
        "rollout": {"max_tokens_per_turn": 12, "max_steps": 1},
    }
    return APOConfig.model_validate(body | extra)


def model_logprobs(run: Run, encoded: tokenization.Encoded) -> list[float]:
    """The log-probability of each target token under the run's model, computed here."""
    ids = torch.tensor([encoded.input_ids])
    with torch.no_grad():
        logits = run.model(input_ids=ids).logits[0].float()
    logp = torch.log_softmax(logits[:-1], dim=-1).gather(1, ids[0, 1:, None])[:, 0]
    return [float(value) for value, learned in zip(logp, encoded.target[1:]) if learned]


async def test_rollouts_keep_each_sampled_tokens_logprob_under_the_policy_that_sampled_it(tiny_dir, tmp_path):
    """The built-in server samples with the very module trained (in process): each kept
    log-probability is the one the model gives that token in the context training rebuilds."""
    config = apo_config(tiny_dir, tmp_path / "out", rollout={"max_tokens_per_turn": 12, "max_steps": 1, "temperature": 1.0})
    run = Run.start("apo", config)
    async with on_policy.rollout_services(run, config.rollout, "") as rollouts:
        stack = rollouts.settings
        groups = await collect(stack, stack.executor_addr, stack.reward_addr, config.prompts, config, "behaviour", 1)
    trajectories = [t for group in groups for t in group.rollouts]
    spans = [span for t in trajectories for turn in t.turns for span in turn.sampled]
    assert spans and all(len(span.logprobs) == len(span.token_ids) > 0 for span in spans)
    assert all(value <= 0 for span in spans for value in span.logprobs)
    for trajectory in trajectories:
        encoded = tokenization.encode_trajectory(run.tokenizer, trajectory, exact=True, end_of_turn=False)
        kept = encoded.target_behaviour()
        assert len(kept) == encoded.target_count > 0 and not any(math.isnan(v) for v in kept)
        assert max(abs(a - b) for a, b in zip(kept, model_logprobs(run, encoded))) < 1e-4


@pytest.mark.ranks
async def test_distillation_ranks_roll_out_their_own_episodes_ahead_of_training(tiny_dir, teacher_dir, tmp_path, monkeypatch):
    """Distillation under torchrun against a running stack whose built-in server serves the tiny
    student and loads each step's checkpoint (POST /v1/load): each rank rolls out its half of the
    step's prompts, the next step's while this one trains, one update stale at most."""
    stack = Settings(data_dir=tmp_path / "stack", log_level="WARNING", metrics_port=0)
    stack = stack.model_copy(update={"executor": ExecutorSettings(max_tokens_per_turn=8, max_steps_other=1, max_steps_agentic=1)})
    async with embedded(stack, policy_model=str(tiny_dir)) as platform:
        monkeypatch.setenv("GEARSHIFT_POLICY_CLIENT__MODEL", platform.settings.policy_client.model)
        config = {
            "model": {"base": str(tiny_dir)},
            "optim": {"learning_rate": 1e-3, "max_steps": 3, "seed": 3, "threads": 1},
            # The checkpoint id fixes the rollout ids and so the seeds: the random student's samples,
            # which now and then held no learnable token under a fresh id each run.
            "output": {"dir": str(tmp_path / "out"), "progress": False, "checkpoint_id": "distill-ahead"},
            "prompts": [{"query": f"What is {a}*{b}?", "mode": "instant"} for a, b in ((12, 34), (7, 8), (5, 6), (81, 27))],
            "default_teacher": str(teacher_dir),
            "batch_size": 4,
            "rollout": {"executor_addr": platform.settings.executor_addr, "policy_url": platform.settings.policy_client.url,
                        "max_async_steps": 1},
        }
        records = await train_on_two_ranks(config, tmp_path / "run", job="distill")
    assert [r["staleness"] for r in records] == [0, 1, 1]
    # Every rank learns its token-balanced share of every rank's episodes.
    assert all(r["updated"] and sum(r["episodes_per_rank"]) == 4 and min(r["episodes_per_rank"]) >= 1 for r in records), records
    assert all(sum(r["tokens_per_rank"]) == r["tokens"] and r["failed_episodes"] == 0 for r in records), records
    for before, after in zip(records, records[1:]):
        assert after["generation_started"] < before["training_ended"] and after["generation_ended"] > before["training_started"]
    assert len(json.loads((tmp_path / "out" / "result.json").read_text())["trajectory_ids"]) == 12  # every rank's, once
    # The sampler's log-probabilities reached the loss: the mismatch and masked share are logged each step.
    assert all(r["behaviour_tokens"] > 0 and 0 <= r["masked_fraction"] < 0.5 and r["mismatch_kl"] >= 0 for r in records), records


# --- Against a real vLLM CPU server (tests/vllm_servers.py), two trainer ranks under torchrun ---

ALIAS = on_policy.SERVED_NAME  # what the stack's policy clients ask for while the LoRA run trains
PROBE = "Once upon a time, in a small village by the sea, there lived"
ROOT = Path(__file__).parents[2]
PROMPTS = [
    {"query": "What is the capital of France?", "reference_answer": "Paris"},
    {"query": "What is the capital of Italy?", "reference_answer": "Rome"},
]


def fleet_config(out: Path, executor_addr: str, url: str, max_steps: int, max_async: int) -> dict:
    """LoRA APO on SmolLM2, a prompt per rank a step, one forced rollout per mode (SR2AM's tiered
    reward: a group's rewards seldom tie), a rate that moves greedy output in one step. The
    checkpoint id fixes the rollout ids (and seeds): a second run replays the first's stored
    rollouts of the steps they share."""
    return {
        "model": {"base": "smollm2", "lora": True},
        "optim": {"learning_rate": 5e-3, "max_steps": max_steps, "seed": 1},
        "output": {"dir": str(out), "checkpoint_id": "async-on-policy", "progress": False, "merged_weights": False},
        "prompts": PROMPTS,
        "prompts_per_step": 2,
        "rho": 1,
        "gamma": 0,
        "reward": "sr2am",
        "rollout": {"executor_addr": executor_addr, "policy_url": url, "temperature": 1.0, "max_async_steps": max_async},
    }


async def train_on_two_ranks(config: dict, folder: Path, job: str = "apo", ranks: int = 2) -> list[dict]:
    """`gearshift train JOB` under torchrun (2 ranks, gloo; 1: a plain process), awaited so this
    loop keeps serving the stack the job rolls out through; the job's metrics.jsonl records."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, workers.threads_per_worker() // ranks)), "PYTHONPATH": str(ROOT)}
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"] if ranks > 1 else []
    process = await asyncio.create_subprocess_exec(
        sys.executable, *launcher, "-m", "gearshift.cli", "train", job,
        "--config", str(folder / "config.json"), cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    output, _ = await asyncio.wait_for(process.communicate(), timeout=900)
    (folder / "output.txt").write_bytes(output)
    assert process.returncode == 0, output.decode()[-4000:]
    return read_metrics(Path(config["output"]["dir"]))


async def watch_greedy(url: str, seen: list[tuple[str, str]], stop: asyncio.Event) -> None:
    """The server's greedy continuation of PROBE under the alias's newest version, about once a
    second, each (version, text) once it changes; nothing while no version is served yet."""
    async with PolicyClient(url, ALIAS, retries=0, timeout=20) as policy:  # a request on a version unloaded meanwhile may hang
        while not stop.is_set():
            with contextlib.suppress(GearshiftError):
                text = (await policy.complete(PROBE, max_tokens=8)).text
                if not seen or seen[-1] != (policy.served_model, text):
                    seen.append((policy.served_model, text))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=1.0)


async def greedy_of_each_sync(url: str, serving: Path) -> list[str]:
    """The server's greedy continuation of PROBE under the run's starting weights (the base: LoRA
    starts at zero) and under the adapter of each sync (kept on disk for max_async_steps versions),
    each loaded for the question: what the fleet generated with after each sync, asked without
    racing the run."""
    async with PolicyClient(url, "smollm2") as base:
        texts = [(await base.complete(PROBE, max_tokens=8)).text]
    for step in (1, 2):
        name = f"probe-step-{step}"
        async with PolicyClient(url, name) as client:
            await client.load_lora_adapter(name, str((serving / f"{on_policy.ADAPTER_PREFIX}{step:08d}").resolve()))
            texts.append((await client.complete(PROBE, max_tokens=8)).text)
            await client.unload_lora_adapter(name)
    return texts


async def check_async_rollouts_from_a_fleet(url: str, tmp_path: Path, monkeypatch) -> None:
    stack = Settings(data_dir=tmp_path / "stack", log_level="WARNING", metrics_port=0).with_policy(url, model=ALIAS)
    stack = stack.model_copy(update={  # a few tokens per model call: each episode is one short turn
        "executor": ExecutorSettings(max_tokens_per_turn=8, max_steps_other=1, max_steps_agentic=1),
        "planner": PlannerSettings(max_tokens=16),
    })
    async with embedded(stack) as platform:
        monkeypatch.setenv("GEARSHIFT_POLICY_CLIENT__MODEL", ALIAS)  # the jobs' alias, named as the stack names it
        monkeypatch.setenv("GEARSHIFT_REWARD_ADDR", platform.settings.reward_addr)
        executor = platform.settings.executor_addr
        # The synchronous path, one process (its memory goes with it: beside two vLLM servers, the
        # machine has no room for a model trained in this one).
        synchronous = await train_on_two_ranks(fleet_config(tmp_path / "sync", executor, url, 1, 0), tmp_path / "sync-run",
                                               ranks=1)
        seen: list[tuple[str, str]] = []
        stop = asyncio.Event()
        watcher = asyncio.create_task(watch_greedy(url, seen, stop))
        try:
            records = await train_on_two_ranks(fleet_config(tmp_path / "async", executor, url, 2, 1), tmp_path / "async-run")
        finally:
            stop.set()
            await watcher
        # The last sync came just before the job ended, where the watcher may not have asked yet.
        if not seen or seen[-1][0] != versioned(ALIAS, 2):
            async with PolicyClient(url, versioned(ALIAS, 2)) as last:
                seen.append((versioned(ALIAS, 2), (await last.complete(PROBE, max_tokens=8)).text))
        greedy = await greedy_of_each_sync(url, tmp_path / "async" / on_policy.SERVING_DIR)
    assert [r["step"] for r in records] == [1, 2]
    # Staleness within the bound, and used: step 2's batch was generated while step 1 trained,
    # with the weights step 1 started from.
    assert [r["staleness"] for r in records] == [0, 1] and [r["policy_version"] for r in records] == [0, 0]
    first, second = records
    assert second["generation_started"] < first["training_ended"] and second["generation_ended"] > first["training_started"]
    # Every rank rolled out its own prompt's group (3 rollouts each), and learned its token-balanced
    # share of both groups' rollouts.
    assert all(r["rollouts"] == 6 and r["failed_episodes"] == 0 for r in records)
    assert all(r["updated"] and sum(r["rollouts_per_rank"]) == 6 and sum(r["tokens_per_rank"]) == r["tokens"] for r in records), records
    assert all(max(r["tokens_per_rank"]) < r["tokens"] for r in records), records  # both ranks learned
    # Each sync changed the server's greedy output, and clients followed the alias to each newer
    # version of this run, never back (a busy server may answer the watcher too late to see each).
    assert len(set(greedy)) == 3, greedy
    versions = [int(version.rsplit(VERSION_MARK, 1)[1]) for version, _ in seen]
    ours = versions[versions.index(0):] if 0 in versions else versions[-1:]  # from this run's first
    assert ours == sorted(set(ours)) and ours[-1] == 2, seen
    # At staleness 0 (step 1: the batch the synchronous run trained on, replayed from the store),
    # weighted by the sampler's log-probabilities as the synchronous run was, the update is the synchronous one.
    alone = synchronous[0]
    assert first["rewards"] == alone["rewards"] and first["target_tokens"] == alone["target_tokens"]
    assert first["grad_norm"] == pytest.approx(alone["grad_norm"], rel=1e-3)
    assert first["loss"] == pytest.approx(alone["loss"], abs=1e-4)
    # Both paths weigh every token by the trainer's over vLLM's log-probability (the synchronous one
    # too: vLLM's kernels are not the trainer's), and log how far apart they are, and what was masked.
    # At staleness 0 only the kernels differ: a small mismatch, nothing masked.
    for record in (alone, first):
        assert 0 < record["behaviour_tokens"] <= record["target_tokens"] and 0 < record["mismatch_kl"] < 0.05, record
        assert record["masked_fraction"] == 0 and record["truncated_fraction"] < 0.05, record
    # Step 2's batch was sampled before step 1's update, which moved the greedy output: the mismatch
    # is that update's, and the tokens it moved furthest are truncated or masked, not amplified.
    assert 0 < second["behaviour_tokens"] <= second["target_tokens"] and second["mismatch_kl"] > 10 * first["mismatch_kl"], second
    assert second["masked_fraction"] + second["truncated_fraction"] > 0, second


@pytest.mark.model
@pytest.mark.vllm
@pytest.mark.timeout(900)  # two SmolLM2 runs (one under torchrun) beside the vLLM server: 3-6 minutes on 2 busy cores
async def test_two_ranks_roll_out_through_a_fleet_ahead_of_training_within_the_staleness_bound(vllm_servers, tmp_path, monkeypatch):
    await check_async_rollouts_from_a_fleet(vllm_servers[0], tmp_path, monkeypatch)
