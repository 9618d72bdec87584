"""The demo's questions through the native protocol (policy_client.protocol: native) with the
real default policy, on both engines: the built-in server and vLLM's CPU build, each rendering the
declared tools through the A^2FM chat template and returning the A^2FM blocks the model writes as
tool_calls and reasoning_content (the built-in server's parser; vLLM's a2fm plugins). The same
modes and verdicts as the text protocol (test_solve.check_the_demo), every generation keeping the
ids it sampled."""

from __future__ import annotations

import pytest
from gearshift import vllm_plugins, weights
from gearshift.api.common.v1.common_pb2 import PolicyProtocol, Trajectory
from gearshift.protocol.modes import mode_name
from transformers import AutoTokenizer

from tests.e2e.test_solve import solve_the_demo


async def check_the_demo_natively(settings, postgres_url, smollm2_dir, chat_template: str | None = None) -> None:
    from gearshift.cli.platform import DEMO_QUESTIONS

    # Minutes per request on a CPU shared with other work: the default limits are serving's.
    client = settings.policy_client.model_copy(update={"protocol": "native", "chat_template": chat_template, "timeout_seconds": 900.0})
    executor = settings.executor.model_copy(update={"max_wall_seconds": 1800.0})
    solved = await solve_the_demo(settings.model_copy(update={"database_url": postgres_url, "policy_client": client, "executor": executor}))
    assert all(t.protocol == PolicyProtocol.POLICY_PROTOCOL_NATIVE for t in solved)
    outcome = [(mode_name(t.mode), t.reward.correct, t.reward.format_valid) for t in solved]
    assert outcome == [(mode, True, True) for _, _, mode in DEMO_QUESTIONS], [described(t) for t in solved]
    check_sampled_ids(solved, AutoTokenizer.from_pretrained(smollm2_dir))


def described(trajectory: Trajectory) -> tuple:
    """A trajectory in brief, for a failure message: its answer and each turn's fields."""
    turns = [(turn.plan_decision, turn.reasoning_content, turn.output, [call.arguments_json for call in turn.tool_calls],
              [result.output or result.error for result in turn.tool_results]) for turn in trajectory.turns]
    return trajectory.answer, turns


def check_sampled_ids(trajectories: list[Trajectory], tokenizer) -> None:
    """Each generation kept its ids, and they are what the engine split into the turn's fields."""
    for trajectory in trajectories:
        for turn in trajectory.turns:
            assert turn.token_ids, (trajectory.query, turn)
            said = tokenizer.decode(turn.token_ids, skip_special_tokens=False)
            assert turn.output.strip() in said and turn.reasoning_content.strip() in said, (said, turn)


@pytest.mark.model
async def test_the_demo_natively_on_the_builtin_server(settings, postgres_url, builtin_default_policy, smollm2_dir):
    # The default policy's requests that declare tools or set enable_thinking get the A^2FM template.
    await check_the_demo_natively(settings.with_policy(builtin_default_policy), postgres_url, smollm2_dir)


@pytest.mark.model
@pytest.mark.vllm
@pytest.mark.timeout(600)  # the session's vLLM servers may start in its set-up (100 s on a busy machine)
async def test_the_demo_natively_on_vllm(settings, postgres_url, vllm_policy, smollm2_dir):
    # The shared servers keep SmolLM2's template for the text protocol; native requests name A^2FM's.
    served = settings.with_policy(vllm_policy, model=weights.DEFAULT)
    await check_the_demo_natively(served, postgres_url, smollm2_dir, chat_template=vllm_plugins.A2FM_TEMPLATE_SETTING)
