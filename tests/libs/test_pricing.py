"""The shared cost table on hand-computed prices."""

from __future__ import annotations

import pytest
from gearshift.api.common.v1.common_pb2 import TokenUsage, Trajectory, Turn
from gearshift.errors import InvalidArgument
from gearshift.pricing import CostTable
from gearshift.settings import PriceTable, Settings

from tests.libs.rewards.trajectories import rollout, with_tool_results

TABLE = CostTable.from_prices(PriceTable())  # 0.10 / 0.40 per Mtok; python 1e-4, web_search 1e-3; 5e-5 per CPU-s


def test_a_trajectory_is_priced_part_by_part():
    trajectory = with_tool_results(rollout(), ("python", 1.5), ("python", 0.5), ("web_search", 0.0), ("calculator", 0.0))
    trajectory.usage.CopyFrom(TokenUsage(input_tokens=1000, output_tokens=500))
    cost = TABLE.price_trajectory(trajectory)
    assert cost.input_usd == pytest.approx(1000 * 0.10 / 1e6)  # 1e-4
    assert cost.output_usd == pytest.approx(500 * 0.40 / 1e6)  # 2e-4
    assert cost.tools_usd == pytest.approx(2 * 1e-4 + 1e-3)  # calculator is not in the table: free
    assert cost.sandbox_usd == pytest.approx(2.0 * 5e-5)
    assert cost.total_usd == pytest.approx(1.6e-3)


def test_cached_input_tokens_are_priced_at_the_cached_rate_and_the_flat_total_is_kept():
    trajectory = Trajectory(turns=[Turn(usage=TokenUsage(input_tokens=1000, output_tokens=10, cached_input_tokens=0)),
                                   Turn(usage=TokenUsage(input_tokens=1100, output_tokens=10, cached_input_tokens=1000))])
    cost = TABLE.price_trajectory(trajectory)  # 0.025 per Mtok cached
    assert cost.input_usd == pytest.approx((1100 * 0.10 + 1000 * 0.025) / 1e6)
    assert cost.total_usd == pytest.approx(cost.input_usd + 20 * 0.40 / 1e6)
    assert cost.flat_total_usd == pytest.approx((2100 * 0.10 + 20 * 0.40) / 1e6)
    with pytest.raises(InvalidArgument, match="cached"):
        TABLE.price(100, 0, cached_input_tokens=101)


def test_a_table_without_a_cached_rate_prices_cached_tokens_in_full():
    table = CostTable(input_per_token=1.0, output_per_token=0.0)
    cost = table.price(10, 0, cached_input_tokens=4)
    assert cost.total_usd == cost.flat_total_usd == 10.0


def test_turn_usage_is_summed_when_the_trajectory_has_none():
    trajectory = Trajectory(turns=[Turn(usage=TokenUsage(input_tokens=10, output_tokens=1)), Turn(usage=TokenUsage(input_tokens=20, output_tokens=2))])
    assert TABLE.price_trajectory(trajectory).total_usd == pytest.approx(30 * 0.1e-6 + 3 * 0.4e-6)


def test_prices_come_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("GEARSHIFT_PRICES__OUTPUT_PER_MTOK", "2.0")
    monkeypatch.setenv("GEARSHIFT_PRICES__TOOL_PER_CALL", '{"python": 0.5}')
    table = CostTable.from_prices(Settings(data_dir=tmp_path).prices)
    cost = table.price(0, 1_000_000, {"python": 2, "web_search": 1})
    assert (cost.output_usd, cost.tools_usd, cost.total_usd) == pytest.approx((2.0, 1.0, 3.0))


@pytest.mark.parametrize(
    "amounts",
    [
        {"input_tokens": -1, "output_tokens": 0},
        {"input_tokens": 0, "output_tokens": -5},
        {"input_tokens": 0, "output_tokens": 0, "cpu_seconds": -0.1},
        {"input_tokens": 0, "output_tokens": 0, "cpu_seconds": float("nan")},
        {"input_tokens": 0, "output_tokens": 0, "tool_calls": {"python": -1}},
    ],
)
def test_negative_amounts_are_refused(amounts):
    with pytest.raises(InvalidArgument):
        TABLE.price(**amounts)


def test_negative_cpu_seconds_in_a_trajectory_are_refused():
    with pytest.raises(InvalidArgument, match="cpu_seconds"):
        TABLE.price_trajectory(with_tool_results(rollout(), ("python", -2.0)))


def test_a_table_with_a_negative_price_is_refused():
    with pytest.raises(ValueError):
        CostTable(input_per_token=-1e-6, output_per_token=0.0)
