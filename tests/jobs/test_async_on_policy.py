"""On-policy rollouts from an inference fleet (issue 49): the trajectories keep the log-probability
of every sampled token under the policy that sampled it (the behaviour policy), and every rank of
a torchrun job rolls out its own groups through one executor, generating step n+1's while step n
trains, at most rollout.max_async_steps updates stale, with those log-probabilities as the old
policy of APO's ratio."""

from __future__ import annotations

import math

import torch
from gearshift.jobs import on_policy
from gearshift.jobs.apo.config import APOConfig
from gearshift.jobs.apo.rollouts import collect
from gearshift.training import tokenization
from gearshift.training.runtime import Run


def apo_config(base, out, **extra) -> APOConfig:
    body = {
        "model": {"base": str(base)},
        "optim": {"max_steps": 1, "threads": 2},
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
        assert kept is not None and len(kept) == encoded.target_count > 0 and not any(math.isnan(v) for v in kept)
        assert max(abs(a - b) for a, b in zip(kept, model_logprobs(run, encoded))) < 1e-4
