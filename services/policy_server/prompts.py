"""Chat messages to prompt text through a chat template: the server's own (the `chat_template`
setting, vLLM's --chat-template) or else the model's.

Templates that render tools themselves (Qwen, Llama 3.1, the A^2FM template) get the tools, the
assistant tool calls and the tool messages unchanged, through apply_chat_template's `tools`.
SmolLM2's ChatML template ignores `tools` and knows no tool turns, so for templates like it the
tools go into the system message in the hermes form (the one parsing.py reads back), assistant
tool calls are written as <tool_call> blocks and tool results as <tool_response> user turns.
"""

from __future__ import annotations

import inspect
import json
import weakref

from gearshift.errors import InvalidArgument

_PROBE_TOOL = "gearshift_template_probe"

TOOLS_INSTRUCTION = (
    "You may call one or more functions to assist with the user query. "
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


_renders_tools: weakref.WeakKeyDictionary[object, dict[str | None, bool]] = weakref.WeakKeyDictionary()


def template_renders_tools(tokenizer, template: str | None = None) -> bool:
    """Whether the chat template (the model's when None) itself writes the tool definitions into
    the prompt. Probed once per tokenizer and template."""
    known = _renders_tools.setdefault(tokenizer, {})
    if template not in known:
        probe = [{"type": "function", "function": {"name": _PROBE_TOOL, "parameters": {"type": "object"}}}]
        try:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": "hi"}], tools=probe, chat_template=template, tokenize=False, add_generation_prompt=True
            )
        except Exception:  # templates raise whatever jinja raises on inputs they do not expect
            text = ""
        known[template] = _PROBE_TOOL in text
    return known[template]


def check_template_kwargs(tokenizer, kwargs: dict) -> None:
    """chat_template_kwargs become template variables; names apply_chat_template itself takes
    (tools, tokenize, ...) would change how it renders instead, so they are refused."""
    taken = set(inspect.signature(tokenizer.apply_chat_template).parameters) - {"kwargs"}
    clashing = sorted(taken & set(kwargs))
    if clashing:
        raise InvalidArgument(f"chat_template_kwargs may not set {', '.join(clashing)}: send them as request fields")


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


def _as_plain_chatml(messages: list[dict], tools: list[dict] | None) -> list[dict]:
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
        instruction = TOOLS_INSTRUCTION.format(tools=listing)
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


def render_chat(
    tokenizer,
    messages: list[dict],
    tools: list[dict] | None,
    add_generation_prompt: bool = True,
    continue_final: bool = False,
    template: str | None = None,
    template_kwargs: dict | None = None,
) -> str:
    """The prompt text for a chat request: ending with the assistant turn's opening
    (add_generation_prompt), inside the last assistant message (continue_final), or after the
    last message (neither). template: the server's chat template (None: the model's);
    template_kwargs: extra template variables (vLLM's chat_template_kwargs)."""
    check_template_kwargs(tokenizer, template_kwargs or {})
    turn = {"add_generation_prompt": add_generation_prompt, "continue_final_message": continue_final, "chat_template": template}
    turn |= template_kwargs or {}
    if template_renders_tools(tokenizer, template):
        return tokenizer.apply_chat_template(_native(messages), tools=tools or None, tokenize=False, **turn)
    return tokenizer.apply_chat_template(_as_plain_chatml(messages, tools), tokenize=False, **turn)
