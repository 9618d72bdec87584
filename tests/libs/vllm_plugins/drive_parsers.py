"""Runs in vLLM's own virtual environment (tests/vllm_servers.VLLM_PYTHON): loads the a2fm
plugins the way the server does (--tool-parser-plugin, --reasoning-parser-plugin), composes
them into vLLM's serving Parser and drives it through each case, unstreamed (parse) and streamed
one token at a time (parse_delta, with the prompt the A^2FM chat template renders), the output
cut at the request's stop words as the engine cuts it.

stdin: {"model": DIR, "plugin": PATH, "template": PATH, "cases": [{"messages", "tools", "kwargs",
"add_generation_prompt", "continue_final_message", "output"}]}; stdout: one JSON object per case:
{"stop", "parsed": [reasoning, content, calls], "streamed": [reasoning, content, calls]}."""

from __future__ import annotations

import json
import sys


def calls_of(calls) -> list[dict]:
    """vLLM's FunctionCalls (the id is excluded from their serialisation)."""
    return [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls]


def main() -> None:
    job = json.load(sys.stdin)
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser import ParserManager
    from vllm.reasoning import ReasoningParserManager
    from vllm.tokenizers import get_tokenizer
    from vllm.tool_parsers import ToolParserManager

    ToolParserManager.import_tool_parser(job["plugin"])
    ReasoningParserManager.import_reasoning_parser(job["plugin"])
    tokenizer = get_tokenizer(job["model"])
    parser_cls = ParserManager.get_parser(tool_parser_name="a2fm", reasoning_parser_name="a2fm", enable_auto_tools=True, tokenizer=tokenizer)
    template = open(job["template"]).read()
    for case in job["cases"]:
        flags = {"add_generation_prompt": case["add_generation_prompt"], "continue_final_message": case["continue_final_message"]}
        request = ChatCompletionRequest(model="default", messages=case["messages"], tools=case["tools"],
                                        chat_template_kwargs=case["kwargs"], **flags)
        request = parser_cls(tokenizer, request.tools, chat_template_kwargs=case["kwargs"]).adjust_request(request)
        output = case["output"]
        for word in request.stop:  # the engine stops there and leaves the stop word out
            output = output.split(word, 1)[0]
        reasoning, content, calls = parser_cls(tokenizer, request.tools, chat_template_kwargs=case["kwargs"]).parse(
            output, request, enable_auto_tools=True)
        parsed = [reasoning, content, calls_of(calls or [])]

        prompt = tokenizer.apply_chat_template(case["messages"], tools=case["tools"], chat_template=template, tokenize=True,
                                               **flags, **case["kwargs"])
        prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)  # a BatchEncoding in transformers 5
        parser = parser_cls(tokenizer, request.tools, chat_template_kwargs=case["kwargs"])
        ids = tokenizer.encode(output, add_special_tokens=False)
        deltas, said = [], ""
        for n, token in enumerate(ids):
            text = tokenizer.decode(ids[: n + 1])[len(said):]  # what the detokenizer hands on
            said += text
            delta = parser.parse_delta(text, [token], request, prompt_token_ids=prompt, finished=n == len(ids) - 1)
            if delta is not None:
                deltas.append(delta.model_dump(exclude_none=True))
        streamed_calls = [{"id": t["id"], **t["function"]} for d in deltas for t in d.get("tool_calls", [])]
        streamed = ["".join(d.get("reasoning", "") for d in deltas) or None, "".join(d.get("content", "") for d in deltas) or None,
                    streamed_calls]
        print(json.dumps({"stop": request.stop, "parsed": parsed, "streamed": streamed}), flush=True)


if __name__ == "__main__":
    main()
