"""Mode decisions, free of gRPC: forced, model-native (the policy writes its classification
block, A^2FM), or a learned cost-aware classifier plugged in through `LearnedRouter`."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol

from gearshift.api.common.v1.common_pb2 import Conversation, RoutingStrategy, SampledSpan, TokenUsage
from gearshift.errors import FailedPrecondition, InvalidArgument
from gearshift.pricing import add_usage
from gearshift.policy_client import PolicyClient
from gearshift.protocol import a2fm, prompts
from gearshift.protocol.modes import MODE_OF, NAME_OF
from gearshift.protocol.sampled import sampled_span
from gearshift.sampling import sampling_options
from gearshift.settings import RouterSettings

RATIONALE_CHARS = 300  # one sentence; longer rationales are cut
LABEL_TOKENS = 12  # enough for "toolcalling_agent" in any tokenizer
STRATEGY_BY_NAME = {"model": RoutingStrategy.ROUTING_STRATEGY_MODEL, "learned": RoutingStrategy.ROUTING_STRATEGY_LEARNED}


@dataclass
class ModeDecision:
    mode: int
    strategy: int
    rationale: str
    assistant_prefix: str  # the assistant turn so far: rationale + classification block
    scores: dict[int, tuple[float, float]] = field(default_factory=dict)  # mode -> (score, expected cost of pass)
    usage: TokenUsage = field(default_factory=TokenUsage)  # every policy call's, retries included
    attempts: int = 0
    router_version: str = ""
    sampled: SampledSpan | None = None  # what the policy sampled of the routing head


class LearnedRouter(Protocol):
    """What a learned router offers the router service (see the learned-router job)."""

    version: str

    def decide(self, query: str) -> ModeDecision: ...


class ModeRouter:
    def __init__(self, policy: PolicyClient | None, config: RouterSettings, learned: LearnedRouter | None = None):
        self.policy = policy
        self.config = config
        self.learned = learned

    async def route(self, query: str, strategy: int, forced_mode: int, sampling: dict | None = None,
                    conversation: Conversation | None = None) -> ModeDecision:
        """The mode for a query in its conversation; a model-routed decision samples with
        sampling (default greedy)."""
        if not query.strip():
            raise InvalidArgument("query is empty")
        if forced_mode and forced_mode not in NAME_OF:
            raise InvalidArgument(f"unknown mode {forced_mode}")
        if strategy == RoutingStrategy.ROUTING_STRATEGY_UNSPECIFIED:
            strategy = RoutingStrategy.ROUTING_STRATEGY_FORCED if forced_mode else STRATEGY_BY_NAME[self.config.default_strategy]
        if strategy == RoutingStrategy.ROUTING_STRATEGY_FORCED:
            if not forced_mode:
                raise InvalidArgument("strategy FORCED needs forced_mode INSTANT, REASONING or AGENTIC")
            rationale = a2fm.FORCED_JUSTIFICATION[forced_mode]
            return ModeDecision(forced_mode, strategy, rationale, a2fm.episode_prefix(forced_mode, rationale))
        if strategy == RoutingStrategy.ROUTING_STRATEGY_LEARNED:
            if self.learned is None:
                raise FailedPrecondition("no learned router is published; train one with `gearshift router train`")
            return await asyncio.to_thread(self.learned.decide, query)  # an embedding can take milliseconds
        if strategy == RoutingStrategy.ROUTING_STRATEGY_MODEL:
            return await self._ask_policy(query, sampling or sampling_options(), conversation)
        raise InvalidArgument(f"unknown strategy {strategy}")

    async def _ask_policy(self, query: str, sampling: dict, conversation: Conversation | None) -> ModeDecision:
        """The policy writes a rationale and a classification block. A reply without a known label
        is re-asked with its rationale and the block's opening prefilled, so the model only has
        to name the label; after max_attempts the configured fallback mode is used."""
        if self.policy is None:
            raise FailedPrecondition("model routing needs a policy server")
        usage = TokenUsage()
        rationale = opening = ""
        for attempt in range(1, self.config.max_attempts + 1):
            if attempt == 1:
                reply = await self.policy.chat(
                    prompts.messages(query, conversation=conversation), max_tokens=self.config.max_tokens, stop=[a2fm.CLASSIFICATION_STOP], **sampling
                )
                text = reply.content or ""
                rationale = text.split("<classification>")[0].strip().split("\n")[0][:RATIONALE_CHARS]
            else:
                opening = f"{rationale}\n<classification>\n" if rationale else "<classification>\n"
                reply = await self.policy.chat(
                    prompts.messages(query, opening, conversation),
                    max_tokens=LABEL_TOKENS,
                    temperature=0.0 if attempt == 2 else self.config.retry_temperature,
                    stop=[a2fm.CLASSIFICATION_STOP],
                    continue_final_message=True,
                    add_generation_prompt=False,
                )
                text = opening + (reply.content or "")
            add_usage(usage, reply.usage.tokens())
            mode, said = a2fm.parse_classification(text)
            if mode is not None:
                rationale = said.split("\n")[0][:RATIONALE_CHARS]
                prefix = a2fm.episode_prefix(mode, rationale)
                head = len(prefix) - len(prompts.MODE_OPENERS[mode])  # rationale and classification block
                return ModeDecision(mode, RoutingStrategy.ROUTING_STRATEGY_MODEL, rationale, prefix,
                                    usage=usage, attempts=attempt,
                                    sampled=sampled_span(len(opening), head, reply.token_ids, reply.logprobs))
        mode = MODE_OF[self.config.fallback_mode]
        note = f"No known label after {self.config.max_attempts} attempts; fell back to {self.config.fallback_mode}."
        return ModeDecision(mode, RoutingStrategy.ROUTING_STRATEGY_FALLBACK, note, a2fm.episode_prefix(mode, note),
                            usage=usage, attempts=self.config.max_attempts)
