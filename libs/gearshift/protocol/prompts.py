"""The prompts the policy sees. Router, executor and the training jobs share them, so a trained
checkpoint meets at serving time exactly the text it was trained on."""

from __future__ import annotations

from gearshift.api.common.v1.common_pb2 import ChatRole, Conversation, Mode
from gearshift.errors import InvalidArgument

SYSTEM_PROMPT = """You are an adaptive agent. First write one short sentence about the question, then choose how to answer it:
<classification>
default_agent | reasoning_agent | toolcalling_agent
</classification>
default_agent: answer directly as <answer>...</answer>.
reasoning_agent: think step by step in <reasoning>...</reasoning>, then <answer>...</answer>.
toolcalling_agent: write a <plan>...</plan>, then call tools in <tool_call>...</tool_call>, one call per line as a Python dict, e.g.
{'id': 1, 'name': 'python', 'arguments': {'code': 'print(17*23)'}}
Results come back in <tool_response>. Finish with <answer>...</answer>.
Tools: python(code) runs Python and returns what it prints; web_search(query) searches documents; crawl_page(id, query) reads a document."""

# Injected right after the classification block, so even a small model starts in its mode's
# format. Agentic mode opens its <plan> after the first SR2AM plan block (see the executor).
MODE_OPENERS = {
    Mode.MODE_INSTANT: "<answer>",
    Mode.MODE_REASONING: "<reasoning>",
    Mode.MODE_AGENTIC: "",
}
AGENTIC_OPENER = "<plan>"


ROLE_NAMES = {ChatRole.CHAT_ROLE_USER: "user", ChatRole.CHAT_ROLE_ASSISTANT: "assistant"}


def messages(query: str, assistant_prefix: str = "", conversation: Conversation | None = None) -> list[dict[str, str]]:
    """Chat messages for a query in its conversation; a non-empty prefix is the assistant turn to
    continue. The client's instructions follow the platform's prompt in the one system message
    (chat templates differ on a second one), the earlier turns come before the query."""
    system, earlier = SYSTEM_PROMPT, []
    if conversation is not None:
        if conversation.instructions:
            system = f"{SYSTEM_PROMPT}\n\n{conversation.instructions}"
        earlier = [{"role": ROLE_NAMES[message.role], "content": message.content} for message in conversation.messages]
    chat = [{"role": "system", "content": system}, *earlier, {"role": "user", "content": query}]
    if assistant_prefix:
        chat.append({"role": "assistant", "content": assistant_prefix})
    return chat


def check_conversation(conversation: Conversation, max_chars: int) -> None:
    """InvalidArgument unless every earlier message has a known role and the whole conversation
    fits in max_chars characters."""
    for n, message in enumerate(conversation.messages):
        if message.role not in ROLE_NAMES:
            raise InvalidArgument(f"conversation message {n}: role must be USER or ASSISTANT")
    size = len(conversation.instructions) + sum(len(message.content) for message in conversation.messages)
    if size > max_chars:
        raise InvalidArgument(f"conversation longer than {max_chars} characters")
