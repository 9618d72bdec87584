"""vLLM's tool parser and reasoning parser "a2fm": the A^2FM chat format of gearshift's default
policy as OpenAI's `tool_calls`, `reasoning` (`reasoning_content`) and `content`, streamed and
not. Both look the format up by name in gearshift/protocol/parsers/, loaded by path (a copy
beside this file, else the package's), so vLLM's own virtual environment needs no gearshift
installed:

    --enable-auto-tool-choice --tool-call-parser a2fm --tool-parser-plugin .../a2fm_parsers.py
    --reasoning-parser a2fm --reasoning-parser-plugin .../a2fm_parsers.py
    --chat-template .../a2fm_chat_template.jinja

(gearshift.vllm_plugins.vllm_args writes them.)

Which requests are parsed: those that ask for the native format, by declaring tools (tool_choice
not "none") or by setting enable_thinking in chat_template_kwargs. Every other request gets the
text back as the model wrote it, tags and all: the platform's text protocol (router, planner,
the executor's continuations) reads and writes the A^2FM tags itself on the same server. A parsed
request also stops at </tool_call> and </answer> (the turn waits for the tool results there, and
ends with the answer), as the executor stops the model.

How the two parsers share the work: the reasoning parser splits the deliberation off; the
answer's tags are removed there, so a request without tools gets a clean content; <tool_call>
blocks go on verbatim to the tool parser, which turns them into calls. A streamed request that
declares tools without enable_thinking cannot be told from the text protocol by the reasoning
parser (vLLM hands it no request while streaming), so there the tool parser splits the
deliberation off itself; the fields come out the same as unstreamed.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path

from vllm.entrypoints.generate.base.protocol import (
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    ExtractedToolCallInformation,
    FunctionCall,
    ToolCall,
)
from vllm.reasoning import ReasoningParser, ReasoningParserManager
from vllm.tool_parsers import ToolParser, ToolParserManager

NAME = "a2fm"
PACKAGE = "gearshift_output_parsers"
IM_START = "<|im_start|>"


def _load_parsers():
    """The parsers package beside this file (a copied plugin directory) or in the package tree."""
    here = Path(__file__).resolve()
    for folder in (here.with_name("parsers"), here.parent.parent / "protocol" / "parsers"):
        if (folder / "__init__.py").exists():
            spec = importlib.util.spec_from_file_location(PACKAGE, folder / "__init__.py", submodule_search_locations=[str(folder)])
            module = importlib.util.module_from_spec(spec)
            sys.modules[PACKAGE] = module  # its modules import each other through it
            spec.loader.exec_module(module)
            return module
    raise ImportError(f"no parsers package beside {here} nor in {here.parent.parent / 'protocol'}")


parsers = sys.modules.get(PACKAGE) or _load_parsers()
a2fm = sys.modules[f"{PACKAGE}.a2fm"]  # the format's states, tags and helpers
Splitter = parsers.get(NAME)


def _declares_tools(request) -> bool:
    return bool(getattr(request, "tools", None)) and getattr(request, "tool_choice", None) != "none"


def _asks_thinking(template_kwargs: dict | None) -> bool:
    return (template_kwargs or {}).get("enable_thinking") is not None


def _request_state(request, template_kwargs: dict | None) -> str:
    """Where the generation starts in the A^2FM step, from the request's messages."""
    return a2fm.generation_state(
        list(getattr(request, "messages", None) or []),
        add_generation_prompt=getattr(request, "add_generation_prompt", True),
        continue_final_message=getattr(request, "continue_final_message", False),
        template_kwargs=template_kwargs,
    )


def _token_id(tokenizer, token: str) -> int | None:
    ident = tokenizer.convert_tokens_to_ids(token)
    return ident if isinstance(ident, int) and ident != getattr(tokenizer, "unk_token_id", None) else None


def _joined(pieces, kind: str) -> str | None:
    return "".join(piece.text for piece in pieces if piece.kind == kind) or None


@ReasoningParserManager.register_module(NAME)
class A2FMReasoningParser(ReasoningParser):
    """The deliberation before the step's action as reasoning; from the action on, content (the
    answer without its tags, <tool_call> blocks verbatim for the tool parser)."""

    def __init__(self, tokenizer, *args, **kwargs):
        super().__init__(tokenizer, *args, **kwargs)
        self.template_kwargs = kwargs.get("chat_template_kwargs") or {}
        self.streams = _asks_thinking(self.template_kwargs)  # while streaming, only these are parsed here
        self.splitter = None  # the stream's, from its prompt
        self.acting = False
        self.im_start = _token_id(tokenizer, IM_START)

    # Non-streamed

    def extract_reasoning(self, model_output: str, request) -> tuple[str | None, str | None]:
        if not (_declares_tools(request) or _asks_thinking(self.template_kwargs)):
            return None, model_output
        parsed = Splitter.parse(model_output, _request_state(request, self.template_kwargs), parse_tools=False)
        return parsed.reasoning, parsed.content

    def adjust_request(self, request):
        if _declares_tools(request) or _asks_thinking(self.template_kwargs):
            stop = request.stop if isinstance(request.stop, list) else [request.stop] if request.stop else []
            request.stop = stop + [word for word in a2fm.STOP_WORDS if word not in stop]
        return request

    # Streamed

    def _turn_state(self, input_ids: Sequence[int]) -> str:
        """The A^2FM state at the end of a prompt: its last turn, if the assistant's."""
        ids = list(input_ids)
        if self.im_start is not None and self.im_start in ids:
            ids = ids[len(ids) - ids[::-1].index(self.im_start):]
            role, _, turn = self.model_tokenizer.decode(ids, skip_special_tokens=False).partition("\n")
            return a2fm.turn_state(turn) if role == "assistant" else a2fm.START
        return a2fm.turn_state(self.model_tokenizer.decode(ids, skip_special_tokens=False))

    def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
        return not self.streams or self._turn_state(input_ids) in (a2fm.ANSWER, a2fm.TOOL_CALL, a2fm.AFTER)

    def adjust_initial_state_from_prompt(self, prompt_token_ids: Sequence[int]) -> None:
        self.splitter = Splitter(self._turn_state(prompt_token_ids), parse_tools=False)

    def extract_reasoning_streaming(self, previous_text, current_text, delta_text, previous_token_ids, current_token_ids,
                                    delta_token_ids) -> DeltaMessage | None:
        if self.splitter is None:
            self.splitter = Splitter(a2fm.START, parse_tools=False)
        pieces = self.splitter.feed(delta_text)
        reasoning, content = _joined(pieces, "reasoning"), _joined(pieces, "content")
        if self.splitter.acting and not self.acting:
            # From here on vLLM hands the text to the tool parser (or passes it through): give it
            # what the splitter still holds, unread.
            self.acting = True
            content = (content or "") + self.splitter.release() or None
        if reasoning is None and content is None:
            return None
        return DeltaMessage(reasoning=reasoning, content=content)

    def is_reasoning_end_streaming(self, input_ids: Sequence[int], delta_ids) -> bool:
        if not self.streams:
            return True
        if self.splitter is not None:  # the frontend's parser, which just read this delta
            return self.acting
        # The engine core's (structured output): look for the action's opening in the last tokens.
        window = self.model_tokenizer.decode(list(input_ids)[-(len(list(delta_ids)) + 8):], skip_special_tokens=False)
        return any(opener in window for opener in a2fm.ACTION_OPENERS)

    def extract_content_ids(self, input_ids: list[int]) -> list[int]:
        return list(input_ids)

    def get_streaming_fallback_content(self, previous_text: str, request) -> str | None:
        """At the end of a stream whose reasoning never ended: the text still held (a text with
        no tag is content)."""
        if self.splitter is None:
            return None
        return _joined(self.splitter.finish(), "content")


@ToolParserManager.register_module(NAME)
class A2FMToolParser(ToolParser):
    """<tool_call> blocks, one dict literal per line, as OpenAI tool calls; each call streams
    whole once its line is complete."""

    supports_required_and_named = False  # the calls come in A^2FM's format, not JSON: parse them so
    engine_based_streaming = True  # vLLM calls finish_streaming(): a block the stop word left open

    def __init__(self, tokenizer, tools=None):
        super().__init__(tokenizer, tools)
        self.splitter = None

    def extract_tool_calls(self, model_output: str, request) -> ExtractedToolCallInformation:
        parsed = Splitter.parse(model_output, a2fm.AFTER)
        calls = [ToolCall(id=call["id"], function=FunctionCall(**call["function"])) for call in parsed.tool_calls]
        return ExtractedToolCallInformation(tools_called=bool(calls), tool_calls=calls, content=parsed.content)

    def extract_tool_calls_streaming(self, previous_text, current_text, delta_text, previous_token_ids, current_token_ids,
                                     delta_token_ids, request) -> DeltaMessage | None:
        if self.splitter is None:
            kwargs = getattr(request, "chat_template_kwargs", None)
            # The reasoning parser streamed the deliberation when enable_thinking was set; else it
            # passed the whole text here.
            self.splitter = Splitter(a2fm.AFTER if _asks_thinking(kwargs) else _request_state(request, kwargs))
        return self._delta(self.splitter.feed(delta_text))

    def finish_streaming(self) -> DeltaMessage | None:
        return self._delta(self.splitter.finish()) if self.splitter is not None else None

    def _delta(self, pieces) -> DeltaMessage | None:
        calls = []
        for piece in pieces:
            if piece.kind != "tool_call":
                continue
            function = piece.call["function"]
            calls.append(DeltaToolCall(index=len(self.prev_tool_call_arr), id=piece.call["id"], type="function",
                                       function=DeltaFunctionCall(name=function["name"], arguments=function["arguments"])))
            self.prev_tool_call_arr.append(dict(function))
            self.streamed_args_for_tool.append(function["arguments"])
        reasoning, content = _joined(pieces, "reasoning"), _joined(pieces, "content")
        if not (calls or reasoning or content):
            return None
        return DeltaMessage(reasoning=reasoning, content=content, tool_calls=calls)
