"""The one cost model: serving, evaluation and training price trajectories with the same table.

Cost = input tokens * price_in + output tokens * price_out + the per-call price of each tool
call + sandbox CPU seconds * price per CPU-second (docs/protocol.md, section 5), where input
tokens the engine served from its prefix cache are priced at the cached-input rate, as API
providers bill them: an agentic episode re-sends its whole context every turn. The flat total
(every input token at the full rate) is kept beside it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gearshift.api.common.v1.common_pb2 import Cost, TokenUsage, Trajectory
from gearshift.errors import InvalidArgument
from gearshift.settings import PriceTable

PER_MILLION = 1_000_000


@dataclass(frozen=True)
class CostTable:
    """Prices in US dollars. Tools missing from tool_per_call are free (e.g. a local calculator)."""

    input_per_token: float
    output_per_token: float
    tool_per_call: Mapping[str, float] = field(default_factory=dict)
    sandbox_per_cpu_second: float = 0.0
    cached_input_per_token: float | None = None  # None: cached tokens cost what others do

    def __post_init__(self) -> None:
        if self.cached_input_per_token is None:
            object.__setattr__(self, "cached_input_per_token", self.input_per_token)
        prices = [self.input_per_token, self.cached_input_per_token, self.output_per_token, self.sandbox_per_cpu_second,
                  *self.tool_per_call.values()]
        if any(not math.isfinite(p) or p < 0 for p in prices):
            raise ValueError("prices must be finite and non-negative")
        object.__setattr__(self, "tool_per_call", MappingProxyType(dict(self.tool_per_call)))

    @classmethod
    def from_prices(cls, prices: PriceTable) -> CostTable:
        """The table configured in Settings.prices (per-million-token prices become per-token)."""
        return cls(
            input_per_token=prices.input_per_mtok / PER_MILLION,
            cached_input_per_token=prices.cached_input_per_mtok / PER_MILLION,
            output_per_token=prices.output_per_mtok / PER_MILLION,
            tool_per_call=prices.tool_per_call,
            sandbox_per_cpu_second=prices.sandbox_per_cpu_second,
        )

    def price(
        self,
        input_tokens: int,
        output_tokens: int,
        tool_calls: Mapping[str, int] | None = None,
        cpu_seconds: float = 0.0,
        cached_input_tokens: int = 0,
    ) -> Cost:
        """Prices raw amounts; tool_calls counts calls by tool name; cached_input_tokens are
        the part of input_tokens served from the engine's prefix cache."""
        tool_calls = tool_calls or {}
        amounts = [input_tokens, output_tokens, cpu_seconds, cached_input_tokens, *tool_calls.values()]
        if any(not math.isfinite(a) or a < 0 for a in amounts):
            raise InvalidArgument("token counts, tool call counts and CPU seconds must be finite and non-negative")
        if cached_input_tokens > input_tokens:
            raise InvalidArgument(f"{cached_input_tokens} cached input tokens of {input_tokens} input tokens")
        input_usd = (input_tokens - cached_input_tokens) * self.input_per_token + cached_input_tokens * self.cached_input_per_token
        output_usd = output_tokens * self.output_per_token
        tools_usd = sum(count * self.tool_per_call.get(name, 0.0) for name, count in tool_calls.items())
        sandbox_usd = cpu_seconds * self.sandbox_per_cpu_second
        rest = output_usd + tools_usd + sandbox_usd
        return Cost(
            total_usd=input_usd + rest,
            input_usd=input_usd,
            output_usd=output_usd,
            tools_usd=tools_usd,
            sandbox_usd=sandbox_usd,
            flat_total_usd=input_tokens * self.input_per_token + rest,
        )

    def price_trajectory(self, trajectory: Trajectory) -> Cost:
        """Prices a trajectory: its token usage and every executed tool call (each ToolResult).

        trajectory.usage counts routing too, so it wins when set; otherwise the turns' usage is
        summed.
        """
        usage = trajectory.usage if trajectory.HasField("usage") else _sum_usage(trajectory)
        calls: Counter[str] = Counter()
        cpu_seconds = 0.0
        for turn in trajectory.turns:
            for result in turn.tool_results:
                calls[result.name] += 1
                if not math.isfinite(result.cpu_seconds) or result.cpu_seconds < 0:
                    raise InvalidArgument(f"turn {turn.index}: tool result {result.call_id!r} has cpu_seconds {result.cpu_seconds}")
                cpu_seconds += result.cpu_seconds
        return self.price(usage.input_tokens, usage.output_tokens, calls, cpu_seconds, usage.cached_input_tokens)


def add_usage(total: TokenUsage, part: TokenUsage) -> None:
    """Adds one call's (or turn's) token counts to a running total."""
    total.input_tokens += part.input_tokens
    total.output_tokens += part.output_tokens
    total.cached_input_tokens += part.cached_input_tokens


def _sum_usage(trajectory: Trajectory) -> TokenUsage:
    total = TokenUsage()
    for turn in trajectory.turns:
        add_usage(total, turn.usage)
    return total


def flat_total_usd(cost: Cost) -> float:
    """A stored cost's flat total (stored before there was one: its total)."""
    return cost.flat_total_usd or cost.total_usd
