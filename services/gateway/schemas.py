"""Request bodies. Fields an OpenAI client sends that the gateway cannot honour are typed here
loosely and refused by name in translate.py (a 400 that says so), never accepted and dropped;
fields no OpenAI API defines are ignored, as OpenAI-compatible servers do."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = Field(False, description="Send a last chunk carrying the token usage")


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None  # text, or content parts (only text parts are taken)
    name: str | None = None
    tool_calls: list[Any] | None = None
    function_call: Any = None


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(description="gearshift, gearshift-learned, gearshift-instant, gearshift-reasoning or gearshift-agentic")
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_completion_tokens: int | None = Field(None, ge=1, description="Most tokens the policy generates over the episode (Budget.max_output_tokens)")
    max_tokens: int | None = Field(None, ge=1, description="Older name of max_completion_tokens")
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    stop: str | list[str] | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    reasoning_effort: str | None = None
    # Refused unless they ask for what the gateway does anyway (translate.UNSUPPORTED).
    seed: int | None = None
    n: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None
    function_call: Any = None
    response_format: dict[str, Any] | None = None
    logit_bias: dict[str, Any] | None = None
    modalities: list[str] | None = None
    audio: Any = None
    prediction: Any = None
    web_search_options: Any = None


class FeedbackRequest(BaseModel):
    """A client's verdict on an answer it was served: exactly one of reward, correct and
    reference_answer."""

    model_config = ConfigDict(extra="forbid")

    trajectory_id: str = Field(description="The x-gearshift-trajectory-id of the answer")
    reward: StrictFloat | StrictInt | None = Field(None, description="The answer's reward, 0 (worst) to 1 (best)")
    correct: StrictBool | None = Field(None, description="Whether the answer was right")
    reference_answer: str | None = Field(None, description="The right answer; the reward service grades the stored answer against it")
