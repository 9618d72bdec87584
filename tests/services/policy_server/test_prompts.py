"""Chat messages through SmolLM2's real chat template, which knows nothing of tools."""

from __future__ import annotations

from gearshift.services.policy_server.prompts import render_chat, template_renders_tools

TOOLS = [{"type": "function", "function": {"name": "python", "parameters": {"type": "object"}}}]


def test_smollm2_template_needs_the_tools_written_into_the_system_message(tokenizer):
    assert not template_renders_tools(tokenizer)
    prompt = render_chat(tokenizer, [{"role": "user", "content": "17*23?"}], TOOLS)
    assert prompt.startswith("<|im_start|>system\nYou may call one or more functions")
    assert '"name": "python"' in prompt and "<tool_call>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_own_system_message_is_kept(tokenizer):
    messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi"}]
    prompt = render_chat(tokenizer, messages, TOOLS)
    assert prompt.count("<|im_start|>system") == 1
    assert "Be terse.\n\nYou may call" in prompt


def test_tool_calls_and_results_are_written_as_hermes_text(tokenizer):
    messages = [
        {"role": "user", "content": "17*23?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "python", "arguments": '{"code": "print(17*23)"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "391"},
    ]
    prompt = render_chat(tokenizer, messages, TOOLS)
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "python", "arguments": {"code": "print(17*23)"}}\n</tool_call><|im_end|>' in prompt
    assert "<|im_start|>user\n<tool_response>\n391\n</tool_response><|im_end|>" in prompt


def test_without_tools_the_template_is_used_as_is(tokenizer):
    messages = [{"role": "user", "content": "hi"}]
    expected = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert render_chat(tokenizer, messages, None) == expected
