"""The native protocol (policy_client.protocol: native) over real gRPC against the real router,
planner, sandbox, reward and store (Postgres). The model is the ScriptedPolicy stand-in answering
in the OpenAI chat shape an engine's parsers return (tool_calls, reasoning_content), so parallel
calls, bad calls and answers happen deterministically."""

from __future__ import annotations

import json

import pytest
from gearshift.api.common.v1.common_pb2 import Mode, PlanDecision, PolicyProtocol, RoutingStrategy, TrajectoryStatus
from gearshift.api.executor.v1 import executor_pb2
from gearshift.embedded import embedded
from gearshift.pricing import CostTable
from gearshift.protocol import native
from gearshift.protocol.sr2am import PLAN_OPENER, render_plan
from gearshift.teaching.endpoint import stand_in_render
from gearshift.testing.scripted_policy import serve_scripted
from gearshift.training import tokenization
from gearshift.training.tiny import tiny_checkpoint
from transformers import AutoTokenizer

from tests.services.executor.test_episode import solve, stored

PLAN = " need 17*23\n- Action: run python\n- Expected Outcome: the product\n- Next Action: answer\n- Expected Outcome: done"
PARALLEL = [{"name": "python", "arguments": {"code": "print(17*23)"}}, {"name": "python", "arguments": {"code": "print(17+23)"}}]
BAD = [
    {"name": "python", "arguments": {"code": "print(17*23)"}},
    {"name": "no_such_tool", "arguments": {}},
    {"name": "python", "arguments": "{'code': 'print(1)'"},  # not JSON
]
BAD_QUERY = "Compute 17*23 carelessly."
CUT_QUERY = "Write a long essay."


class NativeModel:
    """Routes to tools, plans once (the configurator and planner continuing its own message:
    completions of the conversation as /tokenize rendered it), calls python twice in parallel
    (or makes bad calls, for BAD_QUERY), then answers from the results; instant and reasoning
    mode answer at once. Keeps every request body."""

    def __init__(self):
        self.bodies: list[dict] = []

    def __call__(self, body: dict) -> str | dict:
        self.bodies.append(body)
        if "prompt" in body:  # the SR2AM block: a new plan on the first turn, then "continue"
            if body["prompt"].endswith(PLAN_OPENER):
                return PLAN
            return "\n" if "<|im_start|>tool" in body["prompt"] else "\n- Current State:"
        messages = body["messages"]
        first = messages[0]["content"]
        if "</classification>" in (body.get("stop") or []):
            return "Arithmetic is safer with a tool.\n<classification>\ntoolcalling_agent\n</classification>"
        assert first.startswith(native.SYSTEM_PROMPT), first
        if not body.get("tools"):
            if messages[1]["content"] == CUT_QUERY:
                return {"content": "Let me start by", "finish_reason": "length"}
            if body["chat_template_kwargs"]["enable_thinking"]:
                return {"reasoning_content": "17*23 = 391.", "content": "391"}
            return {"content": "42"}
        if "<|im_start|>tool" in stand_in_render(body):
            return {"reasoning_content": "The tool says 391.", "content": "391"}
        return {"reasoning_content": "I will compute it.", "tool_calls": BAD if messages[1]["content"] == BAD_QUERY else PARALLEL}


@pytest.fixture
async def stack(settings, postgres_url):
    model = NativeModel()
    async with serve_scripted(model) as policy_url:
        async with embedded(native_settings(settings, policy_url, postgres_url)) as platform:
            yield platform.settings, model


def native_settings(settings, policy_url: str, database_url: str):
    served = settings.with_policy(policy_url)
    client = served.policy_client.model_copy(update={"protocol": "native"})
    return served.model_copy(update={"database_url": database_url, "policy_client": client})


def generations(model: NativeModel) -> list[dict]:
    return [body for body in model.bodies if "messages" in body and body["messages"][0]["content"].startswith(native.SYSTEM_PROMPT)]


async def test_agentic_episode_plans_calls_tools_in_parallel_and_answers(stack):
    settings, model = stack
    events = await solve(settings, query="What is 17*23?", reference_answer="391")
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[0] == "mode_chosen" and kinds[-1] == "final"
    assert events[0].mode_chosen.mode == Mode.MODE_AGENTIC and events[0].mode_chosen.strategy == RoutingStrategy.ROUTING_STRATEGY_MODEL
    assert kinds.index("plan") < kinds.index("tool_call") < kinds.index("tool_result") < kinds.index("answer")
    reasoning = [e.chunk.reasoning for e in events if e.WhichOneof("event") == "chunk" and e.chunk.reasoning]
    assert reasoning == ["I will compute it.", "The tool says 391."]  # streamed apart from the content
    results = [e.tool_result for e in events if e.WhichOneof("event") == "tool_result"]
    assert [(r.call_id, r.output.strip(), r.is_error) for r in results] == [("call_1", "391", False), ("call_2", "40", False)]

    trajectory = events[-1].final.trajectory
    assert trajectory.protocol == PolicyProtocol.POLICY_PROTOCOL_NATIVE
    assert trajectory.status == TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED and trajectory.answer == "391"
    assert trajectory.reward.correct and trajectory.reward.format_valid  # a well-formed native episode
    first, second = trajectory.turns
    assert first.plan_decision == PlanDecision.PLAN_DECISION_PLAN_NEW and len(first.plan.steps) == 2
    assert second.plan_decision == PlanDecision.PLAN_DECISION_CONTINUE
    assert first.output == "" and first.reasoning_content == "I will compute it."
    assert [(c.id, c.name, json.loads(c.arguments_json)) for c in first.tool_calls] == [
        ("call_1", "python", {"code": "print(17*23)"}), ("call_2", "python", {"code": "print(17+23)"})]
    assert second.output == "391" and second.reasoning_content == "The tool says 391." and not second.tool_calls
    assert trajectory.cost.tools_usd == pytest.approx(2 * settings.prices.tool_per_call["python"])
    assert trajectory.planning.mean_plan_depth == 2

    declared = json.loads(trajectory.native.tools_json)
    assert {tool["function"]["name"] for tool in declared} == {"python", "web_search", "crawl_page"}
    assert declared[0]["function"]["parameters"]["type"] == "object"
    assert json.loads(trajectory.native.chat_template_kwargs_json) == {"enable_thinking": True}
    assert await stored(settings, trajectory.id) == trajectory


async def test_each_request_is_the_conversation_so_far_continuing_the_turns_sr2am_block(stack):
    settings, model = stack
    trajectory = (await solve(settings, query="What is 17*23?"))[-1].final.trajectory
    first, second = generations(model)
    plan = {"role": "assistant", "content": render_plan(trajectory.turns[0].plan) + "\n<plan>"}  # as the text protocol's transcript
    assert plan["content"].startswith("Plan:\n- Current State: need 17*23")
    assert first["messages"][1:] == [{"role": "user", "content": "What is 17*23?"}, plan]  # the plan, continued by the generation
    assert first["continue_final_message"] and not first["add_generation_prompt"]
    assert first["tools"] == second["tools"] == json.loads(trajectory.native.tools_json)
    assert first["chat_template_kwargs"] == {"enable_thinking": True} and first["return_token_ids"]
    # The configurator and the planner continued the same conversation after "Plan:" (rendered by the engine).
    decided = [body["prompt"] for body in model.bodies if "prompt" in body]
    opening = [*first["messages"][:2], {"role": "assistant", "content": "Plan:"}]
    assert decided[0] == stand_in_render({"messages": opening, "continue_final_message": True})
    assert decided[1].endswith("<|im_start|>assistant\n" + PLAN_OPENER) and decided[2].endswith("<|im_start|>tool\n40<|im_end|>\n<|im_start|>assistant\n\nPlan:")
    assistant, *tools, continuing = second["messages"][3:]
    assert continuing == {"role": "assistant", "content": "\nPlan:\n\n"}  # the second turn continues the plan
    assert assistant == {
        "role": "assistant", "content": "", "reasoning": "I will compute it.", "reasoning_content": "I will compute it.",
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "python", "arguments": '{"code": "print(17*23)"}'}},
                       {"id": "call_2", "type": "function", "function": {"name": "python", "arguments": '{"code": "print(17+23)"}'}}],
    }
    assert tools == [{"role": "tool", "tool_call_id": "call_1", "content": "391"}, {"role": "tool", "tool_call_id": "call_2", "content": "40"}]
    # What training renders is what was served: the stored conversation is the last request plus the answer.
    served = native.messages(await stored(settings, trajectory.id))
    assert served[:-1] == second["messages"] and served[-1]["content"] == "391"


async def test_bad_calls_become_error_results_the_model_reads(stack):
    settings, model = stack
    trajectory = (await solve(settings, query=BAD_QUERY, reference_answer="391"))[-1].final.trajectory
    turn = trajectory.turns[0]
    assert [c.name for c in turn.tool_calls] == ["python", "no_such_tool", "python"]
    assert turn.tool_calls[2].arguments_json == "{}"  # sent back as an object; the model's text is in the error
    ok, unknown, bad_json = turn.tool_results
    assert ok.output.strip() == "391" and not ok.is_error
    assert unknown.is_error and unknown.name == "" and "Unknown tool 'no_such_tool'" in unknown.error
    assert bad_json.is_error and bad_json.name == "" and "not a JSON object: {'code': 'print(1)'" in bad_json.error
    told = generations(model)[-1]["messages"][-4:-1]  # then the next turn's SR2AM block
    assert [m["tool_call_id"] for m in told] == ["call_1", "call_2", "call_3"]
    assert told[1]["content"].startswith("Error: Unknown tool 'no_such_tool'; available: crawl_page, python, web_search")
    assert trajectory.answer == "391" and trajectory.reward.correct
    assert not trajectory.reward.format_valid  # refused calls: not a well-formed native episode
    assert trajectory.cost.tools_usd == pytest.approx(settings.prices.tool_per_call["python"])  # refused calls never ran
    assert trajectory.cost == CostTable.from_prices(settings.prices).price_trajectory(trajectory)


@pytest.mark.parametrize(("mode", "thinking", "answer"), [(Mode.MODE_INSTANT, False, "42"), (Mode.MODE_REASONING, True, "391")])
async def test_direct_modes_answer_in_one_message_without_tools(stack, mode, thinking, answer):
    settings, model = stack
    events = await solve(settings, query="What is 17*23?", mode=mode, reference_answer="391")
    trajectory = events[-1].final.trajectory
    (body,) = generations(model)
    assert "tools" not in body and body["chat_template_kwargs"] == {"enable_thinking": thinking}
    assert body["messages"] == native.prompt_messages("What is 17*23?")
    assert trajectory.mode == mode and trajectory.routing_strategy == RoutingStrategy.ROUTING_STRATEGY_FORCED
    assert trajectory.answer == answer and trajectory.reward.correct == (answer == "391")
    assert trajectory.reward.format_valid
    (turn,) = trajectory.turns
    assert turn.reasoning_content == ("17*23 = 391." if thinking else "") and not turn.plan_decision
    assert trajectory.native.tools_json == "" and json.loads(trajectory.native.chat_template_kwargs_json) == {"enable_thinking": thinking}
    assert [e.chunk.text for e in events if e.WhichOneof("event") == "chunk" and e.chunk.text] == [answer]


async def test_a_message_cut_by_the_token_limit_is_no_answer(stack):
    settings, _ = stack
    trajectory = (await solve(settings, query=CUT_QUERY, mode=Mode.MODE_INSTANT))[-1].final.trajectory
    assert trajectory.status == TrajectoryStatus.TRAJECTORY_STATUS_BUDGET_EXHAUSTED and trajectory.answer == ""
    assert [turn.output for turn in trajectory.turns] == ["Let me start by"]  # kept, as sampled


async def test_the_stored_trajectory_keeps_the_sampled_ids(stack):
    """The stand-in's ids are its characters: reasoning, content, then each call's name and arguments."""
    settings, _ = stack
    trajectory = await stored(settings, (await solve(settings, query="What is 17*23?"))[-1].final.trajectory.id)
    first, second = ("".join(map(chr, turn.token_ids)) for turn in trajectory.turns)
    assert first == 'I will compute it.python{"code": "print(17*23)"}python{"code": "print(17+23)"}'
    assert second == "The tool says 391.391"
    assert trajectory.usage.input_tokens > sum(turn.usage.input_tokens for turn in trajectory.turns) > 0  # routing is the trajectory's


async def test_a_step_budget_ends_without_an_answer(stack):
    settings, _ = stack
    trajectory = (await solve(settings, query="What is 17*23?", budget=executor_pb2.Budget(max_steps=1)))[-1].final.trajectory
    assert trajectory.status == TrajectoryStatus.TRAJECTORY_STATUS_BUDGET_EXHAUSTED
    assert trajectory.answer == "" and len(trajectory.turns) == 1 and len(trajectory.turns[0].tool_results) == 2


# A chat template in Qwen3's form (hermes tools in the system message, <think> for the reasoning,
# <tool_call> JSON per call, tool results as <tool_response> user turns), so that training is
# checked on a template that renders tools and calls; SmolLM2's own ChatML template drops them.
TOOL_TEMPLATE = """
{%- if tools -%}
{{- '<|im_start|>system\\n' + messages[0].content + '\\n\\n# Tools\\n<tools>' -}}
{%- for tool in tools %}{{- '\\n' + (tool | tojson) -}}{% endfor -%}
{{- '\\n</tools><|im_end|>\\n' -}}
{%- else -%}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' -}}
{%- endif -%}
{%- for message in messages[1:] -%}
{%- if message.role == 'assistant' -%}
{{- '<|im_start|>assistant\\n' -}}
{%- if message.reasoning_content -%}{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' -}}{%- endif -%}
{{- message.content -}}
{%- for call in message.tool_calls or [] -%}
{{- '\\n<tool_call>\\n{"name": "' + call.function.name + '", "arguments": ' + (call.function.arguments | tojson) + '}\\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\\n' -}}
{%- elif message.role == 'tool' -%}
{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' -}}
{%- else -%}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\\n' -}}
{%- if enable_thinking is defined and not enable_thinking -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}
{%- endif -%}
"""


@pytest.fixture
def tokenizer(tmp_path):
    """The default policy's tokenizer (SmolLM2's), from a tiny checkpoint that ships it."""
    return AutoTokenizer.from_pretrained(tiny_checkpoint(tmp_path / "tiny"), local_files_only=True)


def learned_runs(tokenizer, encoded) -> list[str]:
    """The learned stretches of an encoding, decoded."""
    runs, current = [], []
    for token, learned in zip(encoded.input_ids, encoded.target):
        if learned:
            current.append(token)
        elif current:
            runs, current = runs + [tokenizer.decode(current)], []
    return runs + ([tokenizer.decode(current)] if current else [])


@pytest.mark.parametrize("template", [TOOL_TEMPLATE, None], ids=["tool-template", "smollm2-chatml"])
async def test_training_renders_a_stored_native_trajectory_through_the_chat_template(stack, tokenizer, template):
    settings, _ = stack
    trajectory = await stored(settings, (await solve(settings, query="What is 17*23?"))[-1].final.trajectory.id)
    if template is not None:
        tokenizer.chat_template = template
    chat = native.template_messages(native.messages(trajectory))
    rendered = tokenizer.apply_chat_template(chat, tools=native.served_tools(trajectory), tokenize=False, enable_thinking=True)
    encoded = tokenization.encode_trajectory(tokenizer, trajectory)
    assert tokenizer.decode(encoded.input_ids) == rendered
    generated = learned_runs(tokenizer, encoded)
    assert len(generated) == 2 and all(run.endswith("<|im_end|>") for run in generated)  # each generation, to its end marker
    if template is not None:
        assert generated == [
            '<think>\nI will compute it.\n</think>\n\n\n<tool_call>\n{"name": "python", "arguments": {"code": "print(17*23)"}}\n</tool_call>'
            '\n<tool_call>\n{"name": "python", "arguments": {"code": "print(17+23)"}}\n</tool_call><|im_end|>',
            "<think>\nThe tool says 391.\n</think>\n\n391<|im_end|>",
        ]
    learned = "".join(generated)
    for masked in (native.SYSTEM_PROMPT, "What is 17*23?", "Plan:", "<tool_response>", "<|im_start|>"):
        assert masked not in learned
    prompt = tokenizer.apply_chat_template(chat[:2], tools=native.served_tools(trajectory), tokenize=False, add_generation_prompt=True)
    assert rendered.startswith(prompt) and not any(encoded.target[: len(tokenizer(prompt, add_special_tokens=False)["input_ids"])])


async def test_training_learns_the_sampled_ids_of_a_native_generation(stack, tokenizer):
    """Where a turn kept the ids it sampled, they are the learned tokens as far as they decode to
    the template's rendering; with exact, the rest of the learned text (here the other turn,
    whose stand-in ids are no tokenizer's) is masked."""
    settings, _ = stack
    trajectory = await stored(settings, (await solve(settings, query="What is 17*23?"))[-1].final.trajectory.id)
    tokenizer.chat_template = TOOL_TEMPLATE
    answer = tokenization.native_segments(tokenizer, trajectory)[-2]
    assert answer.target and answer.text == "<think>\nThe tool says 391.\n</think>\n\n391<|im_end|>"
    by_character = [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(c))[0] for c in answer.text.split("<|im_end|>")[0]]
    sampled = by_character + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    trajectory.turns[1].ClearField("token_ids")
    trajectory.turns[1].token_ids.extend(sampled)
    encoded = tokenization.encode_trajectory(tokenizer, trajectory, exact=True)
    kept = [token for token, learned in zip(encoded.input_ids, encoded.target) if learned]
    assert kept == sampled  # the first turn's stand-in ids decode to nothing it rendered: masked
    assert encoded.unsampled == len(tokenizer(tokenization.native_segments(tokenizer, trajectory)[1].text, add_special_tokens=False)["input_ids"])
