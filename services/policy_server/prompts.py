"""Chat messages to prompt text through the model's own chat template.

SmolLM2's ChatML template ignores `tools` and knows no tool turns, so for templates like it the
tools go into the system message in the hermes form (the one parsing.py reads back), assistant
tool calls are written as <tool_call> blocks and tool results as <tool_response> user turns.
Templates that render tools themselves (Qwen, Llama 3.1, ...) get them unchanged.
"""

from __future__ import annotations

import json

from gearshift.errors import InvalidArgument

_PROBE_TOOL = "gearshift_template_probe"

TOOLS_INSTRUCTION = (
    "You may call one or more functions to assist with the user query. "
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


def template_renders_tools(tokenizer) -> bool:
    """Whether the chat template itself writes the tool definitions into the prompt."""
    probe = [{"type": "function", "function": {"name": _PROBE_TOOL, "parameters": {"type": "object"}}}]
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}], tools=probe, tokenize=False, add_generation_prompt=True
        )
    except Exception:  # templates raise whatever jinja raises on inputs they do not expect
        return False
    return _PROBE_TOOL in text


def _arguments_dict(call: dict) -> dict:
    arguments = call.get("function", {}).get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError as exc:
            raise InvalidArgument(f"tool call arguments are not valid JSON: {exc}") from None
    return arguments


def _tool_call_text(call: dict) -> str:
    payload = {"name": call.get("function", {}).get("name", ""), "arguments": _arguments_dict(call)}
    return f"<tool_call>\n{json.dumps(payload)}\n</tool_call>"


def _as_plain_chatml(messages: list[dict], tools: list[dict] | None, directive: str) -> list[dict]:
    """Rewrites tool definitions, calls and results as text a tool-unaware template can carry."""
    plain: list[dict] = []
    for message in messages:
        role, content = message["role"], message.get("content") or ""
        if role == "assistant" and message.get("tool_calls"):
            blocks = "\n".join(_tool_call_text(call) for call in message["tool_calls"])
            plain.append({"role": "assistant", "content": f"{content}\n{blocks}".strip()})
        elif role == "tool":
            plain.append({"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"})
        else:
            plain.append({"role": role, "content": content})
    if tools:
        listing = "\n".join(json.dumps(tool) for tool in tools)
        instruction = TOOLS_INSTRUCTION.format(tools=listing) + directive
        if plain and plain[0]["role"] == "system":
            plain[0] = {"role": "system", "content": f"{plain[0]['content']}\n\n{instruction}"}
        else:
            plain.insert(0, {"role": "system", "content": instruction})
    return plain


def _native(messages: list[dict]) -> list[dict]:
    """Tool-aware templates expect call arguments as dicts, not the JSON strings OpenAI sends."""
    native = []
    for message in messages:
        if message.get("tool_calls"):
            calls = [
                {**call, "function": {**call.get("function", {}), "arguments": _arguments_dict(call)}}
                for call in message["tool_calls"]
            ]
            message = {**message, "tool_calls": calls}
        native.append(message)
    return native


def tool_directive(tool_choice: str | dict | None) -> str:
    """An extra instruction for tool_choice "required" or a named function (not enforced)."""
    if tool_choice == "required":
        return "\nYou must call at least one function."
    if isinstance(tool_choice, dict):
        return f"\nYou must call the function {tool_choice['function']['name']}."
    return ""


def render_chat(
    tokenizer, messages: list[dict], tools: list[dict] | None, tool_choice: str | dict | None, continue_final: bool = False
) -> str:
    """The prompt text for a chat request, ending with the assistant turn's opening, or inside
    the last assistant message when continue_final is set."""
    turn = {"add_generation_prompt": not continue_final, "continue_final_message": continue_final}
    if template_renders_tools(tokenizer):
        return tokenizer.apply_chat_template(_native(messages), tools=tools or None, tokenize=False, **turn)
    plain = _as_plain_chatml(messages, tools, tool_directive(tool_choice) if tools else "")
    return tokenizer.apply_chat_template(plain, tokenize=False, **turn)
