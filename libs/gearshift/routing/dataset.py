"""The router's training data, read from the trajectory store (Export with filters).

Evaluation runs tag their trajectories (the tagging contract shared with the harness):
task_source = suite, split, run_id, labels item_id / difficulty / domain / sample, and forced
runs carry routing_strategy FORCED with the mode. Per query (suite item) this gathers which
modes were tried, whether each attempt was correct (the stored reward) and what it cost.
Model-native (auto) attempts on the same items are kept for comparison.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field

import grpc

from gearshift.api.common.v1.common_pb2 import RoutingStrategy, Trajectory
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc

FORCED = RoutingStrategy.ROUTING_STRATEGY_FORCED
NATIVE = RoutingStrategy.ROUTING_STRATEGY_MODEL
# A mode counts as correct on an item when at least this share of its samples was correct.
CORRECT_SHARE = 0.5


@dataclass(frozen=True)
class Attempt:
    """One stored trajectory reduced to what routing needs."""

    trajectory_id: str
    run_id: str
    mode: int
    correct: bool
    cost_usd: float


@dataclass
class QueryOutcomes:
    """Everything stored about one suite item."""

    key: str  # task_source/item_id
    query: str
    split: str
    difficulty: str = ""
    domain: str = ""
    forced: dict[int, list[Attempt]] = field(default_factory=dict)
    native: list[Attempt] = field(default_factory=list)

    def success_rate(self, mode: int) -> float:
        attempts = self.forced[mode]
        return sum(a.correct for a in attempts) / len(attempts)

    def mean_cost(self, mode: int) -> float:
        attempts = self.forced[mode]
        return sum(a.cost_usd for a in attempts) / len(attempts)

    def attempts(self) -> list[Attempt]:
        """Forced and native attempts together."""
        return [*(a for attempts in self.forced.values() for a in attempts), *self.native]

    def oracle_mode(self) -> int | None:
        """The cheapest tried mode that was correct (at least CORRECT_SHARE of its samples);
        None when no mode was. Ties in cost go to the lower mode (instant < reasoning < agentic)."""
        correct = [m for m in self.forced if self.success_rate(m) >= CORRECT_SHARE]
        return min(correct, key=lambda m: (self.mean_cost(m), m)) if correct else None


@dataclass
class RoutingDataset:
    items: list[QueryOutcomes]
    unscored: int = 0  # trajectories skipped because they carry no reward
    other: int = 0  # trajectories of other strategies (e.g. learned routing), not used

    def forced_attempts(self) -> list[Attempt]:
        return [a for item in self.items for attempts in item.forced.values() for a in attempts]

    @property
    def run_ids(self) -> list[str]:
        return sorted({a.run_id for item in self.items for a in item.attempts()})

    def subset(self, splits: Sequence[str]) -> RoutingDataset:
        return RoutingDataset([i for i in self.items if i.split in splits], self.unscored, self.other)


def item_key(trajectory: Trajectory) -> str:
    """The stable id of the query: the suite item, or a hash of the query text when untagged."""
    item_id = trajectory.labels.get("item_id") or "q-" + hashlib.sha256(trajectory.query.encode()).hexdigest()[:16]
    return f"{trajectory.task_source}/{item_id}"


def build_dataset(trajectories: Iterable[Trajectory]) -> RoutingDataset:
    """Groups scored trajectories by item (pure: no store needed)."""
    items: dict[str, QueryOutcomes] = {}
    unscored = other = 0
    for t in trajectories:
        if not t.HasField("reward"):
            unscored += 1
            continue
        if t.routing_strategy not in (FORCED, NATIVE):
            other += 1
            continue
        key = item_key(t)
        item = items.get(key)
        if item is None:
            item = items[key] = QueryOutcomes(key, t.query, t.split, t.labels.get("difficulty", ""), t.labels.get("domain", ""))
        attempt = Attempt(t.id, t.run_id, t.mode, t.reward.correct, t.cost.total_usd)
        if t.routing_strategy == FORCED:
            item.forced.setdefault(t.mode, []).append(attempt)
        else:
            item.native.append(attempt)
    return RoutingDataset(sorted(items.values(), key=lambda i: i.key), unscored, other)


@dataclass(frozen=True)
class DatasetQuery:
    """Which stored trajectories to read; empty fields do not filter."""

    task_source: str = ""
    run_ids: tuple[str, ...] = ()
    splits: tuple[str, ...] = ()
    model_version: str = ""

    def filters(self) -> list[store_pb2.TrajectoryFilter]:
        """One store filter per (run id, split) pair: the store matches each exactly."""
        return [
            store_pb2.TrajectoryFilter(task_source=self.task_source, model_version=self.model_version, run_id=run_id, split=split)
            for run_id in (self.run_ids or ("",))
            for split in (self.splits or ("",))
        ]


async def export(stub: store_pb2_grpc.TrajectoryStoreStub, query: DatasetQuery) -> AsyncIterator[Trajectory]:
    """Every matching trajectory, without turns (routing needs none), each once."""
    seen: set[str] = set()
    for flt in query.filters():
        async for trajectory in stub.Export(store_pb2.ExportRequest(filter=flt, include_turns=False)):
            if trajectory.id not in seen:
                seen.add(trajectory.id)
                yield trajectory


async def load_dataset(channel: grpc.aio.Channel, query: DatasetQuery) -> RoutingDataset:
    stub = store_pb2_grpc.TrajectoryStoreStub(channel)
    return build_dataset([t async for t in export(stub, query)])
