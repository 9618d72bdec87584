"""vLLM's "a2fm" tool and reasoning parsers (gearshift/vllm_plugins/a2fm_parsers.py).

In vLLM's own environment, composed into vLLM's serving Parser as the server composes them: each
case streamed token by token gives the fields its unstreamed parse gives, and both are what
gearshift.protocol.parsers.a2fm reads in the text; the platform's text protocol is left alone.

Then the real thing: the default policy served by vLLM's CPU build (the session's shared servers,
started with these parsers) answers an OpenAI chat completion that declares a tool with
`tool_calls` parsed from its A^2FM block and `reasoning` from its deliberation, takes the tool's
result back through the A^2FM chat template, and answers from it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest
from gearshift import vllm_plugins, weights
from gearshift.api.common.v1.common_pb2 import Mode
from gearshift.protocol import a2fm, prompts
from gearshift.protocol.parsers import a2fm as a2fm_format
from gearshift.settings import Settings

from tests.vllm_servers import VLLM_PYTHON

pytestmark = pytest.mark.vllm

TOOLS = [{"type": "function", "function": {"name": "python", "description": "runs Python and returns what it prints",
                                           "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}]
QUESTION, PRODUCT = "What is 48213 * 7719?", "372156147"
CODE = "print(48213 * 7719)"
STICKERS = "Mia had 20 stickers and gave 6 to her friend. How many stickers does she have left?"
# What the executor writes before the agentic turn's first generation: the forced route, the
# planner's SR2AM plan (as the default policy learned it) and the <plan> opener.
PLAN = ("Plan:\n- Current State: need the product of 48213 and 7719; nothing computed yet\n- Action: run python to compute it\n"
        "- Expected Outcome: the exact value is printed\n- Next Action: answer with the printed value\n- Expected Outcome: the answer is given\n")
AGENTIC_PREFIX = a2fm.forced_prefix(Mode.MODE_AGENTIC) + PLAN + "<plan>"
CALL_LINE = f"{{'id': 1, 'name': 'python', 'arguments': {{'code': '{CODE}'}}}}"
ROUTED = ("This question needs tools to answer reliably.\n<classification>\ntoolcalling_agent\n</classification>\n" + PLAN
          + "<plan>Goal: the product.</plan>\n<tool_call>\n" + CALL_LINE + "\n{'id': 2, 'name': 'python', 'arguments': {'code': 'print(2)'}}\n")


def case(output, messages, tools=None, kwargs=None, continued=False):
    return {"output": output, "messages": messages, "tools": tools, "kwargs": kwargs or {},
            "add_generation_prompt": not continued, "continue_final_message": continued}


USER = [{"role": "user", "content": QUESTION}]
NATIVE = [
    case(ROUTED, USER, TOOLS),  # the model routes itself; streamed, the tool parser splits
    case(ROUTED.split("toolcalling_agent\n</classification>\n", 1)[1], USER, TOOLS, {"enable_thinking": True}),  # agentic pinned
    case("Goal: the product.</plan>\n<tool_call>\n" + CALL_LINE + "\n", USER + [{"role": "assistant", "content": AGENTIC_PREFIX}], TOOLS,
         continued=True),
    case("20 - 6 = 14.\nSo the answer is 14.</reasoning>\n<answer>14</answer>", [{"role": "user", "content": STICKERS}],
         kwargs={"enable_thinking": True}),
    case("Paris", [{"role": "user", "content": "What is the capital of France?"}], kwargs={"enable_thinking": False}),
    case("The tool printed 372156147.\n<answer>372156147</answer>",
         USER + [{"role": "assistant", "content": None, "tool_calls": [
             {"id": "call_1", "type": "function", "function": {"name": "python", "arguments": json.dumps({"code": CODE})}}]},
                 {"role": "tool", "tool_call_id": "call_1", "content": PRODUCT}], TOOLS),
]
TEXT_PROTOCOL = [  # no tools, no enable_thinking: the router's, planner's and executor's own requests
    case("This question needs tools to answer reliably.\n<classification>\ntoolcalling_agent\n", prompts.messages(QUESTION)),
    case("Goal: g.</plan>\n<tool_call>\n" + CALL_LINE + "\n", prompts.messages(QUESTION, AGENTIC_PREFIX), continued=True),
]


def drive(cases: list[dict]) -> list[dict]:
    if not VLLM_PYTHON.exists():
        pytest.fail(f"vLLM is not installed at {VLLM_PYTHON}: run scripts/install-vllm.sh")
    job = {"model": str(weights.cache_smollm2(Settings().models_dir)), "plugin": str(vllm_plugins.PARSERS),
           "template": str(vllm_plugins.CHAT_TEMPLATE), "cases": cases}
    done = subprocess.run([str(VLLM_PYTHON), str(Path(__file__).with_name("drive_parsers.py"))], input=json.dumps(job),
                          capture_output=True, text=True, timeout=600, env=dict(os.environ, HF_HUB_OFFLINE="1", VLLM_TARGET_DEVICE="cpu"))
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def expected(c: dict) -> list:
    state = a2fm_format.generation_state(c["messages"], c["add_generation_prompt"], c["continue_final_message"], c["kwargs"])
    parsed = a2fm_format.A2FMSplitter.parse(c["output"], state)
    calls = [{"id": call["id"], **call["function"]} for call in parsed.tool_calls]
    return [parsed.reasoning, parsed.content, calls]


def test_streamed_and_unstreamed_give_the_formats_fields():
    results = drive(NATIVE + TEXT_PROTOCOL)
    for c, result in zip(NATIVE, results):
        assert result["parsed"] == expected(c), c
        assert result["streamed"] == result["parsed"], c
        assert result["stop"] == list(a2fm_format.STOP_WORDS)
    routed = results[0]["parsed"]
    assert [call["arguments"] for call in routed[2]] == [json.dumps({"code": CODE}), json.dumps({"code": "print(2)"})]
    assert routed[0].startswith("This question needs tools") and routed[0].endswith("</plan>") and routed[1] is None
    assert results[3]["parsed"][:2] == ["20 - 6 = 14.\nSo the answer is 14.</reasoning>", "14"]
    assert results[4]["parsed"] == [None, "Paris", []] and results[5]["parsed"][1] == PRODUCT
    for c, result in zip(TEXT_PROTOCOL, results[len(NATIVE):]):
        assert result["parsed"] == [None, c["output"], []] and result["streamed"] == result["parsed"]
        assert result["stop"] == []


# The default policy on vLLM's CPU server. The budget outlasts the first call's 85 tokens: vLLM
# reports a call cut by max_tokens as tool_calls unstreamed but as length streamed.
MAX_TOKENS = 160


def chat(url: str, **body) -> dict:
    body = {"model": weights.DEFAULT, "max_tokens": MAX_TOKENS, "temperature": 0, "chat_template": vllm_plugins.CHAT_TEMPLATE.read_text(), **body}
    reply = httpx.post(f"{url}/chat/completions", json=body, timeout=600)
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]


def streamed(url: str, **body) -> tuple[str, str, list[dict], str]:
    body = {"model": weights.DEFAULT, "max_tokens": MAX_TOKENS, "temperature": 0, "chat_template": vllm_plugins.CHAT_TEMPLATE.read_text(),
            "stream": True, **body}
    reasoning, content, calls, finish = "", "", {}, None
    with httpx.stream("POST", f"{url}/chat/completions", json=body, timeout=600) as reply:
        for line in reply.iter_lines():
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line[6:])["choices"]:
                delta, finish = choice["delta"], choice.get("finish_reason") or finish
                reasoning += delta.get("reasoning") or delta.get("reasoning_content") or ""
                content += delta.get("content") or ""
                for call in delta.get("tool_calls") or []:
                    whole = calls.setdefault(call["index"], {"id": call.get("id"), "name": "", "arguments": ""})
                    whole["name"] += call.get("function", {}).get("name") or ""
                    whole["arguments"] += call.get("function", {}).get("arguments") or ""
    return reasoning, content, [calls[i] for i in sorted(calls)], finish


@pytest.mark.model
def test_the_default_policy_calls_a_tool_natively_and_answers_from_its_result(vllm_servers):
    url = vllm_servers[1]
    asked = {"messages": USER + [{"role": "assistant", "content": AGENTIC_PREFIX}], "tools": TOOLS,
             "continue_final_message": True, "add_generation_prompt": False}
    choice = chat(url, **asked)
    message = choice["message"]
    assert choice["finish_reason"] == "tool_calls", choice
    [call] = message["tool_calls"]
    assert call["id"] == "call_1" and call["function"]["name"] == "python"
    assert json.loads(call["function"]["arguments"]) == {"code": CODE}
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    assert reasoning.endswith("</plan>") and "48213" in reasoning and not message["content"], message
    # Streamed, the same fields.
    assert streamed(url, **asked) == (reasoning, "", [{"id": "call_1", "name": "python", "arguments": call["function"]["arguments"]}],
                                      "tool_calls")

    # The result goes back as a tool message: the template writes it into the same turn as the
    # executor does, after the reasoning and call sent back; the executor's "Plan:" for
    # continuing the plan opens the model's next step.
    sent_back = {"role": "assistant", "content": None, "reasoning": AGENTIC_PREFIX + reasoning, "tool_calls": message["tool_calls"]}
    answered = chat(url, messages=USER + [sent_back, {"role": "tool", "tool_call_id": call["id"], "content": PRODUCT},
                                          {"role": "assistant", "content": "\nPlan:\n\n"}],
                    tools=TOOLS, continue_final_message=True, add_generation_prompt=False)["message"]
    assert answered["content"] == PRODUCT and not answered.get("tool_calls"), answered
    assert PRODUCT in (answered.get("reasoning_content") or answered.get("reasoning")), answered


@pytest.mark.model
def test_reasoning_mode_pinned_by_enable_thinking_returns_reasoning_and_the_answer(vllm_servers):
    message = chat(vllm_servers[1], messages=[{"role": "user", "content": STICKERS}], chat_template_kwargs={"enable_thinking": True})["message"]
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    assert message["content"] == "14" and reasoning.endswith("So the answer is 14.</reasoning>"), message


@pytest.mark.model
def test_the_text_protocol_gets_the_text_as_the_model_wrote_it(vllm_servers):
    """The router's request on the same server: no tools, no enable_thinking, the SmolLM2
    template (none named): content is the raw A^2FM text, nothing split off."""
    body = {"model": weights.DEFAULT, "messages": prompts.messages(QUESTION), "max_tokens": 40, "temperature": 0, "stop": [a2fm.CLASSIFICATION_STOP]}
    message = httpx.post(f"{vllm_servers[1]}/chat/completions", json=body, timeout=600).json()["choices"][0]["message"]
    assert message["content"].startswith("This question needs tools") and "<classification>" in message["content"]
    assert not message.get("reasoning") and not message.get("reasoning_content") and not message.get("tool_calls")
