"""The policy engine: holds the current model, turns validated requests into generation jobs,
hands them to the batching scheduler, and switches checkpoints hot.

No HTTP here (app.py translates). Requests are accepted concurrently; the scheduler
(scheduler.py) decodes them together on its one thread. A hot switch loads the new weights on
another thread, then replaces the model reference in one assignment: every job captured its
model when it was accepted, so in-flight (and already queued) generations finish on the old
weights, and the old model is freed when the last of them ends.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import torch
from gearshift import vllm_plugins, weights
from gearshift.errors import InvalidArgument, NotFound
from gearshift.protocol import parsers
from gearshift.protocol.parsers import a2fm
from gearshift.services.policy_server.generation import GenerationResult, SamplingParams
from gearshift.services.policy_server.prompts import render_chat
from gearshift.services.policy_server.scheduler import Scheduler, Sequence
from gearshift.services.policy_server.schemas import (
    ChatCompletionRequest,
    ChatRendering,
    CompletionRequest,
    DetokenizeRequest,
    NamedToolChoice,
    SamplingFields,
    TokenizeRequest,
)
from gearshift.settings import PolicyServerSettings

log = logging.getLogger("gearshift.policy_server")

class FieldRefused(InvalidArgument):
    """A request field this server cannot honour (a 400 whose `param` names it)."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


class ModelNotFound(NotFound):
    """A request named a model this server does not serve (404 model_not_found, as OpenAI and vLLM)."""

    param = "model"
    error_code = "model_not_found"


@dataclass
class Job:
    """One validated generation, bound to the model that was current when it was accepted."""

    loaded: weights.LoadedModel
    prompt_ids: list[int]
    params: SamplingParams


@dataclass(frozen=True)
class ReplyFormat:
    """How a chat reply's text becomes content, reasoning_content and tool_calls: an output
    format of gearshift.protocol.parsers, and how it starts."""

    name: str
    options: dict

    def splitter(self) -> parsers.Splitter:
        return parsers.get(self.name)(**self.options)

    def split(self, text: str) -> parsers.Parsed:
        return parsers.get(self.name).parse(text, **self.options)


@dataclass
class ChatJobs:
    """The n jobs of a chat request (one prompt), and how their text is read back."""

    jobs: list[Job]
    reply: ReplyFormat
    max_tool_calls: int | None  # parallel_tool_calls false: 1


@dataclass
class ChatPrompt:
    """A chat request's prompt text, and how its reply is read."""

    text: str
    reply: ReplyFormat
    stop: list[str]  # stop words the format adds (the A^2FM step pauses after a call, ends after the answer)


@dataclass
class SwitchReport:
    """What POST /v1/load answers."""

    model: str
    source: str
    path: str
    load_seconds: float  # reading the new weights (off the request path)
    swap_seconds: float  # the reference swap itself
    total_seconds: float
    in_flight: int  # generations still running on the old model at the swap


@dataclass
class Tally:
    """Running totals since start (served as Prometheus metrics on /metrics)."""

    generations: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    generation_seconds: float = 0.0
    switches: int = 0


class Generation:
    """A submitted job as its request sees it: the pieces of text as they come, then the
    GenerationResult. Leaving early (a client that went away) cancels it at the next step."""

    def __init__(self, job: Job, on_result, scheduler: Scheduler):
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._on_result = on_result
        self._scheduler = scheduler
        self._started = time.perf_counter()
        self._done = False
        self.sequence = Sequence(job.loaded, job.prompt_ids, job.params, self._deliver)

    def _deliver(self, item: object) -> None:  # called on the scheduler thread
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the event loop is gone: nobody is listening any more
            self.sequence.cancelled = True

    async def items(self) -> AsyncIterator[str | GenerationResult]:
        try:
            while True:
                item = await self._queue.get()
                if isinstance(item, Exception):
                    self._done = True
                    raise item
                if isinstance(item, GenerationResult):
                    self._done = True
                    self._on_result(item, time.perf_counter() - self._started)  # before the consumer may close us
                    yield item
                    return
                yield item
        finally:
            self.cancel()

    async def result(self) -> GenerationResult:
        """Runs to the end and returns the result (for non-streamed replies)."""
        items = self.items()
        try:
            async for item in items:
                if isinstance(item, GenerationResult):
                    return item
        finally:
            await items.aclose()
        raise RuntimeError("generation ended without a result")

    def cancel(self) -> None:
        if not self._done:
            self._done = True
            self._scheduler.cancel(self.sequence)


def _check_tool_choice(choice: object, tools: list[dict] | None) -> None:
    """tool_choice "none" and "auto" are honoured; forcing a call would need guided decoding."""
    if isinstance(choice, NamedToolChoice):
        name = choice.function.name
        if name not in {tool["function"]["name"] for tool in tools or []}:
            raise FieldRefused("tool_choice", f"tool_choice names {name!r}, which is not among the tools")
    if choice == "required" or isinstance(choice, NamedToolChoice):
        raise FieldRefused(
            "tool_choice",
            "tool_choice \"required\" or a named function needs guided decoding, which the built-in policy server "
            "does not have: send \"auto\" (the model decides) or \"none\", or serve the model with vLLM",
        )


class PolicyEngine:
    """The one model of this process and the thread that generates with it."""

    def __init__(self, loaded: weights.LoadedModel, settings: PolicyServerSettings, models_dir: Path):
        self.settings = settings
        self.models_dir = models_dir
        self.served_name = settings.served_model_name
        self.a2fm_template = vllm_plugins.CHAT_TEMPLATE.read_text()
        self.chat_template = vllm_plugins.chat_template_text(settings.chat_template)  # read once: kept across hot switches
        self.tally = Tally()
        self._switching = asyncio.Lock()
        self.scheduler = Scheduler(settings, loaded)  # holds the current model: no closure back to the engine, no cycle

    @classmethod
    async def start(cls, settings: PolicyServerSettings, models_dir: Path) -> PolicyEngine:
        """Loads the configured model (off the event loop) and returns a ready engine."""
        cls._pin_threads(settings.threads)
        loaded = await asyncio.to_thread(weights.load, settings.model, models_dir, settings.dtype)
        engine = cls(loaded, settings, models_dir)
        engine.scheduler.prepare(loaded)
        return engine

    @staticmethod
    def _pin_threads(threads: int) -> None:
        torch.set_num_threads(max(1, threads))  # loading; the scheduler thread pins its own

    @property
    def current(self) -> weights.LoadedModel:
        return self.scheduler.current

    @property
    def in_flight(self) -> int:
        """Generations queued or running."""
        return self.scheduler.in_flight()

    def close(self) -> None:
        self.scheduler.close()

    # Requests -> jobs

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.served_name:
            raise ModelNotFound(f"the model {name!r} does not exist: this server serves {self.served_name!r}")

    def _params(self, request: SamplingFields) -> list[SamplingParams]:
        """The sampling parameters of each of the request's n choices per prompt. With a seed,
        choice i samples with seed + i (as vLLM does): n samples of one seed would be the same."""
        cap = self.settings.max_tokens_cap
        requested = request.requested_max_tokens()
        max_tokens = self.settings.default_max_tokens if requested is None else requested
        if not 1 <= max_tokens <= cap:
            raise InvalidArgument(f"max_tokens must be between 1 and {cap}, got {max_tokens}")
        if request.n > self.settings.max_n:
            raise FieldRefused("n", f"n must be at most {self.settings.max_n} on this server, got {request.n}")
        logprobs = request.requested_logprobs()
        if logprobs is not None and logprobs > self.settings.max_logprobs:
            field = "top_logprobs" if isinstance(request, ChatCompletionRequest) else "logprobs"
            raise FieldRefused(field, f"{field} must be at most {self.settings.max_logprobs}, got {logprobs}")
        return [
            SamplingParams(
                max_tokens=max_tokens,
                temperature=request.temperature,
                top_p=request.top_p,
                frequency_penalty=request.frequency_penalty,
                presence_penalty=request.presence_penalty,
                stop=list(request.stop or []),
                seed=None if request.seed is None else request.seed + choice,
                ignore_eos=request.ignore_eos,
                logprobs=logprobs,
            )
            for choice in range(request.n)
        ]

    def _prompt_ids(self, loaded: weights.LoadedModel, text: str, special: bool, max_tokens: int) -> list[int]:
        if len(text) > self.settings.max_prompt_chars:
            raise InvalidArgument(f"prompt is longer than {self.settings.max_prompt_chars} characters")
        ids = loaded.tokenizer(text, add_special_tokens=special)["input_ids"]
        if len(ids) + max_tokens > loaded.context_length:
            raise InvalidArgument(
                f"prompt ({len(ids)} tokens) plus max_tokens ({max_tokens}) exceeds "
                f"the model's context of {loaded.context_length} tokens"
            )
        return ids

    def _jobs(self, loaded: weights.LoadedModel, text: str, choices: list[SamplingParams], special: bool) -> list[Job]:
        """The n jobs of one prompt, tokenized once."""
        ids = self._prompt_ids(loaded, text, special, choices[0].max_tokens)
        return [Job(loaded, ids, params) for params in choices]

    def completion_jobs(self, request: CompletionRequest) -> list[Job]:
        """The jobs of a /v1/completions request: n per prompt, prompt by prompt."""
        self.check_model(request.model)
        prompts = [request.prompt] if isinstance(request.prompt, str) else request.prompt
        if not prompts or any(not prompt.strip() for prompt in prompts):
            raise InvalidArgument("prompt is empty")
        choices = self._params(request)
        loaded = self.current
        return [job for prompt in prompts for job in self._jobs(loaded, prompt, choices, special=True)]

    def template_of(self, loaded: weights.LoadedModel, native: bool) -> str | None:
        """The chat template a request renders with (None: the model's own): the chat_template
        setting's; else, for the default policy, the A^2FM template when the request asks for
        OpenAI's native fields (declares tools or sets enable_thinking, the requests vLLM's a2fm
        parsers read). The platform's own prompts (router, planner, judge, page summaries) ask for
        neither and render with the model's template, as the default policy was taught on."""
        if self.chat_template is not None:
            return self.chat_template
        return self.a2fm_template if native and loaded.source == weights.DEFAULT else None

    def chat_prompt(self, loaded: weights.LoadedModel, request: ChatRendering) -> ChatPrompt:
        """The prompt text of chat messages (with the tools, when given and tool_choice is not
        "none"), and how the reply is read."""
        messages = [message.as_template_dict() for message in request.messages]
        if not any(message["content"].strip() or message.get("tool_calls") for message in messages):
            raise InvalidArgument("messages are empty")
        use_tools = bool(request.tools) and request.tool_choice != "none"
        tools = [tool.model_dump(exclude_none=True) for tool in request.tools] if use_tools else None
        _check_tool_choice(request.tool_choice, tools)
        kwargs = request.chat_template_kwargs or {}
        native = use_tools or kwargs.get("enable_thinking") is not None
        template = self.template_of(loaded, native)
        try:
            text = render_chat(
                loaded.tokenizer, messages, tools, request.add_generation_prompt, request.continue_final_message, template, kwargs
            )
        except InvalidArgument:
            raise
        except Exception as exc:  # jinja raises whatever a template author chose (TemplateError, ...)
            raise InvalidArgument(f"the chat template rejected these messages: {exc}") from None
        if native and template == self.a2fm_template:
            # The A^2FM format in OpenAI's fields, as vLLM's a2fm parsers give it for the same
            # requests; any other request reads its text as before (the text protocol's are raw).
            state = a2fm.generation_state(messages, request.add_generation_prompt, request.continue_final_message, kwargs)
            return ChatPrompt(text, ReplyFormat("a2fm", {"state": state, "parse_tools": use_tools}), list(a2fm.STOP_WORDS))
        if request.continue_final_message:  # the text as generated, tags and whitespace included: what the continuation says
            return ChatPrompt(text, ReplyFormat("think", {"parse_tools": False, "parse_reasoning": False, "trim": False}), [])
        return ChatPrompt(text, ReplyFormat("think", {"parse_tools": use_tools}), [])

    def chat_jobs(self, request: ChatCompletionRequest) -> ChatJobs:
        """The n jobs of a /v1/chat/completions request, and how to read their text back."""
        self.check_model(request.model)
        choices = self._params(request)
        loaded = self.current
        prompt = self.chat_prompt(loaded, request)
        for params in choices:
            params.stop += [word for word in prompt.stop if word not in params.stop]
        return ChatJobs(
            jobs=self._jobs(loaded, prompt.text, choices, special=False),
            reply=prompt.reply,
            max_tool_calls=1 if request.parallel_tool_calls is False else None,
        )

    def tokenize(self, request: TokenizeRequest) -> list[int]:
        """vLLM's /tokenize: the token ids of a prompt, or of chat messages as rendered for a chat request."""
        self.check_model(request.model)
        loaded = self.current
        if request.messages is None:
            special = True if request.add_special_tokens is None else request.add_special_tokens
            return self._prompt_ids(loaded, request.prompt or "", special, 0)
        return self._prompt_ids(loaded, self.chat_prompt(loaded, request).text, bool(request.add_special_tokens), 0)

    def detokenize(self, request: DetokenizeRequest) -> str:
        self.check_model(request.model)
        tokenizer = self.current.tokenizer
        if any(not 0 <= token < len(tokenizer) for token in request.tokens):
            raise FieldRefused("tokens", f"token ids must be between 0 and {len(tokenizer) - 1}")
        return tokenizer.decode(request.tokens)

    # Running

    def submit(self, jobs: list[Job]) -> list[Generation]:
        """Queues the jobs for the scheduler (all or none: QueueFull, a 429, when the queue is full)."""
        generations = [Generation(job, self._count, self.scheduler) for job in jobs]
        self.scheduler.submit([generation.sequence for generation in generations])
        return generations

    async def run(self, job: Job) -> AsyncIterator[str | GenerationResult]:
        """Yields pieces of text as they are generated, then the GenerationResult."""
        async for item in self.submit([job])[0].items():
            yield item

    def _count(self, result: GenerationResult, seconds: float) -> None:
        self.tally.generations += 1
        self.tally.prompt_tokens += result.prompt_tokens
        self.tally.completion_tokens += result.completion_tokens
        self.tally.generation_seconds += seconds

    async def generate_all(self, job: Job) -> GenerationResult:
        """Runs a job to the end and returns its result (for non-streamed replies)."""
        return await self.submit([job])[0].result()

    def weights_changed(self) -> None:
        """The served module's weights were changed in place (a trainer's update between its
        rollouts): the KV of prompts cached with the old weights must not be reused. The cache is
        keyed by the loaded model, so a new record of the same module leaves it behind."""
        self.scheduler.current = dataclasses.replace(self.current)

    # Hot switch

    async def switch(self, source: str, served_name: str | None = None) -> SwitchReport:
        """Loads another checkpoint and makes it current without touching running generations."""
        async with self._switching:
            started = time.perf_counter()
            loaded = await asyncio.to_thread(weights.load, source, self.models_dir, self.settings.dtype)
            self.scheduler.prepare(loaded)
            swap_started = time.perf_counter()
            in_flight = self.scheduler.in_flight(self.current)
            self.scheduler.current = loaded
            self.tally.switches += 1
            if served_name:
                self.served_name = served_name
            done = time.perf_counter()
        log.info("switched to %s (%s) in %.2f s, %d generation(s) finishing on the old model", source, loaded.path, done - started, in_flight)
        return SwitchReport(
            model=self.served_name,
            source=source,
            path=str(loaded.path),
            load_seconds=round(loaded.load_seconds, 3),
            swap_seconds=round(done - swap_started, 6),
            total_seconds=round(done - started, 3),
            in_flight=in_flight,
        )
