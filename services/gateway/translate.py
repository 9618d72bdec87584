"""OpenAI chat completions <-> executor.Solve: the model names, a request's checks and its
SolveRequest, and what the client is told of an episode, streamed (EpisodeView) or whole
(completion)."""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass

from gearshift.api.common.v1.common_pb2 import (
    ChatMessage,
    ChatRole,
    Conversation,
    Mode,
    PolicyProtocol,
    RoutingStrategy,
    Sampling,
    Trajectory,
    TrajectoryStatus,
)
from gearshift.api.executor.v1 import executor_pb2
from gearshift.protocol.a2fm import render_transcript
from gearshift.protocol.modes import MODE_OF, mode_name
from gearshift.protocol.parsers.a2fm import EpisodeText
from gearshift.sampling import SEEDS
from gearshift.services.gateway import api_keys, schemas
from gearshift.openai_http import ApiError
from gearshift.services.gateway.deltas import Delta, StopCut

log = logging.getLogger("gearshift.gateway")


@dataclass(frozen=True)
class ServedModel:
    """A model name clients ask for: how its episodes choose their mode."""

    name: str
    mode: int  # Mode; UNSPECIFIED: chosen by the strategy
    strategy: int  # RoutingStrategy
    description: str


MODELS = {
    model.name: model
    for model in (
        ServedModel("gearshift", Mode.MODE_UNSPECIFIED, RoutingStrategy.ROUTING_STRATEGY_MODEL,
                    "The policy routes each query to instant, reasoning or agentic mode itself"),
        ServedModel("gearshift-learned", Mode.MODE_UNSPECIFIED, RoutingStrategy.ROUTING_STRATEGY_LEARNED,
                    "The published learned router picks the cheapest mode expected to answer correctly"),
        *(ServedModel(f"gearshift-{name}", mode, RoutingStrategy.ROUTING_STRATEGY_FORCED, f"Every query in {name} mode")
          for name, mode in MODE_OF.items()),
    )
}
# reasoning_effort on the model "gearshift" pins a mode: no or minimal effort answers directly,
# low and medium think first, high (and OpenAI's xhigh) plans and calls tools.
REASONING_EFFORT = {
    "none": Mode.MODE_INSTANT, "minimal": Mode.MODE_INSTANT,
    "low": Mode.MODE_REASONING, "medium": Mode.MODE_REASONING,
    "high": Mode.MODE_AGENTIC, "xhigh": Mode.MODE_AGENTIC,
}
MAX_STOP_WORDS = 4  # as OpenAI
NATIVE_REASONING_SEPARATOR = "\n\n"  # between the reasoning_content of two turns (native protocol, agentic mode)
MAX_METADATA = 16  # as OpenAI

# Request fields the gateway cannot honour: refused when set to anything but what it does anyway.
UNSUPPORTED = (
    ("n", lambda v: v not in (None, 1), "n > 1 is not supported: one request runs one episode"),
    ("logprobs", bool, "logprobs are not supported: an episode's answer is not one generation"),
    ("top_logprobs", lambda v: v is not None, "top_logprobs is not supported: an episode's answer is not one generation"),
    ("tools", bool, "tools are not supported: the platform runs its own tools in agentic mode (use gearshift-agentic) "
     "and lists them in the gearshift extension"),
    ("tool_choice", lambda v: v not in (None, "none"), "tool_choice is not supported: the platform chooses its own tools"),
    ("functions", bool, "functions are not supported: the platform runs its own tools"),
    ("function_call", lambda v: v not in (None, "none"), "function_call is not supported: the platform runs its own tools"),
    ("response_format", lambda v: bool(v) and v.get("type") != "text", "response_format other than text is not supported"),
    ("logit_bias", bool, "logit_bias is not supported"),
    ("modalities", lambda v: v not in (None, ["text"]), "only the text modality is supported"),
    ("audio", lambda v: v is not None, "audio output is not supported"),
    ("prediction", lambda v: v is not None, "predicted outputs are not supported"),
    ("web_search_options", lambda v: v is not None, "web_search_options is not supported: agentic mode searches with its own tool"),
)


# Requests


def served_model(name: str) -> ServedModel:
    model = MODELS.get(name)
    if model is None:
        raise ApiError(404, f"The model `{name}` does not exist; one of {', '.join(MODELS)}", "model")
    return model


def solve_request(body: schemas.ChatCompletionRequest, trajectory_id: str, max_label_chars: int,
                  api_key: str = "") -> executor_pb2.SolveRequest:
    """The SolveRequest for a chat completion request, labelled with the name of the API key that
    asked for it; ApiError when the gateway cannot honour it."""
    for name, refused, message in UNSUPPORTED:
        if refused(getattr(body, name)):
            raise ApiError(400, message, name)
    if body.stream_options is not None and not body.stream:
        raise ApiError(400, "stream_options is only allowed when stream is true", "stream_options")
    mode, strategy = _route(body)
    query, conversation = _conversation(body.messages)
    request = executor_pb2.SolveRequest(
        query=query, mode=mode, strategy=strategy, trajectory_id=trajectory_id, conversation=conversation,
        labels=_labels(body, max_label_chars, api_key),
    )
    tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    if tokens is not None:  # what the policy generates, as OpenAI counts it; prompts are the platform's
        request.budget.max_output_tokens = tokens
    sampled = (body.temperature, body.top_p, body.seed, body.frequency_penalty, body.presence_penalty)
    if any(field is not None for field in sampled):  # unset: the executor's greedy defaults
        request.sampling.CopyFrom(Sampling(temperature=1.0 if body.temperature is None else body.temperature, top_p=body.top_p or 0.0,
                                           seed=None if body.seed is None else body.seed % SEEDS,
                                           frequency_penalty=body.frequency_penalty or 0.0, presence_penalty=body.presence_penalty or 0.0))
    stop_words(body)  # checked before the episode runs
    return request


def stop_words(body: schemas.ChatCompletionRequest) -> list[str]:
    words = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if len(words) > MAX_STOP_WORDS or not all(words):
        raise ApiError(400, f"stop takes at most {MAX_STOP_WORDS} non-empty strings", "stop")
    return words


def _route(body: schemas.ChatCompletionRequest) -> tuple[int, int]:
    model = served_model(body.model)
    if body.reasoning_effort is None:
        return model.mode, model.strategy
    if model.name != "gearshift":
        raise ApiError(400, f"reasoning_effort applies to the model gearshift only; {model.name} chooses its mode itself", "reasoning_effort")
    mode = REASONING_EFFORT.get(body.reasoning_effort)
    if mode is None:
        raise ApiError(400, f"reasoning_effort must be one of {', '.join(REASONING_EFFORT)}", "reasoning_effort")
    return mode, RoutingStrategy.ROUTING_STRATEGY_FORCED


def _conversation(messages: list[schemas.ChatMessage]) -> tuple[str, Conversation]:
    """The last message is the query; system and developer messages are the instructions; the
    user and assistant messages before it are the earlier turns."""
    if messages[-1].role != "user":
        raise ApiError(400, f"the last message must be the user's (role user), not {messages[-1].role}", "messages")
    instructions, earlier = [], []
    for index, message in enumerate(messages):
        if message.role in ("tool", "function"):
            raise ApiError(400, f"messages[{index}]: {message.role} messages are not supported: the platform runs its own "
                                "tools and keeps their results in the trajectory", "messages")
        if message.tool_calls or message.function_call:
            raise ApiError(400, f"messages[{index}]: assistant tool calls are not supported", "messages")
        text = _text(message, index)
        if message.role in ("system", "developer"):
            instructions.append(text)
        else:
            role = ChatRole.CHAT_ROLE_USER if message.role == "user" else ChatRole.CHAT_ROLE_ASSISTANT
            earlier.append(ChatMessage(role=role, content=text))
    query = earlier.pop().content
    if not query.strip():
        raise ApiError(400, "the last user message is empty", "messages")
    return query, Conversation(instructions="\n\n".join(part for part in instructions if part), messages=earlier)


def _text(message: schemas.ChatMessage, index: int) -> str:
    if message.content is None or isinstance(message.content, str):
        return message.content or ""
    texts = []
    for part in message.content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise ApiError(400, f"messages[{index}].content: only text parts are supported, not {str(part.get('type'))[:40]!r}", "messages")
        texts.append(part["text"])
    return "\n".join(texts)


def _labels(body: schemas.ChatCompletionRequest, max_chars: int, api_key: str) -> dict[str, str]:
    labels = dict(body.metadata or {})
    if len(labels) > MAX_METADATA:
        raise ApiError(400, f"metadata takes at most {MAX_METADATA} pairs", "metadata")
    if body.user is not None:
        labels["user"] = body.user
    for key, value in labels.items():
        if not key or len(key) > max_chars or len(value) > max_chars:
            raise ApiError(400, f"user and metadata keys and values take 1 to {max_chars} characters", "user" if key == "user" else "metadata")
    # The gateway's word, never the client's: feedback trusts it.
    labels.pop(api_keys.LABEL, None)
    if api_key:
        labels[api_keys.LABEL] = api_key
    return labels


def new_trajectory_id() -> str:
    return str(uuid.uuid4())


# Responses


def finish_reason(trajectory: Trajectory) -> str:
    return "stop" if trajectory.status == TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED else "length"


def usage(trajectory: Trajectory) -> dict:
    used = trajectory.usage
    return {"prompt_tokens": used.input_tokens, "completion_tokens": used.output_tokens,
            "total_tokens": used.input_tokens + used.output_tokens}


def extension(trajectory: Trajectory, routing_seconds: float | None) -> dict:
    """The `gearshift` object: what the platform did for the answer, and what it cost."""
    turns_in = sum(turn.usage.input_tokens for turn in trajectory.turns)
    turns_out = sum(turn.usage.output_tokens for turn in trajectory.turns)
    cost = trajectory.cost
    return {
        "trajectory_id": trajectory.id,
        "status": TrajectoryStatus.Name(trajectory.status).removeprefix("TRAJECTORY_STATUS_").lower(),
        "mode": mode_name(trajectory.mode),
        "routing_strategy": RoutingStrategy.Name(trajectory.routing_strategy).removeprefix("ROUTING_STRATEGY_").lower(),
        "routing_rationale": trajectory.routing_rationale,
        "routing_seconds": routing_seconds,
        "tool_calls": tool_calls(trajectory),
        "tokens": {
            "input": trajectory.usage.input_tokens,
            "output": trajectory.usage.output_tokens,
            "routing": {"input": trajectory.usage.input_tokens - turns_in, "output": trajectory.usage.output_tokens - turns_out},
        },
        "cost_usd": {"total": cost.total_usd, "input": cost.input_usd, "output": cost.output_usd, "tools": cost.tools_usd,
                     "sandbox": cost.sandbox_usd},
        "wall_seconds": trajectory.wall_seconds,
    }


def tool_calls(trajectory: Trajectory) -> list[dict]:
    """Every call the platform ran, with its result, in order; a call the policy wrote that did
    not parse is listed with its error and no name."""
    calls = []
    for turn in trajectory.turns:
        results = {result.call_id: result for result in turn.tool_results}
        for call in turn.tool_calls:
            result = results.pop(call.id, None)
            calls.append({"id": call.id, "name": call.name, "arguments": call.arguments_json,
                          "output": result.output if result else "", "is_error": result.is_error if result else True,
                          "error": result.error if result else "no result"})
        for result in results.values():
            calls.append({"id": result.call_id, "name": result.name, "arguments": None, "output": result.output,
                          "is_error": result.is_error, "error": result.error})
    return calls


def message(trajectory: Trajectory, stop: list[str]) -> dict:
    """The assistant message of a finished episode: the answer, and the reasoning (None without
    any): under the text protocol what the policy wrote between its <reasoning> tags, under the
    native one the reasoning_content the engine returned, turn by turn."""
    if trajectory.protocol == PolicyProtocol.POLICY_PROTOCOL_NATIVE:
        text = Delta(_native_partial(trajectory), NATIVE_REASONING_SEPARATOR.join(t.reasoning_content for t in trajectory.turns if t.reasoning_content))
    else:
        said = EpisodeText.parse(render_transcript(trajectory))
        text = Delta(said.content or "", said.reasoning or "")
    content = trajectory.answer if trajectory.status == TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED else text.content
    return {"role": "assistant", "content": StopCut(stop).cut(content), "reasoning_content": text.reasoning or None}


def _native_partial(trajectory: Trajectory) -> str:
    """What a native episode that ran out of budget had written of an answer: the last message
    in instant and reasoning mode, where the one message is the answer; none in agentic mode,
    where a message is the answer only once it ends without calls."""
    if trajectory.mode == Mode.MODE_AGENTIC or not trajectory.turns:
        return ""
    return trajectory.turns[-1].output.strip()


def completion(trajectory: Trajectory, model: str, created: int, routing_seconds: float | None, stop: list[str]) -> dict:
    choice = {"index": 0, "message": message(trajectory, stop), "finish_reason": finish_reason(trajectory), "logprobs": None}
    return {"id": completion_id(trajectory.id), "object": "chat.completion", "created": created, "model": model,
            "choices": [choice], "usage": usage(trajectory), "gearshift": extension(trajectory, routing_seconds)}


def completion_id(trajectory_id: str) -> str:
    return f"chatcmpl-{trajectory_id}"


class EpisodeView:
    """What the client is told of an episode as its events arrive: the answer and reasoning the
    executor streams already split, as deltas; the routing time; the stored trajectory at the end.

    When the executor's Answer event says more than was streamed (text the model left untagged),
    the rest is sent then, so the streamed content adds up to the answer."""

    def __init__(self, trajectory_id: str, started: float, stop: list[str], native: bool = False):
        self.trajectory_id = trajectory_id  # "" until the final event when the executor chooses it
        self.started = started
        self.native = native  # the executor speaks the native protocol (policy_client.protocol)
        self.routing_seconds: float | None = None
        self.trajectory: Trajectory | None = None
        self.mode = Mode.MODE_UNSPECIFIED
        self.reasoning_turn: int | None = None  # the turn whose reasoning came last (native)
        self.stop = StopCut(stop)
        self.sent = ""  # answer text given out so far, before the stop cut

    def on_event(self, event: executor_pb2.SolveEvent) -> Delta:
        kind = event.WhichOneof("event")
        if kind == "mode_chosen":
            self.routing_seconds = time.monotonic() - self.started
            self.mode = event.mode_chosen.mode
        elif kind == "chunk":
            return self._out(Delta(event.chunk.answer, self._reasoning(event.turn, event.chunk.reasoning)))
        elif kind == "answer":
            answer = event.answer.text
            if answer.startswith(self.sent):
                return self._out(Delta(answer[len(self.sent):]))
            log.warning("trajectory %s: the streamed answer is not the episode's answer", self.trajectory_id)
        elif kind == "final":
            self.trajectory = event.final.trajectory
            self.trajectory_id = self.trajectory.id
            return Delta(self.stop.finish())
        return Delta()

    def _reasoning(self, turn: int, reasoning: str) -> str:
        """Native protocol: each turn's reasoning_content apart, joined by a blank line."""
        if not reasoning or not self.native:
            return reasoning
        joined = self.reasoning_turn is not None and self.reasoning_turn != turn
        self.reasoning_turn = turn
        return (NATIVE_REASONING_SEPARATOR if joined else "") + reasoning

    def _out(self, delta: Delta) -> Delta:
        self.sent += delta.content
        delta.content = self.stop.feed(delta.content)
        return delta
