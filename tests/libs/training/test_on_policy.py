"""Where on-policy episodes come from: after an update the policy that samples them carries the new
weights, whether it is the trained module itself or a copy of it, and the built-in server does not
reuse prompts it cached with the old ones."""

from __future__ import annotations

import pytest
import torch
from gearshift.jobs.apo.config import APOConfig
from gearshift.policy_client import PolicyClient
from gearshift.training import on_policy
from gearshift.training.runtime import Run

PROMPT = "Once upon a time, in a land far away, there lived a"


@pytest.fixture(autouse=True)
def isolated_data_dir(tmp_path, monkeypatch):
    """The run and its stack read Settings(): their data dir (SQLite store, model cache) in tmp."""
    monkeypatch.setenv("GEARSHIFT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("GEARSHIFT_METRICS_PORT", "0")


def config(tiny_dir, out) -> APOConfig:
    return APOConfig.model_validate({
        "model": {"base": str(tiny_dir)},
        "optim": {"max_steps": 1, "threads": 1},
        "output": {"dir": str(out), "progress": False},
        "prompts": [{"query": "q", "reference_answer": "a"}],
    })


def update(run: Run) -> None:
    """A change of the weights in place, as an optimizer step makes one."""
    with torch.no_grad():
        for param in run.model.parameters():
            param.add_(0.05 * torch.randn_like(param))


async def completion(settings) -> str:
    async with PolicyClient.from_settings(settings) as policy:
        return (await policy.complete(PROMPT, max_tokens=8)).text


@pytest.mark.parametrize("copied", [False, True])
async def test_after_an_update_episodes_sample_the_new_weights(tiny_dir, tmp_path, monkeypatch, copied):
    run = Run.start("apo", config(tiny_dir, tmp_path / "out"))
    if copied:  # as on a GPU or under FSDP, where the built-in server cannot use the module itself
        monkeypatch.setattr(on_policy, "serves_itself", lambda run: False)
    async with on_policy.rollout_services(run, run.config.rollout, "") as rollouts:
        assert (rollouts.copy is not None) == copied
        cache = rollouts.server.engine.scheduler.prefix_cache
        before = await completion(rollouts.settings)
        assert await completion(rollouts.settings) == before and cache.stats.hits == 1  # the prompt was cached
        update(run)
        await rollouts.publish()
        after = await completion(rollouts.settings)
        assert cache.stats.hits == 1  # nothing cached with the old weights was reused
        assert after != before
        if copied:
            trained = run.model.state_dict()
            assert all(torch.equal(value, trained[name]) for name, value in rollouts.copy.state_dict().items())
