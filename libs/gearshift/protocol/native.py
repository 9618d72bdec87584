"""The native policy protocol: the episode is a chat conversation, the platform's tools are
declared as JSON-schema functions that the serving engine's parser returns as structured
`tool_calls`, and thinking comes back apart as `reasoning_content` (Agents-A1; Qwen3 on vLLM with
--tool-call-parser and --reasoning-parser).

    system     SYSTEM_PROMPT, then the client's instructions (as prompts.messages)
    ...        the conversation's earlier turns
    user       the query
    per turn:  [assistant: the turn's SR2AM opening, in agentic mode: the configurator's block
                (a new plan, "Plan:" to continue one, "Plan: None" to act) as the text protocol
                writes it, which the generation continues (continue_final_message)]
               assistant: content + tool_calls (+ reasoning), as the engine returned them
               tool: one message per call, with its call id
    the answer: an assistant message without tool_calls (its content)

Serving (services/executor/native.py) and training (gearshift.training.tokenization) both build
the conversation here from the trajectory, so a checkpoint is trained on exactly what it was
served. Modes are chat template arguments and the tools offered (CHAT_TEMPLATE_KWARGS)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from gearshift.api.common.v1.common_pb2 import (
    Conversation,
    Mode,
    PlanDecision,
    PolicyProtocol,
    ToolCall,
    ToolResult,
    Trajectory,
    Turn,
)
from gearshift.protocol.parsers.calls import MAX_PARALLEL_CALLS, openai_tool_call
from gearshift.protocol.prompts import ROLE_NAMES
from gearshift.protocol.sr2am import plan_block

# Protocol-neutral: no tag format; the engine's chat template and parsers carry the structure.
SYSTEM_PROMPT = """You are an adaptive agent. Answer the user's question correctly and as briefly as it allows.
When tools are offered, call them where they make the answer reliable (computing, looking something up), then answer from their results; otherwise answer directly."""

# instant: no tools, thinking off; reasoning: thinking on, no tools; agentic: tools, thinking on.
CHAT_TEMPLATE_KWARGS = {
    Mode.MODE_INSTANT: {"enable_thinking": False},
    Mode.MODE_REASONING: {"enable_thinking": True},
    Mode.MODE_AGENTIC: {"enable_thinking": True},
}


def is_native(trajectory: Trajectory) -> bool:
    return trajectory.protocol == PolicyProtocol.POLICY_PROTOCOL_NATIVE


def offers_tools(mode: int) -> bool:
    return mode == Mode.MODE_AGENTIC


def tool_schemas(specs: Iterable) -> list[dict]:
    """OpenAI `tools` for the sandbox's ListTools specs (name, description, JSON schema)."""
    return [
        {"type": "function", "function": {"name": spec.name, "description": spec.description,
                                          "parameters": json.loads(spec.parameters_json_schema or '{"type": "object"}')}}
        for spec in specs
    ]


# The conversation

@dataclass(frozen=True)
class Message:
    """One chat message of the episode, and the turn whose generation it is (None: a message the
    client or the platform wrote: the prompt, a plan, a tool result)."""

    body: dict
    generated_by: Turn | None = None


def prompt_messages(query: str, conversation: Conversation | None = None) -> list[dict]:
    """system (the platform's prompt, then the client's instructions), earlier turns, the query."""
    system, earlier = SYSTEM_PROMPT, []
    if conversation is not None:
        if conversation.instructions:
            system = f"{SYSTEM_PROMPT}\n\n{conversation.instructions}"
        earlier = [{"role": ROLE_NAMES[message.role], "content": message.content} for message in conversation.messages]
    return [{"role": "system", "content": system}, *earlier, {"role": "user", "content": query}]


def opening_message(turn: Turn) -> dict | None:
    """The assistant message a regulated turn's generation continues: the SR2AM block of the
    configurator's decision and the opener after the first one, character for character as the
    text protocol's transcript holds them (sr2am.plan_block); None for a turn not regulated."""
    if turn.plan_decision == PlanDecision.PLAN_DECISION_UNSPECIFIED:
        return None
    block, opener = plan_block(turn.plan_decision, turn.plan, first_turn=turn.index == 0)
    return {"role": "assistant", "content": block + opener}


def assistant_message(turn: Turn) -> dict:
    """The turn's generation as sent back: content, reasoning (under both names engines read:
    vLLM reads `reasoning`, templates `reasoning_content`) and the calls, arguments as JSON."""
    message = {"role": "assistant", "content": turn.output}
    if turn.reasoning_content:
        message["reasoning"] = message["reasoning_content"] = turn.reasoning_content
    if turn.tool_calls:
        message["tool_calls"] = [openai_tool_call(call.id, call.name, call.arguments_json) for call in turn.tool_calls]
    return message


def tool_content(result: ToolResult) -> str:
    """What the policy reads of a result: the output, or the error it should correct."""
    return f"Error: {result.error}" if result.is_error else result.output.rstrip("\n")


def turn_messages(turn: Turn) -> list[Message]:
    opening = opening_message(turn)
    tools = [Message({"role": "tool", "tool_call_id": result.call_id, "content": tool_content(result)}) for result in turn.tool_results]
    return ([Message(opening)] if opening else []) + [Message(assistant_message(turn), turn)] + tools


def episode(trajectory: Trajectory, upcoming: Turn | None = None) -> list[Message]:
    """The conversation of a (stored or running) native trajectory; upcoming: the turn about to
    be generated, whose opening message comes last (the request continues it)."""
    messages = [Message(body) for body in prompt_messages(trajectory.query, trajectory.conversation)]
    for turn in trajectory.turns:
        messages += turn_messages(turn)
    opening = opening_message(upcoming) if upcoming is not None else None
    return messages + ([Message(opening)] if opening else [])


def messages(trajectory: Trajectory, upcoming: Turn | None = None) -> list[dict]:
    """The chat messages of the request that generates the upcoming turn."""
    return [message.body for message in episode(trajectory, upcoming)]


def template_messages(chat: list[dict]) -> list[dict]:
    """The messages as the engine hands them to the chat template: tool call arguments as
    objects, not JSON strings (vLLM does this; transformers' templates expect it)."""
    rendered = []
    for message in chat:
        if message.get("tool_calls"):
            calls = [{**call, "function": {**call["function"], "arguments": json.loads(call["function"]["arguments"])}}
                     for call in message["tool_calls"]]
            message = {**message, "tool_calls": calls}
        rendered.append(message)
    return rendered


def served_tools(trajectory: Trajectory) -> list[dict] | None:
    """The tool declarations the trajectory's requests carried (None: none)."""
    return json.loads(trajectory.native.tools_json) if trajectory.native.tools_json else None


def served_kwargs(trajectory: Trajectory) -> dict:
    """The chat_template_kwargs the trajectory's requests carried."""
    return json.loads(trajectory.native.chat_template_kwargs_json or "{}")


# The calls of one generation

@dataclass(frozen=True)
class ReadCall:
    """A call the engine returned, as kept and sent back (its id unique in the turn, its
    arguments a JSON object: "{}" when the model's did not parse), and why the platform refuses
    to run it (None: it runs)."""

    call: ToolCall
    refusal: str | None = None


def read_calls(calls: Iterable, known_tools: frozenset[str]) -> list[ReadCall]:
    """The engine's tool_calls (gearshift.policy_client.ToolCall: id, name, arguments,
    raw_arguments) checked against the tools offered. Every call is kept, in order: a refused one
    gets an error result the model is told about, as the text protocol does."""
    read, seen = [], set()
    for number, call in enumerate(calls, start=1):
        call_id = call.id if call.id and call.id not in seen else _fresh_id(number, seen)
        seen.add(call_id)
        arguments = _object(call.raw_arguments)
        if arguments is None and call.arguments:  # the engine sent the arguments as an object, not a string
            arguments = json.dumps(call.arguments)
        refusal = None
        if number > MAX_PARALLEL_CALLS:
            refusal = f"Too many calls in one turn; at most {MAX_PARALLEL_CALLS} run."
        elif call.name not in known_tools:
            refusal = f"Unknown tool {call.name!r}; available: {', '.join(sorted(known_tools))}."
        elif arguments is None:
            refusal = f"The arguments of {call.name} are not a JSON object: {call.raw_arguments[:200]}"
        read.append(ReadCall(ToolCall(id=call_id, name=call.name, arguments_json=arguments or "{}"), refusal))
    return read


def refusal_result(read: ReadCall) -> ToolResult:
    """The result of a call the platform refused: no tool name, since no tool ran (nothing priced)."""
    return ToolResult(call_id=read.call.id, is_error=True, error=read.refusal)


def refused(result: ToolResult) -> bool:
    """Whether a result is the platform's refusal of a malformed call (refusal_result)."""
    return result.is_error and not result.name


def _object(raw: str) -> str | None:
    """raw when it is a JSON object, else None."""
    try:
        return raw if isinstance(json.loads(raw or "{}"), dict) else None
    except ValueError:
        return None


def _fresh_id(number: int, seen: set[str]) -> str:
    call_id = f"call_{number}"
    while call_id in seen:
        call_id += "_"
    return call_id
