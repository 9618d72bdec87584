"""The A^2FM chat template (gearshift/protocol/a2fm_chat_template.jinja) through transformers'
apply_chat_template with the real SmolLM2 tokenizer: the default policy's prompts token for
token as its own template renders them, the declared tools in the system prompt, tool calls and
results as the executor's transcript writes them, and the modes enable_thinking pins."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from gearshift import weights
from gearshift.api.common.v1.common_pb2 import (
    ChatMessage,
    ChatRole,
    Conversation,
    Mode,
    NativeRequest,
    Plan,
    PlanDecision,
    PlanStep,
    PolicyProtocol,
    ToolCall,
    ToolResult,
    Trajectory,
    Turn,
)
from gearshift.protocol import a2fm, native, prompts
from gearshift.protocol.parsers import a2fm as a2fm_format
from gearshift.protocol.sr2am import plan_block, render_plan
from gearshift.training import tokenization
from gearshift.settings import Settings

TEMPLATE = Path(a2fm.__file__).with_name("a2fm_chat_template.jinja")
TOOL = {"type": "function", "function": {"name": "python", "description": "runs Python and returns what it prints",
                                         "parameters": {"type": "object", "properties": {"code": {"type": "string"}}}}}
CODE = "print(48213 * 7719)"


@pytest.fixture(scope="module")
def tokenizer():
    return weights.smollm2_tokenizer(Settings().models_dir)


def a2fm_render(tokenizer, chat, tokenize=False, **kwargs):
    return tokenizer.apply_chat_template(chat, chat_template=TEMPLATE.read_text(), tokenize=tokenize, **kwargs)


CONVERSATION = Conversation(instructions="Answer in French.", messages=[
    ChatMessage(role=ChatRole.CHAT_ROLE_USER, content="Hi"), ChatMessage(role=ChatRole.CHAT_ROLE_ASSISTANT, content="Hello!")])


@pytest.mark.parametrize(("chat", "flags"), [
    (prompts.messages("What is 48213 * 7719?"), {"add_generation_prompt": True}),
    (prompts.messages("What is 48213 * 7719?", a2fm.forced_prefix(Mode.MODE_AGENTIC) + "Plan: None\n<plan>"), {"continue_final_message": True}),
    (prompts.messages("What is 48213 * 7719?", conversation=CONVERSATION), {"add_generation_prompt": True}),
    (prompts.messages("Why?", "Because", conversation=CONVERSATION), {"continue_final_message": True}),
    (prompts.messages("What is 48213 * 7719?", "x"), {}),
])
def test_the_default_policys_prompts_are_token_identical(tokenizer, chat, flags):
    assert a2fm_render(tokenizer, chat, tokenize=True, **flags) == tokenizer.apply_chat_template(chat, tokenize=True, **flags)


def test_no_system_message_gets_the_platforms_prompt(tokenizer):
    chat = prompts.messages("What is the capital of France?")
    ids = a2fm_render(tokenizer, chat[1:], tokenize=True, add_generation_prompt=True)
    assert ids == tokenizer.apply_chat_template(chat, tokenize=True, add_generation_prompt=True)


def test_the_declared_tools_are_the_system_prompts_tool_line(tokenizer):
    lookup = {"type": "function", "function": {"name": "lookup", "description": "Finds a word.", "parameters": {
        "type": "object", "properties": {"word": {"type": "string"}}}}}
    text = a2fm_render(tokenizer, [{"role": "user", "content": "q"}], tools=[TOOL, lookup], add_generation_prompt=True)
    line = a2fm_format.render_tools_line([TOOL, lookup])
    assert line == "Tools: python(code) runs Python and returns what it prints; lookup(word) Finds a word."
    default_line = prompts.SYSTEM_PROMPT.rsplit("\n", 1)[1]
    assert text.startswith(f"<|im_start|>system\n{prompts.SYSTEM_PROMPT.replace(default_line, line)}<|im_end|>\n")
    # The platform's tools, declared, are the trained prompt itself.
    declared = a2fm_render(tokenizer, [{"role": "user", "content": "q"}], tools=a2fm_format.DEFAULT_TOOLS, add_generation_prompt=True)
    assert declared == a2fm_render(tokenizer, prompts.messages("q"), add_generation_prompt=True)


def test_a_clients_system_message_follows_the_platforms_prompt(tokenizer):
    text = a2fm_render(tokenizer, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "q"}])
    assert text.startswith(f"<|im_start|>system\n{prompts.SYSTEM_PROMPT}\n\nBe brief.<|im_end|>\n")


def tool_loop(arguments) -> list[dict]:
    calls = [{"id": "call_1", "type": "function", "function": {"name": "python", "arguments": arguments}},
             {"id": "call_2", "type": "function", "function": {"name": "python", "arguments": {"code": "print(2)"}}}]
    return [
        {"role": "user", "content": "What is 48213 * 7719?"},
        {"role": "assistant", "content": None, "reasoning_content": "Goal: the product.</plan>", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_2", "content": "2\n"},
        {"role": "tool", "tool_call_id": "call_1", "content": "372156147\n"},
    ]


def test_a_tool_loop_is_one_growing_assistant_turn_as_the_executor_writes_it(tokenizer):
    text = a2fm_render(tokenizer, tool_loop({"code": CODE}), tools=[TOOL], add_generation_prompt=True)
    turn = text.split("<|im_start|>assistant\n", 1)[1]
    block = ("Goal: the product.</plan>\n<tool_call>\n"
             f"{{'id': 1, 'name': 'python', 'arguments': {{'code': '{CODE}'}}}}\n"
             "{'id': 2, 'name': 'python', 'arguments': {'code': 'print(2)'}}\n</tool_call>")
    assert turn == block + a2fm.tool_response([("2", "2"), ("1", "372156147")])  # the turn stays open for the model
    # The same calls read back from the turn are the calls sent.
    parsed = a2fm_format.A2FMSplitter.parse(block)
    assert [c["function"] for c in parsed.tool_calls] == [{"name": "python", "arguments": json.dumps({"code": c})} for c in (CODE, "print(2)")]
    assert parsed.reasoning == "Goal: the product.</plan>"


def test_arguments_as_a_json_string_render_too(tokenizer):
    text = a2fm_render(tokenizer, tool_loop(json.dumps({"code": CODE})), tools=[TOOL])
    assert f"{{'id': 1, 'name': 'python', 'arguments': {json.dumps({'code': CODE})}}}" in text
    assert text.endswith("</tool_response>\n<|im_end|>\n")


def test_the_answer_after_the_tools_continues_the_turn(tokenizer):
    chat = tool_loop({"code": CODE}) + [{"role": "assistant", "content": "372156147", "reasoning_content": "The tool printed it."}]
    text = a2fm_render(tokenizer, chat, tools=[TOOL])
    assert text.endswith("</tool_response>\nThe tool printed it.\n<answer>372156147</answer><|im_end|>\n")
    # Once the user speaks again, that turn keeps no reasoning: only what it said (as
    # prompts.messages renders a conversation's earlier turns).
    later = a2fm_render(tokenizer, chat + [{"role": "user", "content": "Thanks"}], tools=[TOOL])
    assert "Goal: the product." not in later and "</tool_response>\n372156147<|im_end|>\n<|im_start|>user\nThanks" in later


@pytest.mark.parametrize(("thinking", "tools", "mode"), [
    (False, None, Mode.MODE_INSTANT), (True, None, Mode.MODE_REASONING), (True, [TOOL], Mode.MODE_AGENTIC), (False, [TOOL], Mode.MODE_INSTANT)])
def test_enable_thinking_pins_the_mode_with_the_forced_prefix(tokenizer, thinking, tools, mode):
    chat = [{"role": "user", "content": "q"}]
    text = a2fm_render(tokenizer, chat, tools=tools, add_generation_prompt=True, enable_thinking=thinking)
    assert text == a2fm_render(tokenizer, chat, tools=tools, add_generation_prompt=True) + a2fm.forced_prefix(mode) + prompts.MODE_OPENERS[mode]


@pytest.mark.parametrize(("chat", "flags"), [
    ([{"role": "user", "content": "q"}], {"add_generation_prompt": True}),
    ([{"role": "user", "content": "q"}], {"add_generation_prompt": True, "enable_thinking": False}),
    ([{"role": "user", "content": "q"}], {"add_generation_prompt": True, "enable_thinking": True}),
    (tool_loop({"code": CODE}), {"add_generation_prompt": True, "enable_thinking": False}),
    (prompts.messages("q", a2fm.forced_prefix(Mode.MODE_AGENTIC) + "Plan: None\n<plan>"), {"continue_final_message": True}),
    (prompts.messages("q", a2fm.forced_prefix(Mode.MODE_INSTANT) + "<answer>"), {"continue_final_message": True}),
])
def test_the_request_tells_the_state_the_rendered_prompt_leaves(tokenizer, chat, flags):
    """a2fm_format.generation_state reads the state off the messages, as the parsers do
    without a prompt; it must be the state the template's prompt really ends in."""
    text = a2fm_render(tokenizer, chat, tools=[TOOL], **flags)
    rendered = a2fm_format.turn_state(text.rsplit("<|im_start|>assistant\n", 1)[1])
    kwargs = {"enable_thinking": flags["enable_thinking"]} if "enable_thinking" in flags else {}
    from_request = a2fm_format.generation_state(chat, add_generation_prompt=flags.get("add_generation_prompt", False),
                                                  continue_final_message=flags.get("continue_final_message", False), template_kwargs=kwargs)
    assert from_request == rendered


def native_agentic(*turns: Turn) -> Trajectory:
    return Trajectory(query="What is 48213 * 7719?", mode=Mode.MODE_AGENTIC, protocol=PolicyProtocol.POLICY_PROTOCOL_NATIVE,
                      turns=turns, native=NativeRequest(tools_json=json.dumps(a2fm_format.DEFAULT_TOOLS),
                                                        chat_template_kwargs_json=json.dumps(native.CHAT_TEMPLATE_KWARGS[Mode.MODE_AGENTIC])))


PLANNED = Plan(steps=[PlanStep(state="need the product", action="run python", expected_outcome="it is printed")])
CALLED = Turn(index=0, plan_decision=PlanDecision.PLAN_DECISION_PLAN_NEW, plan=PLANNED, reasoning_content="Goal: the product.</plan>",
              tool_calls=[ToolCall(id="call_1", name="python", arguments_json=json.dumps({"code": CODE}))],
              tool_results=[ToolResult(call_id="call_1", name="python", output="372156147\n")])
ANSWERED = Turn(index=1, plan_decision=PlanDecision.PLAN_DECISION_CONTINUE, output="372156147", reasoning_content="The tool printed it.")


@pytest.mark.parametrize("turns", [(), (CALLED,)], ids=["first turn", "after a tool"])
@pytest.mark.parametrize("decision", [PlanDecision.PLAN_DECISION_PLAN_NEW, PlanDecision.PLAN_DECISION_ACT])
def test_a_native_agentic_request_renders_as_the_text_protocols_transcript(tokenizer, turns, decision):
    """The native protocol's request for an agentic turn (its SR2AM opening continued) is the
    text protocol's prompt for the same episode, character for character: the A^2FM prompt in
    place of the native one, the routing head, the turn so far and the same SR2AM block."""
    upcoming = Turn(index=len(turns), plan_decision=decision, plan=PLANNED if decision == PlanDecision.PLAN_DECISION_PLAN_NEW else Plan())
    trajectory = native_agentic(*turns)
    served = a2fm_render(tokenizer, native.template_messages(native.messages(trajectory, upcoming)), tools=native.served_tools(trajectory),
                         continue_final_message=True, **native.served_kwargs(trajectory))
    block, opener = plan_block(decision, upcoming.plan, first_turn=not turns)
    transcript = a2fm.forced_prefix(Mode.MODE_AGENTIC)
    if turns:  # the text protocol's transcript of the turn before: its block, its generation, the tool's response
        transcript += (render_plan(PLANNED) + "\n<plan>" + "Goal: the product.</plan>\n<tool_call>\n"
                       f"{{'id': 1, 'name': 'python', 'arguments': {{'code': '{CODE}'}}}}\n</tool_call>" + a2fm.tool_response([("1", "372156147")]))
    text = tokenizer.apply_chat_template(prompts.messages(trajectory.query, transcript + block + opener), tokenize=False,
                                         continue_final_message=True)
    assert served == text


def test_the_native_prompt_gives_way_to_the_a2fm_one_keeping_the_clients_instructions(tokenizer):
    chat = native.prompt_messages("q", Conversation(instructions="Answer in French."))
    assert chat[0]["content"].startswith(native.SYSTEM_PROMPT)
    text = a2fm_render(tokenizer, chat, add_generation_prompt=True)
    assert text.startswith(f"<|im_start|>system\n{prompts.SYSTEM_PROMPT}\n\nAnswer in French.<|im_end|>\n")


def test_training_learns_each_native_generation_apart_from_its_sr2am_opening(tokenizer):
    """Under the A^2FM template the opening and the generation that continued it are one
    message, as served: the generation is learned from where the opening ends, the opening not."""
    trajectory = native_agentic(CALLED, ANSWERED)
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.chat_template = TEMPLATE.read_text()
    pieces = tokenization.native_segments(tokenizer, trajectory)
    learned = [piece.text for piece in pieces if piece.target]
    assert learned == ["Goal: the product.</plan>\n<tool_call>\n{'id': 1, 'name': 'python', 'arguments': {'code': '" + CODE + "'}}\n</tool_call>",
                       "The tool printed it.\n<answer>372156147</answer><|im_end|>"]
    masked = "".join(piece.text for piece in pieces if not piece.target)
    assert render_plan(PLANNED) + "\n<plan>" in masked and "\nPlan:\n\n" in masked


def test_the_template_ships_as_package_data():
    """setup.py's package_data takes the template into the wheel, beside a2fm_format.py, where
    the plugins and the built-in server look for it (images install the wheel, not the tree)."""
    import ast
    import fnmatch

    setup = ast.parse((Path(__file__).parents[3] / "setup.py").read_text())
    data = next(ast.literal_eval(k.value) for node in ast.walk(setup) if isinstance(node, ast.Call)
                for k in node.keywords if k.arg == "package_data")
    assert any(fnmatch.fnmatch(TEMPLATE.name, pattern) for pattern in data[""])
