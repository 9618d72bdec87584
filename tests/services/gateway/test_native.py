"""The gateway in front of an executor speaking the native protocol (policy_client.protocol:
native), where the engine's parsers split content from reasoning_content: the answer and the
reasoning reach the client as the engine returned them, streamed or whole, and match the stored
trajectory. The model is the ScriptedPolicy stand-in answering in the chat shape of an engine's
parsers (tests/e2e and test_gateway.py run the text protocol with the real model)."""

from __future__ import annotations

import openai
import pytest
from gearshift.api.common.v1.common_pb2 import PolicyProtocol, TrajectoryStatus
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.clients import channel
from gearshift.embedded import embedded
from gearshift.settings import Settings
from gearshift.testing.scripted_policy import serve_scripted

QUESTION = "What is 2 + 2?"
SEARCH = [{"name": "web_search", "arguments": {"query": "2 + 2"}}]


def native_model(body: dict) -> str | dict:
    """Instant answers at once, reasoning thinks first, agentic searches once and then answers."""
    if "prompt" in body:  # the configurator continuing the policy's own "Plan:": act, no plan
        return " None"
    messages = body["messages"]
    if "</classification>" in (body.get("stop") or []):
        return "A sum.\n<classification>\ndefault_agent\n</classification>"
    if not body.get("tools"):
        if body["chat_template_kwargs"]["enable_thinking"]:
            return {"reasoning_content": "Two and two make four.", "content": " 4 "}
        return {"content": "4"}
    if any(message["role"] == "tool" for message in messages):  # the turn opens with its plan block: look past it
        return {"reasoning_content": "The search agrees.", "content": "4"}
    return {"reasoning_content": "I will look it up.", "tool_calls": SEARCH}


@pytest.fixture(scope="module")
async def native_gateway(postgres_url, tmp_path_factory):
    async with serve_scripted(native_model) as policy_url:
        settings = Settings(data_dir=tmp_path_factory.mktemp("native"), metrics_port=0, log_level="WARNING", database_url=postgres_url)
        settings = settings.with_policy(policy_url)
        settings = settings.model_copy(update={"policy_client": settings.policy_client.model_copy(update={"protocol": "native"})})
        async with embedded(settings) as platform, channel(platform.settings.store_addr, platform.settings) as ch:
            async with openai.AsyncOpenAI(base_url=f"http://{platform.settings.gateway_addr}/v1", api_key="unused", max_retries=0) as client:
                yield client, store_pb2_grpc.TrajectoryStoreStub(ch)


EXPECTED = {  # model -> (content, reasoning_content)
    "gearshift": ("4", None),  # routed to instant
    "gearshift-instant": ("4", None),
    "gearshift-reasoning": ("4", "Two and two make four."),
    "gearshift-agentic": ("4", "I will look it up.\n\nThe search agrees."),
}


@pytest.mark.parametrize("model", list(EXPECTED))
async def test_native_answers_and_reasoning_whole_and_streamed(native_gateway, model):
    client, store = native_gateway
    content, reasoning = EXPECTED[model]
    raw = await client.chat.completions.with_raw_response.create(model=model, messages=[{"role": "user", "content": QUESTION}])
    completion = raw.parse()
    message = completion.choices[0].message
    assert (message.content, message.model_extra["reasoning_content"], completion.choices[0].finish_reason) == (content, reasoning, "stop")
    trajectory = (await store.Get(store_pb2.GetRequest(id=raw.headers["x-gearshift-trajectory-id"]))).trajectory
    assert trajectory.protocol == PolicyProtocol.POLICY_PROTOCOL_NATIVE and trajectory.status == TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED
    assert trajectory.answer == content
    calls = completion.model_extra["gearshift"]["tool_calls"]
    assert [call["name"] for call in calls] == (["web_search"] if model == "gearshift-agentic" else [])
    assert all(call["output"] and not call["is_error"] for call in calls)

    stream = await client.chat.completions.create(model=model, messages=[{"role": "user", "content": QUESTION}], stream=True)
    chunks = [chunk async for chunk in stream]
    deltas = [chunk.choices[0].delta for chunk in chunks if chunk.choices]
    assert "".join(delta.content or "" for delta in deltas) == content
    assert ("".join(delta.model_extra.get("reasoning_content") or "" for delta in deltas) or None) == reasoning
    assert chunks[-1].model_extra["gearshift"]["status"] == "completed"
