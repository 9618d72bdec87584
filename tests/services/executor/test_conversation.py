"""Conversations: the client's instructions and earlier turns reach every model call of an
episode (routing, the configurator, the planner, each generation) after the platform's prompt,
the trajectory stores them, and training renders the prompt the policy was served."""

from __future__ import annotations

import grpc
import pytest
from gearshift.api.common.v1.common_pb2 import ChatMessage, ChatRole, Conversation, Mode, TrajectoryStatus
from gearshift.api.executor.v1 import executor_pb2, executor_pb2_grpc
from gearshift.clients import channel
from gearshift.protocol import prompts
from gearshift.training import tokenization
from gearshift.training.tiny import tiny_checkpoint
from transformers import AutoTokenizer

from tests.services.executor.test_episode import solve, stored

INSTRUCTIONS = "Answer as a pirate would."
CONVERSATION = Conversation(instructions=INSTRUCTIONS, messages=[
    ChatMessage(role=ChatRole.CHAT_ROLE_USER, content="What is 2+2?"),
    ChatMessage(role=ChatRole.CHAT_ROLE_ASSISTANT, content="4, matey."),
])
QUERY = "And what is 17*23?"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """The default policy's tokenizer (SmolLM2's), from a tiny checkpoint that ships it."""
    return AutoTokenizer.from_pretrained(tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "tiny"), local_files_only=True)


async def test_every_model_call_sees_the_conversation_after_the_platform_prompt(recorded):
    stack, bodies = recorded
    events = await solve(stack, query=QUERY, conversation=CONVERSATION)
    trajectory = events[-1].final.trajectory
    assert trajectory.mode == Mode.MODE_AGENTIC and trajectory.status == TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED
    routing, regulate, plan = bodies[0], bodies[1], bodies[2]
    assert "</classification>" in routing["stop"] and regulate["messages"][-1]["content"].endswith("Plan:")
    assert "Current State:" in plan["messages"][-1]["content"]
    assert len(bodies) >= 4  # and the generations after them
    for body in bodies:
        system, *earlier = body["messages"][:4]
        assert system == {"role": "system", "content": f"{prompts.SYSTEM_PROMPT}\n\n{INSTRUCTIONS}"}
        assert earlier == [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4, matey."},
                           {"role": "user", "content": QUERY}]
    assert (await stored(stack, trajectory.id)).conversation == CONVERSATION


async def test_training_renders_the_prompt_the_policy_was_served(recorded, tokenizer):
    stack, bodies = recorded
    events = await solve(stack, query=QUERY, conversation=CONVERSATION, mode=Mode.MODE_REASONING)
    trajectory = await stored(stack, events[-1].final.trajectory.id)
    served = tokenizer.apply_chat_template(bodies[-1]["messages"], tokenize=False, continue_final_message=True)
    encoded = tokenization.encode_trajectory(tokenizer, trajectory)
    trained = tokenizer.decode(encoded.input_ids)
    assert trained.startswith(served)  # the last call's prompt and transcript, conversation included
    assert INSTRUCTIONS in trained and "4, matey." in trained
    prompt_ids = tokenizer(tokenization.prompt_text(tokenizer, QUERY, CONVERSATION), add_special_tokens=False)["input_ids"]
    assert encoded.input_ids[:len(prompt_ids)] == prompt_ids and not any(encoded.target[:len(prompt_ids)])


@pytest.mark.parametrize("conversation, message", [
    (Conversation(messages=[ChatMessage(content="no role")]), "role must be USER or ASSISTANT"),
    (Conversation(instructions="x" * 300_000), "conversation longer than"),
])
async def test_a_bad_conversation_is_invalid_argument(recorded, conversation, message):
    stack, _ = recorded
    async with channel(stack.executor_addr, stack) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in executor_pb2_grpc.ExecutorStub(ch).Solve(executor_pb2.SolveRequest(query=QUERY, conversation=conversation)):
                pass
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in caught.value.details()
