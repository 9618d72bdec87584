"""The official `openai` client against the real server (tiny model, loopback): every field it
sends is honoured or refused with an OpenAI-shaped error, never accepted and dropped."""

from __future__ import annotations

from collections import Counter

import httpx
import openai
import pytest
import torch
from gearshift import weights

GREEDY = {"temperature": 0, "max_tokens": 12, "extra_body": {"ignore_eos": True, "return_token_ids": True}}
SAMPLED = {"temperature": 1.0, "seed": 5, "max_tokens": 12, "extra_body": {"ignore_eos": True, "return_token_ids": True}}
MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Runs Python code and returns what it prints",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
        },
    }
]


@pytest.fixture
async def client(policy_server):
    async with openai.AsyncOpenAI(base_url=policy_server.base_url, api_key="unused", max_retries=0, timeout=60) as client:
        yield client


@pytest.fixture
async def root(policy_server):
    """The server's own routes beside /v1 (vLLM's /tokenize and /detokenize)."""
    async with httpx.AsyncClient(base_url=policy_server.base_url.removesuffix("/v1"), timeout=60) as http:
        yield http


@pytest.fixture(scope="module")
def reference_model(tiny_checkpoints):
    """The served weights in transformers' own forward, for teacher-forced log-probabilities."""
    return weights.load(str(tiny_checkpoints[0]), tiny_checkpoints[0].parent).model


def teacher_forced(model, prompt_ids: list[int], token_ids: list[int]) -> list[float]:
    """log p(token_i | prompt, tokens before i) under the model, without temperature."""
    with torch.inference_mode():
        logits = model(torch.tensor([prompt_ids + token_ids])).logits[0].float()
    logprobs = torch.log_softmax(logits[len(prompt_ids) - 1 : -1], dim=-1)
    return logprobs[torch.arange(len(token_ids)), torch.tensor(token_ids)].tolist()


def chat_prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


# logprobs


async def test_chat_logprobs_are_the_models_log_probabilities_of_the_sampled_tokens(client, tokenizer, reference_model):
    """Sampled at temperature 1.3, the logprobs are still the model's own (vLLM's raw_logprobs):
    those of a teacher-forced forward over the prompt and the sampled ids."""
    reply = await client.chat.completions.create(
        model="smollm2", messages=MESSAGES, logprobs=True, top_logprobs=4, **(SAMPLED | {"temperature": 1.3})
    )
    choice = reply.choices[0]
    ids = choice.model_extra["token_ids"]
    content = choice.logprobs.content
    assert len(content) == len(ids) == reply.usage.completion_tokens == 12
    expected = teacher_forced(reference_model, chat_prompt_ids(tokenizer, MESSAGES), ids)
    assert [entry.logprob for entry in content] == pytest.approx(expected, abs=1e-4)
    assert b"".join(bytes(entry.bytes) for entry in content).decode() == tokenizer.decode(ids)
    for entry in content:
        assert len(entry.top_logprobs) == 4
        best = [alternative.logprob for alternative in entry.top_logprobs]
        assert best == sorted(best, reverse=True) and entry.logprob <= best[0] + 1e-6


async def test_a_greedy_tokens_logprob_is_its_first_alternative(client):
    reply = await client.chat.completions.create(model="smollm2", messages=MESSAGES, logprobs=True, top_logprobs=3, **GREEDY)
    for entry in reply.choices[0].logprobs.content:
        assert entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-6)
    without = await client.chat.completions.create(model="smollm2", messages=MESSAGES, **GREEDY)
    assert without.choices[0].logprobs is None
    assert without.choices[0].message.content == reply.choices[0].message.content


async def test_streamed_chat_logprobs_add_up_to_the_plain_ones(client):
    fields = {"model": "smollm2", "messages": MESSAGES, "logprobs": True, "top_logprobs": 2, **SAMPLED}
    plain = (await client.chat.completions.create(**fields)).choices[0].logprobs.content
    streamed = []
    async for chunk in await client.chat.completions.create(stream=True, **fields):
        for choice in chunk.choices:
            streamed += choice.logprobs.content if choice.logprobs else []
    # The second request's prompt comes from the prefix cache: the same values up to float rounding.
    assert [(e.token, [t.token for t in e.top_logprobs]) for e in streamed] == [(e.token, [t.token for t in e.top_logprobs]) for e in plain]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in plain], abs=1e-5)


async def test_completion_logprobs_in_the_legacy_shape_plain_and_streamed(client, tokenizer, reference_model):
    prompt = "The lighthouse keeper"
    fields = {"model": "smollm2", "prompt": prompt, "logprobs": 3, **SAMPLED}
    choice = (await client.completions.create(**fields)).choices[0]
    logprobs, ids = choice.logprobs, choice.model_extra["token_ids"]
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == len(ids) == 12
    assert logprobs.tokens == [tokenizer.decode([i]) for i in ids]
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(12)]
    expected = teacher_forced(reference_model, tokenizer(prompt)["input_ids"], ids)
    assert logprobs.token_logprobs == pytest.approx(expected, abs=1e-4)
    assert all(1 <= len(top) <= 3 for top in logprobs.top_logprobs)

    streamed = {"tokens": [], "token_logprobs": [], "text_offset": []}
    async for chunk in await client.completions.create(stream=True, **fields):
        for part in chunk.choices:
            for key in streamed:
                streamed[key] += getattr(part.logprobs, key) if part.logprobs else []
    assert streamed["tokens"] == logprobs.tokens and streamed["text_offset"] == logprobs.text_offset
    assert streamed["token_logprobs"] == pytest.approx(logprobs.token_logprobs, abs=1e-5)  # the prompt was cached the second time


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": 2}, None),
    ],
)
async def test_logprobs_beyond_the_cap_or_without_logprobs_are_400(client, fields, param):
    with pytest.raises(openai.BadRequestError) as raised:
        await client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=2, **fields)
    assert raised.value.type == "invalid_request_error" and raised.value.param == param
    assert "top_logprobs" in raised.value.message


# n


async def test_n_samples_differ_and_are_those_of_seed_plus_index(client):
    fields = {"model": "smollm2", "messages": MESSAGES, **SAMPLED}
    reply = await client.chat.completions.create(n=3, **fields)
    texts = [choice.message.content for choice in reply.choices]
    assert [choice.index for choice in reply.choices] == [0, 1, 2] and len(set(texts)) == 3
    single = await client.chat.completions.create(**fields)
    assert reply.usage.prompt_tokens == single.usage.prompt_tokens  # the prompt counts once
    assert reply.usage.completion_tokens == 36 and reply.usage.total_tokens == reply.usage.prompt_tokens + 36
    for index, text in enumerate(texts):
        alone = await client.chat.completions.create(**(fields | {"seed": SAMPLED["seed"] + index}))
        assert alone.choices[0].message.content == text
    again = await client.chat.completions.create(n=3, **fields)
    assert [choice.message.content for choice in again.choices] == texts


async def test_n_greedy_samples_are_identical_and_decoded_together(client, policy_server):
    steps = policy_server.engine.scheduler.stats.steps
    reply = await client.completions.create(model="smollm2", prompt="Once upon a time", n=4, **GREEDY)
    assert len({choice.text for choice in reply.choices}) == 1 and len(reply.choices) == 4
    # One prefill picks every choice's first token, then one decode step a token for all four.
    assert policy_server.engine.scheduler.stats.steps - steps == GREEDY["max_tokens"] - 1


async def test_n_over_several_prompts_orders_the_choices_prompt_by_prompt(client):
    prompts = ["The river", "A violin"]
    reply = await client.completions.create(model="smollm2", prompt=prompts, n=2, **SAMPLED)
    for index, choice in enumerate(reply.choices):
        prompt, sample = divmod(index, 2)
        alone = await client.completions.create(model="smollm2", prompt=prompts[prompt], **(SAMPLED | {"seed": SAMPLED["seed"] + sample}))
        assert choice.index == index and choice.text == alone.choices[0].text


async def test_streamed_n_choices_add_up_to_the_plain_ones(client):
    fields = {"model": "smollm2", "messages": MESSAGES, "n": 3, **SAMPLED}
    plain = await client.chat.completions.create(**fields)
    texts, finishes, usage = {}, {}, None
    async for chunk in await client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **fields):
        usage = chunk.usage or usage
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            finishes[choice.index] = choice.finish_reason or finishes.get(choice.index)
    assert [texts[i].strip() for i in range(3)] == [choice.message.content for choice in plain.choices]
    assert finishes == {0: "length", 1: "length", 2: "length"}
    assert usage.completion_tokens == plain.usage.completion_tokens and usage.prompt_tokens == plain.usage.prompt_tokens


async def test_streamed_completions_take_several_prompts(client):
    fields = {"model": "smollm2", "prompt": ["The river", "A violin"], **SAMPLED}
    plain = await client.completions.create(**fields)
    texts: dict[int, str] = {}
    async for chunk in await client.completions.create(stream=True, **fields):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert [texts[0], texts[1]] == [choice.text for choice in plain.choices]


async def test_a_client_leaving_an_n_stream_stops_every_choice(policy_server):
    from tests.services.policy_server.test_api import settled

    assert await settled(policy_server) == 0
    body = {"prompt": "The sea", "n": 3, "max_tokens": 2000, "temperature": 1.0, "ignore_eos": True, "stream": True}
    async with httpx.AsyncClient(base_url=policy_server.base_url, timeout=60) as http:
        async with http.stream("POST", "/completions", json=body) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    break
            assert policy_server.engine.in_flight == 3
    assert await settled(policy_server) == 0


async def test_n_beyond_the_setting_is_400(client):
    with pytest.raises(openai.BadRequestError) as raised:
        await client.chat.completions.create(model="smollm2", messages=MESSAGES, n=17, max_tokens=2)
    assert raised.value.param == "n" and "at most 16" in raised.value.message


# fields with nothing behind them here


async def test_response_format_text_is_served_and_json_is_refused(client):
    reply = await client.chat.completions.create(model="smollm2", messages=MESSAGES, response_format={"type": "text"}, **SAMPLED)
    assert reply.choices[0].message.content and reply.usage.completion_tokens == 12
    for response_format in ({"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}):
        with pytest.raises(openai.BadRequestError) as raised:
            await client.chat.completions.create(model="smollm2", messages=MESSAGES, response_format=response_format, max_tokens=2)
        assert raised.value.param == "response_format" and "guided decoding" in raised.value.message


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"frequency_penalty": 2.5}, "frequency_penalty"),
        ({"presence_penalty": -2.5}, "presence_penalty"),
        ({"logit_bias": {"42": 5}}, "logit_bias"),
        ({"tools": TOOLS, "tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "python"}}}, "tool_choice"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"extra_body": {"top_k": 5}}, "top_k"),
        ({"extra_body": {"guided_json": {"type": "object"}}}, "guided_json"),
    ],
)
async def test_chat_fields_the_server_cannot_honour_are_400_naming_the_field(client, fields, param):
    with pytest.raises(openai.BadRequestError) as raised:
        await client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=2, **fields)
    assert raised.value.param == param and raised.value.type == "invalid_request_error"
    assert param in raised.value.message


async def test_greedy_with_penalties_picks_the_best_token_less_them(client, tokenizer, reference_model):
    """OpenAI's penalties: each token is the argmax of the model's logits less frequency_penalty
    per time and presence_penalty once for every token generated before it (the prompt's don't count)."""
    reply = await client.chat.completions.create(model="smollm2", messages=MESSAGES, frequency_penalty=1.5, presence_penalty=0.5, **GREEDY)
    ids = reply.choices[0].model_extra["token_ids"]
    prompt = chat_prompt_ids(tokenizer, MESSAGES)
    with torch.inference_mode():
        logits = reference_model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
    decided_by_penalty = 0
    for position, token in enumerate(ids):
        less = logits[position].clone()
        for earlier, times in Counter(ids[:position]).items():
            less[earlier] -= 1.5 * times + 0.5
        assert int(less.argmax()) == token
        decided_by_penalty += int(logits[position].argmax()) != token
    assert decided_by_penalty
    plain = await client.chat.completions.create(model="smollm2", messages=MESSAGES, **GREEDY)
    assert plain.choices[0].model_extra["token_ids"] != ids


async def test_neutral_values_of_those_fields_are_served(client):
    fields = {"frequency_penalty": 0, "presence_penalty": 0, "logit_bias": {}, "extra_body": GREEDY["extra_body"] | {"top_k": -1}}
    reply = await client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=12, temperature=0, **fields)
    plain = await client.chat.completions.create(model="smollm2", messages=MESSAGES, **GREEDY)
    assert reply.choices[0].message.content == plain.choices[0].message.content


@pytest.mark.parametrize(("fields", "param"), [({"echo": True}, "echo"), ({"best_of": 3}, "best_of"), ({"suffix": "end"}, "suffix")])
async def test_completion_fields_the_server_cannot_honour_are_400(client, fields, param):
    with pytest.raises(openai.BadRequestError) as raised:
        await client.completions.create(model="smollm2", prompt="hi", max_tokens=2, **fields)
    assert raised.value.param == param


# tools


async def tokenized(root, **body) -> dict:
    response = await root.post("/tokenize", json={"model": "smollm2", **body})
    assert response.status_code == 200, response.text
    return response.json()


async def prompt_text(root, **body) -> str:
    ids = (await tokenized(root, **body))["tokens"]
    response = await root.post("/detokenize", json={"model": "smollm2", "tokens": ids})
    return response.json()["prompt"]


async def test_declared_tools_reach_the_prompt_and_tool_choice_none_drops_them(client, root):
    text = await prompt_text(root, messages=MESSAGES, tools=TOOLS)
    assert '"name": "python"' in text and "Runs Python code and returns what it prints" in text
    assert "python" not in await prompt_text(root, messages=MESSAGES, tools=TOOLS, tool_choice="none")
    for tool_choice in ("auto", "none"):
        reply = await client.chat.completions.create(model="smollm2", messages=MESSAGES, tools=TOOLS, tool_choice=tool_choice, **GREEDY)
        served = await tokenized(root, messages=MESSAGES, tools=TOOLS, tool_choice=tool_choice)
        assert reply.usage.prompt_tokens == served["count"]  # the chat request rendered what /tokenize shows
    plain = await tokenized(root, messages=MESSAGES)
    assert served["count"] == plain["count"]


async def test_tool_calls_and_results_in_the_history_are_rendered(root):
    history = MESSAGES + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "python", "arguments": '{"code": "print(17*23)"}'}},
                {"id": "call_2", "type": "function", "function": {"name": "python", "arguments": '{"code": "print(2**10)"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "391"},
        {"role": "tool", "tool_call_id": "call_2", "content": "1024"},
    ]
    text = await prompt_text(root, messages=history, tools=TOOLS)
    assert "print(17*23)" in text and "print(2**10)" in text
    assert text.index("391") < text.index("1024") and text.index("print(2**10)") < text.index("391")


async def test_add_generation_prompt_false_leaves_the_assistant_turn_unopened(root):
    opened = await prompt_text(root, messages=MESSAGES)
    closed = await prompt_text(root, messages=MESSAGES, add_generation_prompt=False)
    assert opened.startswith(closed) and opened[len(closed) :].strip() and not closed.rstrip().endswith("assistant")


# errors


async def test_an_unknown_model_is_404_model_not_found(client):
    with pytest.raises(openai.NotFoundError) as raised:
        await client.chat.completions.create(model="gpt-4", messages=MESSAGES, max_tokens=2)
    assert raised.value.type == "not_found_error" and raised.value.code == "model_not_found" and raised.value.param == "model"
    assert "gpt-4" in raised.value.message and "smollm2" in raised.value.message
    with pytest.raises(openai.NotFoundError):
        await client.completions.create(model="gpt-4", prompt="hi", max_tokens=2)


async def test_the_responses_api_is_an_openai_shaped_404_pointing_to_chat_completions(client):
    with pytest.raises(openai.NotFoundError) as raised:
        await client.responses.create(model="smollm2", input="hi")
    assert "/v1/chat/completions" in raised.value.message and raised.value.type == "not_found_error"


async def test_unknown_routes_and_methods_answer_in_openais_shape(policy_server):
    async with httpx.AsyncClient(base_url=policy_server.base_url, timeout=10) as http:
        missing = await http.post("/embeddings", json={"input": "hi"})
        wrong_method = await http.get("/chat/completions")
    assert missing.status_code == 404 and set(missing.json()) == {"error"}
    assert "POST /v1/embeddings" in missing.json()["error"]["message"]
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]["type"] == "invalid_request_error"


# the server's own chat template

TEMPLATE = """{%- for message in messages -%}
<{{ message.role }}>{{ message.content }}
{%- for call in message.tool_calls or [] %}[call {{ call.function.name }} {{ call.function.arguments.code }}]{% endfor -%}
</{{ message.role }}>
{% endfor -%}
{%- if tools %}<tools>{% for tool in tools %}{{ tool.function.name }}: {{ tool.function.description }};{% endfor %}</tools>
{% endif -%}
{%- if mood is defined %}<mood>{{ mood }}</mood>
{% endif -%}
{%- if add_generation_prompt %}<assistant>{% endif -%}"""


async def test_a_chat_template_of_the_servers_own_renders_tools_calls_and_template_kwargs(tmp_path, tiny_checkpoints):
    from gearshift.services.policy_server.server import running

    from tests.services.policy_server.conftest import policy_settings

    template = tmp_path / "template.jinja"
    template.write_text(TEMPLATE)
    history = [
        *MESSAGES,
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "python", "arguments": '{"code": "1+1"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "2"},
    ]
    async with running(policy_settings(tmp_path, tiny_checkpoints[0], chat_template=str(template))) as server:
        async with httpx.AsyncClient(base_url=server.base_url.removesuffix("/v1"), timeout=60) as root:
            body = {"messages": history, "tools": TOOLS, "chat_template_kwargs": {"mood": "calm"}}
            text = await prompt_text(root, **body)
            assert text == (
                "<user>Tell me about the sea.</user>\n<assistant>[call python 1+1]</assistant>\n<tool>2</tool>\n"
                "<tools>python: Runs Python code and returns what it prints;</tools>\n<mood>calm</mood>\n<assistant>"
            )
            clash = await root.post("/tokenize", json={"messages": MESSAGES, "chat_template_kwargs": {"tools": []}})
            assert clash.status_code == 400 and "may not set tools" in clash.json()["error"]["message"]
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0) as client:
            extra = GREEDY["extra_body"] | {"chat_template_kwargs": {"mood": "calm"}}
            reply = await client.chat.completions.create(model="smollm2", messages=history, tools=TOOLS, **(GREEDY | {"extra_body": extra}))
            assert reply.usage.prompt_tokens == len(server.engine.current.tokenizer(text, add_special_tokens=False)["input_ids"])


# the A^2FM chat template (the default policy's)

A2FM_STEP = (
    "This question needs tools to answer reliably.\n<classification>\ntoolcalling_agent\n</classification>\n"
    "<plan>multiply with python</plan>\n<tool_call>\n{'id': 1, 'name': 'python', 'arguments': {'code': 'print(48213 * 7719)'}}\n"
    "{'id': 2, 'name': 'python', 'arguments': {'code': 'print(2 ** 10)'}}\n"
)


@pytest.fixture(scope="module")
async def a2fm_server(tmp_path_factory, tiny_checkpoints):
    """The tiny model served with the A^2FM template, as the default policy is."""
    from gearshift.services.policy_server.server import running

    from tests.services.policy_server.conftest import policy_settings

    async with running(policy_settings(tmp_path_factory.mktemp("a2fm"), tiny_checkpoints[0], chat_template="a2fm")) as server:
        yield server


async def test_the_a2fm_template_writes_declared_tools_calls_and_results_as_the_protocol_does(a2fm_server):
    from gearshift.protocol import a2fm
    from gearshift.protocol.parsers import a2fm as a2fm_format

    history = [
        {"role": "user", "content": "What is 17*23?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_7", "type": "function", "function": {"name": "python", "arguments": '{"code": "print(17*23)"}'}}]},
        {"role": "tool", "tool_call_id": "call_7", "content": "391"},
    ]
    async with httpx.AsyncClient(base_url=a2fm_server.base_url.removesuffix("/v1"), timeout=60) as root:
        text = await prompt_text(root, messages=history, tools=TOOLS)
        count = (await tokenized(root, messages=history, tools=TOOLS))["count"]
    assert a2fm_format.render_tools_line(TOOLS) in text  # "Tools: python(code) Runs Python code and returns what it prints."
    assert "<tool_call>\n{'id': 1, 'name': 'python', 'arguments': {'code': 'print(17*23)'}}\n</tool_call>" in text
    assert text.endswith(a2fm.tool_response([("1", "391")]))  # the turn goes on after the result: no new turn
    async with openai.AsyncOpenAI(base_url=a2fm_server.base_url, api_key="unused", max_retries=0) as client:
        reply = await client.chat.completions.create(model="smollm2", messages=history, tools=TOOLS, **GREEDY)
    assert reply.usage.prompt_tokens == count


async def test_a2fm_requests_asking_for_openais_fields_stop_where_the_step_pauses(a2fm_server):
    from gearshift.protocol.parsers import a2fm as a2fm_format
    from gearshift.services.policy_server.core import ReplyFormat
    from gearshift.services.policy_server.schemas import ChatCompletionRequest

    engine = a2fm_server.engine
    with_tools = engine.chat_jobs(ChatCompletionRequest(messages=MESSAGES, tools=TOOLS, stop=["END"]))
    assert with_tools.jobs[0].params.stop == ["END", *a2fm_format.STOP_WORDS]
    assert with_tools.reply == ReplyFormat("a2fm", {"state": a2fm_format.START, "parse_tools": True})
    thinking = engine.chat_jobs(ChatCompletionRequest(messages=MESSAGES, chat_template_kwargs={"enable_thinking": True}))
    assert thinking.reply == ReplyFormat("a2fm", {"state": a2fm_format.DELIBERATE, "parse_tools": False})
    plain = engine.chat_jobs(ChatCompletionRequest(messages=MESSAGES))  # the text protocol's requests: as before
    assert plain.reply.name == "think" and plain.jobs[0].params.stop == []


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_an_a2fm_step_reads_as_reasoning_and_parallel_calls_whole_and_streamed(size):
    from gearshift.services.policy_server.core import ReplyFormat

    reply = ReplyFormat("a2fm", {"state": "start", "parse_tools": True})
    whole = reply.split(A2FM_STEP)
    assert whole.reasoning.startswith("This question needs tools") and "<plan>multiply with python</plan>" in whole.reasoning
    assert whole.content is None
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in whole.tool_calls] == [
        ("call_1", "python", '{"code": "print(48213 * 7719)"}'), ("call_2", "python", '{"code": "print(2 ** 10)"}')]
    splitter = reply.splitter()
    pieces = [piece for start in range(0, len(A2FM_STEP), size) for piece in splitter.feed(A2FM_STEP[start : start + size])]
    pieces += splitter.finish()
    assert "".join(p.text for p in pieces if p.kind == "reasoning") == whole.reasoning
    assert [p.call for p in pieces if p.kind == "tool_call"] == whole.tool_calls


def test_the_default_policy_gets_the_a2fm_template_only_for_requests_asking_for_native_fields(policy_server, tokenizer):
    """The platform's own prompts (the planner's, the judge's: no tools) keep the model's template."""
    import dataclasses

    from gearshift.services.policy_server.schemas import ChatCompletionRequest

    engine = policy_server.engine
    default_policy = dataclasses.replace(engine.current, source=weights.DEFAULT)
    plain = engine.chat_prompt(default_policy, ChatCompletionRequest(messages=MESSAGES))
    assert plain.text == tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True) and not plain.stop
    tools = engine.chat_prompt(default_policy, ChatCompletionRequest(messages=MESSAGES, tools=TOOLS))
    assert tools.text.startswith("<|im_start|>system\nYou are an adaptive agent.") and "Tools: python(code)" in tools.text
    assert tools.reply.options["state"] == "start" and tools.stop == ["</tool_call>", "</answer>"]
    thinking = engine.chat_prompt(default_policy, ChatCompletionRequest(messages=MESSAGES, chat_template_kwargs={"enable_thinking": False}))
    assert thinking.text.endswith("<classification>\ndefault_agent\n</classification>\n<answer>")  # instant, pinned
    other_weights = engine.chat_prompt(engine.current, ChatCompletionRequest(messages=MESSAGES, tools=TOOLS))
    assert other_weights.text.startswith("<|im_start|>system\nYou may call one or more functions")  # hermes, as before
