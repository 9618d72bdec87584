"""The gateway's transport-free parts: the requests it refuses and what it makes of the rest,
the answer and reasoning split out of streamed policy text, stop sequences, and the HTTP status
of each gRPC status."""

from __future__ import annotations

import grpc
import pytest
from gearshift.api.common.v1.common_pb2 import ChatRole, Mode, RoutingStrategy
from gearshift.protocol.parsers.a2fm import EpisodeText, tag_content
from gearshift.services.gateway import translate
from gearshift.services.gateway.errors import ApiError, from_rpc
from gearshift.services.gateway.schemas import ChatCompletionRequest
from gearshift.services.gateway.deltas import StopCut

QUESTION = [{"role": "user", "content": "What is 2 + 2?"}]


def request(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "gearshift", "messages": QUESTION} | fields)


def solve(**fields):
    return translate.solve_request(request(**fields), "00000000-0000-4000-8000-000000000001", 256)


def refusal(**fields) -> ApiError:
    with pytest.raises(ApiError) as caught:
        solve(**fields)
    return caught.value


def test_model_names_choose_the_strategy_or_pin_the_mode():
    routed = {name: (solve(model=name).mode, solve(model=name).strategy) for name in translate.MODELS}
    assert routed == {
        "gearshift": (Mode.MODE_UNSPECIFIED, RoutingStrategy.ROUTING_STRATEGY_MODEL),
        "gearshift-learned": (Mode.MODE_UNSPECIFIED, RoutingStrategy.ROUTING_STRATEGY_LEARNED),
        "gearshift-instant": (Mode.MODE_INSTANT, RoutingStrategy.ROUTING_STRATEGY_FORCED),
        "gearshift-reasoning": (Mode.MODE_REASONING, RoutingStrategy.ROUTING_STRATEGY_FORCED),
        "gearshift-agentic": (Mode.MODE_AGENTIC, RoutingStrategy.ROUTING_STRATEGY_FORCED),
    }
    unknown = refusal(model="gpt-4o")
    assert (unknown.status, unknown.param) == (404, "model")


def test_reasoning_effort_pins_a_mode_on_gearshift_only():
    efforts = {effort: solve(reasoning_effort=effort).mode for effort in ("none", "minimal", "low", "medium", "high", "xhigh")}
    assert efforts == {"none": Mode.MODE_INSTANT, "minimal": Mode.MODE_INSTANT, "low": Mode.MODE_REASONING,
                       "medium": Mode.MODE_REASONING, "high": Mode.MODE_AGENTIC, "xhigh": Mode.MODE_AGENTIC}
    assert solve(reasoning_effort="low").strategy == RoutingStrategy.ROUTING_STRATEGY_FORCED
    assert refusal(reasoning_effort="extreme").param == "reasoning_effort"
    assert "gearshift only" in refusal(model="gearshift-instant", reasoning_effort="low").message


def test_the_conversation_around_the_last_user_message():
    messages = [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [{"type": "text", "text": "Bonjour"}]},
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "What is the capital of Spain?"},
    ]
    solved = solve(messages=messages)
    assert solved.query == "What is the capital of Spain?"
    assert solved.conversation.instructions == "Answer in French.\n\nBe brief."
    assert [(m.role, m.content) for m in solved.conversation.messages] == [(ChatRole.CHAT_ROLE_USER, "Hi"), (ChatRole.CHAT_ROLE_ASSISTANT, "Bonjour")]


def test_fields_that_map_onto_the_episode():
    solved = solve(max_completion_tokens=300, max_tokens=99, temperature=0.7, user="u-1", metadata={"app": "demo"})
    assert solved.budget.max_output_tokens == 300 and not solved.budget.max_tokens  # max_completion_tokens wins over the older name
    assert (round(solved.sampling.temperature, 6), solved.sampling.top_p) == (0.7, 0.0)  # top_p 0: 1.0
    assert dict(solved.labels) == {"app": "demo", "user": "u-1"}
    assert solve(max_tokens=99).budget.max_output_tokens == 99
    assert not solve().HasField("sampling")  # unset: the executor's greedy defaults
    assert solve(top_p=0.5).sampling.temperature == 1.0  # OpenAI's default temperature
    assert not solve(top_p=0.5).sampling.HasField("seed")
    seeded = solve(seed=7).sampling  # a seed alone samples at OpenAI's defaults, repeatably
    assert (seeded.temperature, seeded.top_p, seeded.seed) == (1.0, 0.0, 7)
    assert solve(seed=-1).sampling.seed == 2**63 - 1  # any integer is a seed; the proto's int64 holds it
    penalised = solve(frequency_penalty=0.5, presence_penalty=-0.25).sampling  # OpenAI's defaults besides them
    assert (penalised.temperature, penalised.frequency_penalty, penalised.presence_penalty) == (1.0, 0.5, -0.25)
    assert translate.stop_words(request(stop="END")) == ["END"]


@pytest.mark.parametrize("fields, param", [
    ({"n": 2}, "n"),
    ({"logprobs": True}, "logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"logit_bias": {"1": 5}}, "logit_bias"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stop": [""]}, "stop"),
    ({"user": "x" * 257}, "user"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": "1", "tool_call_id": "a"},
                   {"role": "user", "content": "so?"}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages"),
    ({"messages": [{"role": "user", "content": "  "}]}, "messages"),
])
def test_what_the_gateway_cannot_honour_is_a_400_naming_the_field(fields, param):
    refused = refusal(**fields)
    assert (refused.status, refused.param) == (400, param)
    assert refused.message


def test_what_asks_for_what_the_gateway_does_anyway_is_accepted():
    solve(n=1, logprobs=False, tools=[], tool_choice="none", response_format={"type": "text"}, modalities=["text"])


def split_in_pieces(text: str, size: int) -> tuple[str, str]:
    reader = EpisodeText()
    pieces = [piece for start in range(0, len(text), size) for piece in reader.feed(text[start : start + size])] + reader.finish()
    return tuple("".join(piece.text for piece in pieces if piece.kind == kind) for kind in ("content", "reasoning"))


@pytest.mark.parametrize("text", [
    "Think first.\n<classification>\nreasoning_agent\n</classification>\n<reasoning> 2 and 2 make 4.\n\n</reasoning>\n<answer> 4 </answer>",
    "<answer>x < y, so <b>y</b> wins\n</answer>",
    "Plan: None\n<tool_call>\n{'id': 1, 'name': 'python', 'arguments': {'code': 'print(1<2)'}}\n</tool_call><answer>True</answer>",
    "<reasoning>a < b <answer>ok</answer>",  # an answer after a reasoning block never closed
    "<answer>cut by the budget, no closing tag",
])
def test_the_answer_and_reasoning_come_out_the_same_in_any_pieces(text):
    whole = EpisodeText.parse(text)
    assert (whole.content or "") == (tag_content(text, "answer") or "")
    if "</reasoning>" in text:
        assert whole.reasoning == tag_content(text, "reasoning")
    for size in (1, 2, 3, 7, 50):
        assert split_in_pieces(text, size) == (whole.content or "", whole.reasoning or "")


def test_stop_sequences_end_the_content_even_split_over_pieces():
    cut = StopCut(["STOP", "\n\n"])
    pieces = ["Paris is the", " capital. ST", "OP and more"]
    assert "".join(cut.feed(p) for p in pieces) + cut.finish() == "Paris is the capital. "
    assert StopCut(["ris"]).cut("Paris") == "Pa" and StopCut([]).cut("Paris") == "Paris"
    assert StopCut(["zz"]).cut("Paris") == "Paris"


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


@pytest.mark.parametrize("code, status", [
    (grpc.StatusCode.INVALID_ARGUMENT, 400), (grpc.StatusCode.FAILED_PRECONDITION, 400), (grpc.StatusCode.NOT_FOUND, 404),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, 429), (grpc.StatusCode.UNAVAILABLE, 503), (grpc.StatusCode.DEADLINE_EXCEEDED, 504),
    (grpc.StatusCode.INTERNAL, 500), (grpc.StatusCode.UNAUTHENTICATED, 500),
])
def test_grpc_statuses_become_http_statuses(code, status):
    error = from_rpc(rpc_error(code, "the detail"), "executor", "rid-1")
    assert error.status == status
    # What the caller did wrong is shown; a failure on the platform's side only by kind and request
    # id (its details may name internal addresses: they go to the log).
    assert ("the detail" in error.message) is (status < 500)
    assert ("rid-1" in error.message) is (status >= 500)
    assert error.message.startswith("executor")
