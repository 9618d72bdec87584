"""Request bodies of the OpenAI-compatible API. A field this server knows is honoured or refused
with a 400 that names it, never accepted and dropped: the sampling fields of OpenAI and vLLM it
does not implement are accepted only at their neutral value (what clients send by default).
Fields it does not know at all are ignored, as vLLM does (`user`, `metadata`: nothing to honour).
Limits that depend on settings are checked in core."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

GUIDED = "needs guided decoding, which the built-in policy server does not have"
ELSEWHERE = "leave it out, or serve the model with vLLM"

# Fields of OpenAI or vLLM that the built-in server does not implement: the values that ask for
# nothing (leaving a field out, or null, always does), and what to do instead.
SAMPLING_REFUSED: dict[str, tuple[tuple, str]] = {
    "repetition_penalty": ((1,), ELSEWHERE),
    "logit_bias": (({},), ELSEWHERE),
    "top_k": ((0, -1), ELSEWHERE),
    "min_p": ((0,), ELSEWHERE),
    "min_tokens": ((0,), ELSEWHERE),
    "stop_token_ids": (([],), "send `stop` words, or serve the model with vLLM"),
    "include_stop_str_in_output": ((False,), ELSEWHERE),
    "skip_special_tokens": ((True,), ELSEWHERE),
    "prompt_logprobs": ((), ELSEWHERE),
    "structured_outputs": ((), f"it {GUIDED}"),
    "guided_json": ((), f"it {GUIDED}"),
    "guided_regex": ((), f"it {GUIDED}"),
    "guided_choice": ((), f"it {GUIDED}"),
    "guided_grammar": ((), f"it {GUIDED}"),
}
COMPLETION_REFUSED = {
    "echo": ((False,), ELSEWHERE),
    "suffix": (("",), ELSEWHERE),
    "best_of": ((1,), "send `n` for several samples"),
}
CHAT_REFUSED = {
    "functions": (([],), "send `tools` instead"),
    "function_call": (("none",), "send `tool_choice` instead"),
    "modalities": ((["text"],), "this server writes text only"),
    "audio": ((), "this server writes text only"),
    "web_search_options": ((), "this server has no web search"),
    "chat_template": ((), "the server renders with its own template (setting policy_server.chat_template)"),
    "documents": (([],), ELSEWHERE),
}


def unsupported(field: str, message: str) -> PydanticCustomError:
    """The validation error of a field this server cannot honour: a 400 whose param names it."""
    return PydanticCustomError("unsupported", "{message}", {"field": field, "message": message})


class StreamOptions(BaseModel):
    include_usage: bool = Field(False, description="Send a last chunk carrying the token usage")


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str


class SamplingFields(BaseModel):
    """Fields shared by completions and chat completions."""

    model_config = ConfigDict(extra="ignore")
    REFUSED: ClassVar[dict[str, tuple[tuple, str]]] = SAMPLING_REFUSED

    model: str | None = Field(None, description="Served model name (default: the one served)")
    max_tokens: int | None = Field(None, description="Most tokens to generate")
    max_completion_tokens: int | None = Field(None, description="Newer OpenAI name of max_tokens")
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass")
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0, description="Subtracted from a token's logit once per time it was generated")
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0, description="Subtracted from a token's logit once it was generated")
    stop: str | list[str] | None = Field(None, description="Stop words (not included in the text)")
    seed: int | None = Field(None, description="Makes sampling repeatable (choice i of n samples with seed + i)")
    n: int = Field(1, ge=1, description="Independent samples per prompt (a prompt's choices are adjacent)")
    stream: bool = Field(False, description="Server-sent events, one chunk per piece of text")
    stream_options: StreamOptions | None = None
    ignore_eos: bool = Field(False, description="vLLM extension: keep going past end-of-sequence")
    return_token_ids: bool = Field(False, description="vLLM extension: each choice carries the sampled token_ids")
    response_format: ResponseFormat | None = Field(None, description='Only {"type": "text"}: no guided decoding here')

    @model_validator(mode="before")
    @classmethod
    def _refuse_what_is_not_served(cls, data: Any) -> Any:
        for name, (neutral, fix) in cls.REFUSED.items():
            value = data.get(name) if isinstance(data, dict) else None
            if value is not None and value not in neutral:
                raise unsupported(name, f"{name} {value!r} is not supported by the built-in policy server: {fix}")
        return data

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, value: ResponseFormat | None) -> ResponseFormat | None:
        if value is not None and value.type != "text":
            raise unsupported(
                "response_format",
                f"response_format {value.type!r} {GUIDED}: send {{\"type\": \"text\"}} or leave it out, or serve the model with vLLM",
            )
        return value

    @field_validator("stop")
    @classmethod
    def _stop_words(cls, value: str | list[str] | None) -> list[str]:
        words = [value] if isinstance(value, str) else list(value or [])
        if len(words) > 16 or any(not word for word in words):
            raise ValueError("stop takes at most 16 non-empty strings")
        return words

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def requested_logprobs(self) -> int | None:
        """How many alternatives each sampled token's log-probability comes with; None: no logprobs."""
        return None


class CompletionRequest(SamplingFields):
    REFUSED: ClassVar[dict[str, tuple[tuple, str]]] = SAMPLING_REFUSED | COMPLETION_REFUSED

    prompt: str | list[str] = Field(description="Prompt text, or several prompts (n choices each)")
    logprobs: int | None = Field(None, ge=0, description="Return each token's log-probability and the top this many")

    def requested_logprobs(self) -> int | None:
        return self.logprobs


class FunctionCall(BaseModel):
    name: str
    arguments: str | dict = "{}"


class ToolCall(BaseModel):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ContentPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    reasoning_content: str | None = None  # an earlier assistant turn's reasoning (vLLM also reads `reasoning`)
    reasoning: str | None = None

    def as_template_dict(self) -> dict:
        """The message as chat templates expect it: text content, developer as system, reasoning
        under both names templates read (one that does not render it leaves it out)."""
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        message: dict = {"role": "system" if self.role == "developer" else self.role, "content": content or ""}
        if self.tool_calls:
            message["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.tool_call_id:
            message["tool_call_id"] = self.tool_call_id
        if self.name:
            message["name"] = self.name
        reasoning = self.reasoning_content or self.reasoning
        if reasoning:
            message["reasoning_content"] = message["reasoning"] = reasoning
        return message


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict = Field(default_factory=lambda: {"type": "object", "properties": {}})


class ToolDefinition(BaseModel):
    type: Literal["function"]
    function: FunctionDefinition


class ToolName(BaseModel):
    name: str = Field(min_length=1)


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: ToolName


class ChatRendering(BaseModel):
    """What turns chat messages into a prompt: chat completions and vLLM's /tokenize."""

    model_config = ConfigDict(extra="ignore")

    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolDefinition] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    # vLLM extensions: continue the last (assistant) message instead of opening a new turn. The
    # continuation comes back as raw text, tags and all, like a completion.
    continue_final_message: bool = Field(False, description="Continue the final assistant message")
    add_generation_prompt: bool = Field(True, description="Open a new assistant turn after the messages")
    chat_template_kwargs: dict[str, Any] | None = Field(None, description="vLLM extension: extra chat template variables")

    @model_validator(mode="after")
    def _continuation(self) -> ChatRendering:
        if self.continue_final_message:
            if self.add_generation_prompt:
                raise ValueError("continue_final_message needs add_generation_prompt false")
            if not self.messages or self.messages[-1].role != "assistant":
                raise ValueError("continue_final_message needs the last message to be the assistant's")
        return self


class ChatCompletionRequest(SamplingFields, ChatRendering):
    REFUSED: ClassVar[dict[str, tuple[tuple, str]]] = SAMPLING_REFUSED | CHAT_REFUSED

    parallel_tool_calls: bool | None = Field(None, description="false: at most the first tool call comes back")
    logprobs: bool | None = Field(None, description="Return each sampled token's log-probability")
    top_logprobs: int | None = Field(None, ge=0, description="...and the likeliest this many tokens at each position")

    @model_validator(mode="after")
    def _top_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs true")
        return self

    def requested_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class TokenizeRequest(ChatRendering):
    """vLLM's /tokenize: a prompt, or chat messages rendered as a chat request would render them."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = Field(None, description="Default: true for a prompt, false for messages")
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give either prompt or messages")
        return self


class DetokenizeRequest(BaseModel):
    model: str | None = None
    tokens: list[int]


class LoadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, description='"smollm2", "tiny" or a local checkpoint directory')
    served_model_name: str | None = Field(None, description="New name to serve it under (default: unchanged)")
