"""Mode decisions, free of gRPC."""

from __future__ import annotations

from dataclasses import dataclass, field

from gearshift.common.v1.common_pb2 import Mode, RoutingStrategy
from gearshift.errors import InvalidArgument, Unimplemented

# One-sentence justifications injected before a forced classification block (A^2FM).
FORCED_RATIONALE = {
    Mode.MODE_INSTANT: "The caller asked for a direct answer.",
    Mode.MODE_REASONING: "The caller asked for step-by-step reasoning.",
    Mode.MODE_AGENTIC: "The caller asked for tool use.",
}


@dataclass
class ModeDecision:
    mode: int
    strategy: int
    rationale: str
    scores: dict[int, float] = field(default_factory=dict)
    input_tokens: int = 0
    output_tokens: int = 0
    attempts: int = 0


class ModeRouter:
    def __init__(self, default_strategy: int = RoutingStrategy.ROUTING_STRATEGY_MODEL):
        self.default_strategy = default_strategy

    async def route(self, query: str, strategy: int, forced_mode: int) -> ModeDecision:
        if not query.strip():
            raise InvalidArgument("query is empty")
        if strategy == RoutingStrategy.ROUTING_STRATEGY_UNSPECIFIED:
            strategy = RoutingStrategy.ROUTING_STRATEGY_FORCED if forced_mode else self.default_strategy
        if strategy == RoutingStrategy.ROUTING_STRATEGY_FORCED:
            if forced_mode not in FORCED_RATIONALE:
                raise InvalidArgument("strategy FORCED needs forced_mode INSTANT, REASONING or AGENTIC")
            return ModeDecision(forced_mode, strategy, FORCED_RATIONALE[forced_mode])
        if strategy == RoutingStrategy.ROUTING_STRATEGY_MODEL:
            raise Unimplemented("model routing arrives with the policy engine")
        raise Unimplemented("learned routing arrives with the learned router")
