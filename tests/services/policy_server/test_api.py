"""The OpenAI-compatible API over a real uvicorn server with the tiny model."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from gearshift.policy_client import PolicyClient

PROMPT = "The quick brown fox"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run Python code and return its stdout",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
        },
    }
]


def sse_events(body: str) -> list:
    """The data payloads of a server-sent-event body, [DONE] kept as a string."""
    payloads = [line[len("data: ") :] for line in body.split("\n\n") if line.startswith("data: ")]
    return [p if p == "[DONE]" else json.loads(p) for p in payloads]


async def complete(http: httpx.AsyncClient, **body) -> dict:
    response = await http.post("/completions", json={"prompt": PROMPT, **body})
    assert response.status_code == 200, response.text
    return response.json()


async def test_completion_reports_text_finish_reason_and_usage(http, tokenizer):
    reply = await complete(http, max_tokens=12, temperature=0, ignore_eos=True)
    choice = reply["choices"][0]
    assert reply["object"] == "text_completion" and reply["model"] == "smollm2"
    assert choice["finish_reason"] == "length" and choice["text"]
    prompt_tokens = len(tokenizer(PROMPT)["input_ids"])
    counts = {key: reply["usage"][key] for key in ("prompt_tokens", "completion_tokens", "total_tokens")}
    assert counts == {"prompt_tokens": prompt_tokens, "completion_tokens": 12, "total_tokens": prompt_tokens + 12}
    again = await complete(http, max_tokens=12, temperature=0, ignore_eos=True)
    assert again["choices"][0]["text"] == choice["text"]  # greedy is deterministic
    # The second time the prompt's KV comes from the prefix cache (all but its last token).
    assert again["usage"]["prompt_tokens_details"] == {"cached_tokens": prompt_tokens - 1}


async def test_seed_makes_sampling_repeatable(http):
    first = await complete(http, max_tokens=16, temperature=1.0, seed=7, ignore_eos=True)
    second = await complete(http, max_tokens=16, temperature=1.0, seed=7, ignore_eos=True)
    other = await complete(http, max_tokens=16, temperature=1.0, seed=8, ignore_eos=True)
    assert first["choices"][0]["text"] == second["choices"][0]["text"] != other["choices"][0]["text"]


async def test_stop_word_cuts_the_text_before_it(http):
    sampled = {"max_tokens": 40, "temperature": 1.0, "seed": 3, "ignore_eos": True}
    full = (await complete(http, **sampled))["choices"][0]["text"]
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    expected = full[: full.find(stop)]
    reply = await complete(http, stop=[stop, "never-appears"], **sampled)
    assert reply["choices"][0]["text"] == expected
    assert reply["choices"][0]["finish_reason"] == "stop"
    assert reply["usage"]["completion_tokens"] < 40


async def test_streaming_sends_the_same_text_in_pieces(http):
    sampled = {"max_tokens": 30, "temperature": 1.0, "seed": 5, "ignore_eos": True}
    whole = (await complete(http, **sampled))["choices"][0]["text"]
    stop = whole[20:23]
    response = await http.post(
        "/completions", json={"prompt": PROMPT, "stream": True, "stream_options": {"include_usage": True}, **sampled}
    )
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    texts = [e["choices"][0]["text"] for e in events[:-1] if e["choices"]]
    assert len(texts) > 5 and "".join(texts) == whole
    assert events[-3]["choices"][0]["finish_reason"] == "length"
    assert events[-2]["usage"]["completion_tokens"] == 30

    async with PolicyClient(str(http.base_url), "smollm2", retries=0) as client:
        chunks = [chunk async for chunk in client.stream(PROMPT, stop=[stop], **sampled)]
    assert "".join(c.text for c in chunks) == whole[: whole.find(stop)]  # no part of the stop word leaks
    assert chunks[-1].finish_reason == "stop" and chunks[-1].usage.completion_tokens < 30


async def test_chat_renders_tools_into_the_prompt_and_reports_the_message(http):
    messages = [{"role": "user", "content": "What is 17 * 23?"}]
    plain = (await http.post("/chat/completions", json={"messages": messages, "max_tokens": 4, "temperature": 0})).json()
    with_tools = await http.post(
        "/chat/completions", json={"messages": messages, "tools": TOOLS, "max_tokens": 4, "temperature": 0}
    )
    assert with_tools.status_code == 200, with_tools.text
    reply = with_tools.json()
    assert reply["object"] == "chat.completion"
    assert reply["choices"][0]["message"]["role"] == "assistant"
    assert reply["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"] + 40  # the tool listing

    history = messages + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "python", "arguments": '{"code": "print(17*23)"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "391"},
    ]
    follow_up = await http.post("/chat/completions", json={"messages": history, "tools": TOOLS, "max_tokens": 4})
    assert follow_up.status_code == 200, follow_up.text
    assert follow_up.json()["usage"]["prompt_tokens"] > reply["usage"]["prompt_tokens"]


async def test_chat_streams_role_then_content(http):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10, "temperature": 0, "ignore_eos": True}
    whole = (await http.post("/chat/completions", json=body)).json()["choices"][0]["message"]
    events = sse_events((await http.post("/chat/completions", json={**body, "stream": True})).text)
    deltas = [e["choices"][0]["delta"] for e in events[:-1]]
    assert deltas[0]["role"] == "assistant"
    streamed = "".join(d.get("content", "") for d in deltas) + "".join(d.get("reasoning_content", "") for d in deltas)
    assert streamed.strip() == ((whole["content"] or "") + (whole["reasoning_content"] or "")).strip()
    assert events[-2]["choices"][0]["finish_reason"] == "length" and events[-1] == "[DONE]"


@pytest.mark.parametrize(
    ("body", "hint"),
    [
        ({"prompt": ""}, "prompt is empty"),
        ({"prompt": "   "}, "prompt is empty"),
        ({"prompt": "hi", "max_tokens": 0}, "max_tokens must be between"),
        ({"prompt": "hi", "max_tokens": 3001}, "max_tokens must be between"),
        ({"prompt": "hi", "max_tokens": 2100}, "exceeds the model's context"),
        ({"prompt": "hi", "temperature": -1}, "temperature"),
        ({"prompt": "hi", "n": 17}, "n must be at most 16"),
        ({"prompt": "hi", "n": 0}, "n:"),
        ({"prompt": "hi", "stop": [""]}, "stop"),
        ({"max_tokens": 3}, "prompt: Field required"),
    ],
)
async def test_bad_completion_requests_are_400_with_a_message(http, body, hint):
    response = await http.post("/completions", json=body)
    assert response.status_code == 400
    assert hint in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("body", "hint"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": ""}]}, "messages are empty"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "role"),
        ({"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not among the tools"),
        ({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {}}]}, "name"),
    ],
)
async def test_bad_chat_requests_are_400_with_a_message(http, body, hint):
    response = await http.post("/chat/completions", json=body)
    assert response.status_code == 400
    assert hint in response.json()["error"]["message"]


async def test_malformed_json_is_400_and_the_server_keeps_serving(http):
    for raw in (b'{"prompt": "hi",', b"[1, 2]", b"not json"):
        response = await http.post("/completions", content=raw, headers={"content-type": "application/json"})
        assert response.status_code == 400
        assert response.json()["error"]["type"] == "invalid_request_error"
    assert (await complete(http, max_tokens=2))["choices"][0]["finish_reason"] in ("length", "stop")


async def test_concurrent_requests_get_the_same_answers_as_sequential_ones(http):
    prompts = [f"{PROMPT} number {i}" for i in range(6)]
    sequential = [
        (await http.post("/completions", json={"prompt": p, "max_tokens": 15, "temperature": 0, "ignore_eos": True})).json()
        for p in prompts
    ]
    concurrent = await asyncio.gather(
        *(http.post("/completions", json={"prompt": p, "max_tokens": 15, "temperature": 0, "ignore_eos": True}) for p in prompts)
    )
    assert [r.json()["choices"][0]["text"] for r in concurrent] == [r["choices"][0]["text"] for r in sequential]
    assert len({r["choices"][0]["text"] for r in sequential}) > 1


async def test_models_and_health_name_the_served_checkpoint(http, policy_server, tiny_checkpoints):
    models = (await http.get("/models")).json()
    assert [card["id"] for card in models["data"]] == ["smollm2"]
    assert models["data"][0]["root"] == str(tiny_checkpoints[0]) and models["data"][0]["max_model_len"] == 2048
    health = (await http.get(str(policy_server.base_url).removesuffix("/v1") + "/health")).json()
    assert health["status"] == "ok" and health["path"] == str(tiny_checkpoints[0])


async def settled(policy_server) -> int:
    """The server's in-flight count once cancelled generations have ended (each ends at its next
    token; 2000 tokens would take seconds), so one test's leftovers never count in the next."""
    for _ in range(100):
        if policy_server.engine.in_flight == 0:
            break
        await asyncio.sleep(0.02)
    return policy_server.engine.in_flight


async def test_a_client_that_goes_away_stops_its_generation(http, policy_server):
    assert await settled(policy_server) == 0
    body = {"prompt": PROMPT, "max_tokens": 2000, "temperature": 0, "ignore_eos": True, "stream": True}
    async with http.stream("POST", "/completions", json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                break
        assert policy_server.engine.in_flight == 1
    assert await settled(policy_server) == 0


async def test_a_caller_that_gives_up_on_a_plain_request_stops_its_generation(http, policy_server):
    body = {"prompt": PROMPT, "max_tokens": 2000, "temperature": 0, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        await http.post("/completions", json=body, timeout=0.3)
    assert await settled(policy_server) == 0
    assert (await complete(http, max_tokens=3, ignore_eos=True))["usage"]["completion_tokens"] == 3


async def test_metrics_count_the_tokens_served(http, policy_server):
    def read(text: str, name: str) -> float:
        return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))

    url = str(policy_server.base_url).removesuffix("/v1") + "/metrics"
    before = (await http.get(url)).text
    await complete(http, max_tokens=5, ignore_eos=True)
    assert await settled(policy_server) == 0
    after = (await http.get(url)).text
    assert read(after, "gearshift_policy_completion_tokens_total") - read(before, "gearshift_policy_completion_tokens_total") == 5
    assert read(after, "gearshift_policy_generations_total") == read(before, "gearshift_policy_generations_total") + 1
    assert read(after, "gearshift_policy_in_flight") == 0


async def test_continuing_the_assistant_message_equals_completing_its_rendered_prompt(http, tokenizer):
    """continue_final_message (vLLM's extension) extends the assistant text in place, raw."""
    messages = [{"role": "user", "content": "Count."}, {"role": "assistant", "content": "<reasoning>one, two,"}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    assert rendered.rstrip().endswith("one, two,")
    sampled = {"max_tokens": 12, "temperature": 0, "ignore_eos": True}
    chat = await http.post(
        "/chat/completions",
        json={"messages": messages, "continue_final_message": True, "add_generation_prompt": False, **sampled},
    )
    assert chat.status_code == 200, chat.text
    message = chat.json()["choices"][0]["message"]
    completion = await complete(http, prompt=rendered, **sampled)
    assert message["content"] == completion["choices"][0]["text"]  # raw: no reasoning split
    assert not message.get("reasoning_content")


async def test_a_continuation_comes_back_raw_whitespace_included(http, tokenizer):
    """A continued message's leading whitespace is part of what the model said ("Plan:" then a
    newline opens a new plan): the plain reply keeps it, as the stream and a completion do."""
    messages = [{"role": "user", "content": "Go."}, {"role": "assistant", "content": "Plan:"}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    chat = {"messages": messages, "continue_final_message": True, "add_generation_prompt": False}
    for seed in range(40):
        sampled = {"max_tokens": 6, "temperature": 1.0, "seed": seed, "ignore_eos": True}
        text = (await complete(http, prompt=rendered, **sampled))["choices"][0]["text"]
        if text[:1].isspace():
            break
    assert text[:1].isspace(), "no seed gave a continuation that starts with whitespace"
    reply = await http.post("/chat/completions", json=chat | sampled)
    assert reply.json()["choices"][0]["message"]["content"] == text
    streamed = await http.post("/chat/completions", json=chat | sampled | {"stream": True})
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in sse_events(streamed.text)[:-1] if e["choices"]) == text


async def test_return_token_ids_gives_the_sampled_ids_plain_and_streamed(http, tokenizer):
    """vLLM's return_token_ids: the ids the text was sampled as, a stop word's included; streamed,
    the chunks' ids add up to the same list."""
    sampled = {"max_tokens": 30, "temperature": 1.0, "seed": 11, "ignore_eos": True, "return_token_ids": True}
    full = (await complete(http, **sampled))["choices"][0]
    assert tokenizer.decode(full["token_ids"]) == full["text"] and len(full["token_ids"]) == 30
    stop = full["text"][len(full["text"]) // 2 : len(full["text"]) // 2 + 3]
    cut = (await complete(http, stop=[stop], **sampled))["choices"][0]
    assert cut["finish_reason"] == "stop" and tokenizer.decode(cut["token_ids"]).startswith(cut["text"] + stop)
    assert cut["token_ids"] == full["token_ids"][: len(cut["token_ids"])]
    chat = {"messages": [{"role": "user", "content": "Say something."}], **sampled}
    plain = (await http.post("/chat/completions", json=chat)).json()["choices"][0]
    streamed = sse_events((await http.post("/chat/completions", json=chat | {"stream": True})).text)[:-1]
    assert [i for e in streamed for c in e["choices"] for i in c.get("token_ids") or []] == plain["token_ids"]
    assert tokenizer.decode(plain["token_ids"]).strip() == plain["message"]["content"]  # a new message is trimmed
    without = (await complete(http, **{k: v for k, v in sampled.items() if k != "return_token_ids"}))["choices"][0]
    assert "token_ids" not in without


@pytest.mark.parametrize(
    ("body", "hint"),
    [
        ({"messages": [{"role": "assistant", "content": "x"}], "continue_final_message": True}, "add_generation_prompt false"),
        (
            {"messages": [{"role": "user", "content": "x"}], "continue_final_message": True, "add_generation_prompt": False},
            "last message to be the assistant",
        ),
    ],
)
async def test_bad_continuations_are_400(http, body, hint):
    response = await http.post("/chat/completions", json=body)
    assert response.status_code == 400 and hint in response.json()["error"]["message"]


def test_the_wait_policy_is_set_before_torch_loads_unless_the_environment_chose(monkeypatch):
    import os

    from gearshift.services.policy_server import openmp

    for spin, expected in ((False, {"OMP_WAIT_POLICY": "PASSIVE"}), (True, {"GOMP_SPINCOUNT": openmp.SPIN_COUNT})):
        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
        monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
        openmp.set_wait_policy(spin)
        assert {key: os.environ.get(key) for key in expected} == expected
        assert len({"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"} & set(os.environ)) == 1
        assert openmp.spinning() is spin
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    monkeypatch.delenv("GOMP_SPINCOUNT")
    openmp.set_wait_policy(True)
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE" and "GOMP_SPINCOUNT" not in os.environ
