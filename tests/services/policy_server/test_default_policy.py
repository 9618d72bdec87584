"""The real default policy (SmolLM2 with the A^2FM adapter, marker `model`) through the official
openai client: the declared tools reach it in the A^2FM template, its dict-line tool blocks come
back as tool_calls, and its log-probabilities are those of its own forward.

The model was taught inside the executor's episodes: routed, then planned by the planner (an
SR2AM plan block), then its own <plan> and the call. Asked cold, it routes to tools and then
keeps writing plan lines; so the call test continues the assistant turn from where the executor
hands it over, as an OpenAI client driving it would."""

from __future__ import annotations

import json

import openai
import pytest
import torch
from gearshift import weights
from gearshift.api.common.v1.common_pb2 import Mode
from gearshift.protocol import a2fm
from gearshift.services.policy_server.server import running
from gearshift.settings import Settings

from tests import workers

pytestmark = pytest.mark.model

PYTHON = [{"type": "function", "function": {
    "name": "python", "description": "runs Python and returns what it prints",
    "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}]
QUESTION = [{"role": "user", "content": "What is 48213 * 7719?"}]
PLAN = (
    "Plan:\n- Current State: need the product of 48213 and 7719; nothing computed yet\n- Action: run python to compute it\n"
    "- Expected Outcome: the value is printed\n- Next Action: answer with the printed value\n- Expected Outcome: the answer is given"
)
HANDED_OVER = QUESTION + [{"role": "assistant", "content": a2fm.forced_prefix(Mode.MODE_AGENTIC) + PLAN + "\n<plan>"}]
CONTINUE = {"continue_final_message": True, "add_generation_prompt": False}


@pytest.fixture(scope="module")
async def server():
    settings = Settings(log_level="WARNING", policy_server=workers.policy_server(weights.DEFAULT))
    async with running(settings) as server:
        yield server


@pytest.fixture
async def client(server):
    async with openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=300) as client:
        yield client


async def test_its_a2fm_tool_block_comes_back_as_a_python_tool_call(client):
    fields = {"model": "smollm2", "messages": HANDED_OVER, "tools": PYTHON, "temperature": 0, "max_tokens": 120, "extra_body": CONTINUE}
    reply = await client.chat.completions.create(**fields)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    call = choice.message.tool_calls[0]
    assert call.function.name == "python" and call.id == "call_1"  # the model's own id
    assert "48213" in json.loads(call.function.arguments)["code"]
    assert choice.message.reasoning_content.endswith("</plan>") and choice.message.content is None  # its plan: deliberation
    streamed = []
    async for chunk in await client.chat.completions.create(stream=True, **fields):
        streamed += [call for choice in chunk.choices for call in choice.delta.tool_calls or []]
    assert [(c.function.name, c.function.arguments) for c in streamed] == [
        (c.function.name, c.function.arguments) for c in choice.message.tool_calls
    ]


async def test_greedy_logprobs_match_the_models_forward(client, server):
    fields = {"model": "smollm2", "messages": QUESTION, "temperature": 0, "max_tokens": 24, "logprobs": True, "top_logprobs": 3}
    reply = await client.chat.completions.create(**fields, extra_body={"return_token_ids": True})
    choice = reply.choices[0]
    ids, content = choice.model_extra["token_ids"], choice.logprobs.content
    for entry in content:
        assert entry.top_logprobs[0].token == entry.token and entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-6)
    tokenizer = server.engine.current.tokenizer
    prompt = server.engine.chat_prompt(server.engine.current, _request(QUESTION)).text
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    model = weights.load(weights.DEFAULT, Settings().models_dir).model  # transformers' own forward
    with torch.inference_mode():
        logits = model(torch.tensor([prompt_ids + ids])).logits[0].float()
    expected = torch.log_softmax(logits[len(prompt_ids) - 1 : -1], dim=-1)[torch.arange(len(ids)), torch.tensor(ids)]
    assert [entry.logprob for entry in content] == pytest.approx(expected.tolist(), abs=1e-3)


async def test_n_samples_of_the_real_model_differ(client):
    reply = await client.completions.create(model="smollm2", prompt="Once upon a time", n=4, temperature=1.0, seed=3, max_tokens=24)
    assert len({choice.text for choice in reply.choices}) == 4


def _request(messages):
    from gearshift.services.policy_server.schemas import ChatCompletionRequest

    return ChatCompletionRequest(messages=messages)
