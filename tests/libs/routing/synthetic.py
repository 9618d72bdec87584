"""A learnable routing world, stored through a real store with the evaluation tagging contract.

Three query families, each with one cheapest correct mode: simple facts (instant), word
problems (reasoning: instant gets them wrong) and products of big numbers (agentic only).
"""

from __future__ import annotations

import contextlib
import random
import uuid
from collections.abc import AsyncIterator

from gearshift.api.common.v1.common_pb2 import Cost, Mode, Reward, RoutingStrategy, TokenUsage, Trajectory, TrajectoryStatus
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.clients import channel
from gearshift.protocol.modes import mode_name
from gearshift.server import running
from gearshift.services.store.service import build as build_store
from gearshift.settings import Settings

INSTANT, REASONING, AGENTIC = Mode.MODE_INSTANT, Mode.MODE_REASONING, Mode.MODE_AGENTIC
MODES = (INSTANT, REASONING, AGENTIC)
COST = {INSTANT: 0.00001, REASONING: 0.00004, AGENTIC: 0.0001}  # per attempt, US dollars
SUITE = "synthetic"
COUNTRIES = ["France", "Spain", "Italy", "Peru", "Chile", "Japan", "Kenya", "Egypt", "Norway", "Canada", "Brazil", "India"]
NAMES = ["Tom", "Ana", "Li", "Sam", "Ravi", "Mia", "Olu", "Eva"]
FRUITS = ["apples", "pears", "plums", "eggs", "cards", "books"]


def make_item(rng: random.Random, family: str) -> tuple[str, set[int]]:
    """(query, the modes that answer it correctly)."""
    if family == "fact":
        return f"What is the capital of {rng.choice(COUNTRIES)}?", {INSTANT, REASONING, AGENTIC}
    if family == "word":
        a, b, c = rng.randint(2, 9), rng.randint(3, 20), rng.randint(1, 5)
        name, thing = rng.choice(NAMES), rng.choice(FRUITS)
        return f"{name} has {a} boxes of {b} {thing} and gives away {c}. How many {thing} are left?", {REASONING, AGENTIC}
    x, y = rng.randint(10**7, 10**11), rng.randint(10**7, 10**11)
    return f"What is {x} * {y}?", {AGENTIC}


def trajectory(run_id: str, split: str, item_id: str, query: str, mode: int, correct: bool, cost: float,
               sample: int = 0, strategy: int = RoutingStrategy.ROUTING_STRATEGY_FORCED, family: str = "") -> Trajectory:
    """A trajectory tagged as the evaluation harness tags it."""
    requested = mode if strategy == RoutingStrategy.ROUTING_STRATEGY_FORCED else Mode.MODE_UNSPECIFIED
    key = mode_name(mode) if strategy == RoutingStrategy.ROUTING_STRATEGY_FORCED else "auto"
    return Trajectory(
        id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"{run_id}/{item_id}/{key}/{sample}")),
        query=query,
        mode=mode,
        requested_mode=requested,
        routing_strategy=strategy,
        answer="42",
        reference_answer="42" if correct else "43",
        status=TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED,
        usage=TokenUsage(input_tokens=100, output_tokens=20),
        cost=Cost(total_usd=cost, output_usd=cost),
        reward=Reward(value=float(correct), correct=correct, format_valid=True, kind="apo", verifier="exact"),
        task_source=SUITE,
        split=split,
        run_id=run_id,
        labels={"item_id": item_id, "difficulty": "1", "domain": family, "sample": str(sample)},
    )


def world(run_id: str, counts: dict[str, int], seed: int = 0, native_mode: int | None = AGENTIC) -> list[Trajectory]:
    """Forced attempts in every mode for counts[split] items per split, plus one model-native
    attempt per item (the policy always choosing native_mode) unless native_mode is None."""
    rng = random.Random(seed)
    out = []
    for split, count in counts.items():
        for index in range(count):
            family = ("fact", "word", "big")[index % 3]
            query, correct_modes = make_item(rng, family)
            item_id = f"{split}-{index}"
            for mode in MODES:
                cost = COST[mode] * rng.uniform(0.9, 1.1)
                out.append(trajectory(run_id, split, item_id, query, mode, mode in correct_modes, cost, family=family))
            if native_mode is not None:
                out.append(trajectory(run_id, split, item_id, query, native_mode, native_mode in correct_modes,
                                      COST[native_mode], strategy=RoutingStrategy.ROUTING_STRATEGY_MODEL, family=family))
    return out


async def put(stub: store_pb2_grpc.TrajectoryStoreStub, trajectories: list[Trajectory]) -> None:
    for start in range(0, len(trajectories), 500):
        await stub.Put(store_pb2.PutRequest(trajectories=trajectories[start : start + 500]))


@contextlib.asynccontextmanager
async def running_store(settings: Settings) -> AsyncIterator[tuple[Settings, store_pb2_grpc.TrajectoryStoreStub]]:
    """A store service on a free loopback port; yields settings pointing at it and a stub."""
    async with running(await build_store(settings), settings) as server:
        configured = settings.model_copy(update={"store_addr": f"127.0.0.1:{server.port}"})
        async with channel(configured.store_addr, configured) as ch:
            yield configured, store_pb2_grpc.TrajectoryStoreStub(ch)
