"""The demo's questions through the native protocol (policy_client.protocol: native) with the
real default policy on the built-in server, which renders the declared tools through the A^2FM
chat template and returns the A^2FM blocks the model writes as tool_calls and reasoning_content:
the same modes and verdicts as the text protocol (test_solve.check_the_demo), every turn keeping
the ids it sampled. Pending (skipped, saying why) until that template ships beside
gearshift.protocol.native_format and renders a native agentic request as the text protocol's
assistant turn: the routing head, then the plan, then the generation, under the A^2FM prompt
alone. Measured with the template as it first landed: instant answered Paris; the agentic turn
wrote a plan of its own after the closed plan turn and ran out of tokens; reasoning answered 20
(the text protocol: 14) under the A^2FM prompt with the native one appended."""

from __future__ import annotations

from pathlib import Path

import pytest
from gearshift import weights
from gearshift.api.common.v1.common_pb2 import Mode, Plan, PlanDecision, PlanStep, PolicyProtocol, Trajectory, Turn
from gearshift.protocol import native, native_format
from gearshift.protocol.modes import mode_name
from gearshift.services.policy_server.server import running
from gearshift.settings import PolicyServerSettings, Settings
from transformers import AutoTokenizer
from transformers.utils.chat_template_utils import render_jinja_template

from tests.e2e.test_solve import solve_the_demo

A2FM_TEMPLATE = Path(native_format.__file__).with_name("a2fm_chat_template.jinja")


def pending() -> str:
    """Why the demo cannot go natively as it goes in text yet ("" when it can): the template
    renders the first agentic request of a native episode, with its plan message."""
    if not A2FM_TEMPLATE.exists():
        return f"the A^2FM chat template {A2FM_TEMPLATE.name} has not landed"
    planned = Turn(index=0, plan_decision=PlanDecision.PLAN_DECISION_PLAN_NEW,
                   plan=Plan(steps=[PlanStep(state="need the product", action="run python", expected_outcome="it is known")]))
    first = Trajectory(query="What is 48213 * 7719?", mode=Mode.MODE_AGENTIC, protocol=PolicyProtocol.POLICY_PROTOCOL_NATIVE)
    (rendered,), _ = render_jinja_template([native.template_messages(native.messages(first, planned))], tools=native_format.DEFAULT_TOOLS,
                                           chat_template=A2FM_TEMPLATE.read_text(), add_generation_prompt=True, enable_thinking=True)
    turn = rendered.rsplit("<|im_start|>user", 1)[-1]
    if native.SYSTEM_PROMPT in rendered:
        return "the A^2FM template keeps the native system prompt after its own (the default policy then answers worse)"
    if turn.count("<|im_start|>assistant") != 1 or not 0 <= turn.find("toolcalling_agent") < turn.find("Plan:"):
        return "the A^2FM template renders the plan message as a turn of its own, not after the routing head of the turn under way"
    return ""


PENDING = pending()


@pytest.fixture
async def builtin_a2fm_default_policy():
    """The built-in server serving the default policy through the A^2FM chat template."""
    served = PolicyServerSettings(port=0, model=weights.DEFAULT, chat_template=str(A2FM_TEMPLATE))
    async with running(Settings(data_dir=Settings().data_dir, log_level="WARNING", policy_server=served)) as server:
        yield server.base_url


def check_sampled_ids(trajectories: list[Trajectory], tokenizer) -> None:
    """Each generation kept its ids, and they are what the engine split into the turn's fields."""
    for trajectory in trajectories:
        for turn in trajectory.turns:
            assert turn.token_ids, (trajectory.query, turn)
            said = tokenizer.decode(turn.token_ids, skip_special_tokens=False)
            assert turn.output.strip() in said and turn.reasoning_content.strip() in said, (said, turn)


@pytest.mark.skipif(bool(PENDING), reason=f"pending: {PENDING}")
@pytest.mark.model
async def test_the_demo_natively_on_the_builtin_server(settings, postgres_url, builtin_a2fm_default_policy, smollm2_dir):
    from gearshift.cli.platform import DEMO_QUESTIONS

    served = settings.with_policy(builtin_a2fm_default_policy)
    # Minutes per request on a CPU shared with other work: the default limits are serving's.
    client = served.policy_client.model_copy(update={"protocol": "native", "timeout_seconds": 900.0})
    executor = served.executor.model_copy(update={"max_wall_seconds": 1800.0})
    solved = await solve_the_demo(served.model_copy(update={"database_url": postgres_url, "policy_client": client, "executor": executor}))
    assert all(t.protocol == PolicyProtocol.POLICY_PROTOCOL_NATIVE for t in solved)
    outcome = [(mode_name(t.mode), t.reward.correct, t.reward.format_valid) for t in solved]
    assert outcome == [(mode, True, True) for _, _, mode in DEMO_QUESTIONS], [(t.answer, list(t.turns)) for t in solved]
    check_sampled_ids(solved, AutoTokenizer.from_pretrained(smollm2_dir))
