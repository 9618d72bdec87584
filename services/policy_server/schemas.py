"""Request bodies of the OpenAI-compatible API (the fields this server honours; others are
ignored, as OpenAI-compatible servers do). Limits that depend on settings are checked in core."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class StreamOptions(BaseModel):
    include_usage: bool = Field(False, description="Send a last chunk carrying the token usage")


class SamplingFields(BaseModel):
    """Fields shared by completions and chat completions."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = Field(None, description="Served model name (default: the one served)")
    max_tokens: int | None = Field(None, description="Most tokens to generate")
    max_completion_tokens: int | None = Field(None, description="Newer OpenAI name of max_tokens")
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass")
    stop: str | list[str] | None = Field(None, description="Stop words (not included in the text)")
    seed: int | None = Field(None, description="Makes sampling repeatable")
    n: int = Field(1, ge=1, le=1, description="Only one choice per prompt is supported")
    stream: bool = Field(False, description="Server-sent events, one chunk per piece of text")
    stream_options: StreamOptions | None = None
    ignore_eos: bool = Field(False, description="vLLM extension: keep going past end-of-sequence")
    return_token_ids: bool = Field(False, description="vLLM extension: each choice carries the sampled token_ids")

    @field_validator("stop")
    @classmethod
    def _stop_words(cls, value: str | list[str] | None) -> list[str]:
        words = [value] if isinstance(value, str) else list(value or [])
        if len(words) > 16 or any(not word for word in words):
            raise ValueError("stop takes at most 16 non-empty strings")
        return words

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(SamplingFields):
    prompt: str | list[str] = Field(description="Prompt text, or several prompts (one choice each)")


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

    def as_template_dict(self) -> dict:
        """The message as chat templates expect it: text content, developer as system."""
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


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolDefinition] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    # vLLM extensions: continue the last (assistant) message instead of opening a new turn. The
    # continuation comes back as raw text, tags and all, like a completion.
    continue_final_message: bool = Field(False, description="Continue the final assistant message")
    add_generation_prompt: bool = Field(True, description="Open a new assistant turn after the messages")

    @model_validator(mode="after")
    def _continuation(self) -> ChatCompletionRequest:
        if self.continue_final_message:
            if self.add_generation_prompt:
                raise ValueError("continue_final_message needs add_generation_prompt false")
            if self.messages[-1].role != "assistant":
                raise ValueError("continue_final_message needs the last message to be the assistant's")
        return self


class LoadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, description='"smollm2", "tiny" or a local checkpoint directory')
    served_model_name: str | None = Field(None, description="New name to serve it under (default: unchanged)")
