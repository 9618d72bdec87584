"""Reward service latency over loopback gRPC (not a test).

Measures, in one process against an in-process server on a free port:
  (a) Score on an APO group of 12 rollouts (3 forced per mode + 3 free, the paper's G) with
      the math verifier (math-verify), distinct answers so nothing is cached;
  (b) Score on the same group with normalized exact match;
  (c) CostOfPass over N attempts with 2,000 bootstrap resamples.
Prints the median and p90 wall time of each over the repeats.

    .venv/bin/python benchmarks/reward_latency.py            # 20 repeats, N = 10,000
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time

from gearshift.api.common.v1.common_pb2 import Mode, RoutingStrategy, TokenUsage, Trajectory, Turn
from gearshift.api.reward.v1 import reward_pb2, reward_pb2_grpc
from gearshift.clients import channel
from gearshift.server import running
from gearshift.services.reward.service import build
from gearshift.settings import Settings

MODES = (Mode.MODE_INSTANT, Mode.MODE_REASONING, Mode.MODE_AGENTIC)
OUTPUT = {
    Mode.MODE_INSTANT: "<answer>{a}</answer>",
    Mode.MODE_REASONING: "<reasoning>17*23 = 17*20 + 17*3.</reasoning>\n<answer>{a}</answer>",
    Mode.MODE_AGENTIC: "<plan>compute</plan>\n<tool_call>\n{{'id': 1, 'name': 'python', 'arguments': {{'code': 'print(17*23)'}}}}\n</tool_call>\n<answer>{a}</answer>",
}


def apo_group(repeat: int) -> list[Trajectory]:
    group = []
    for index in range(12):
        forced = index < 9
        mode = MODES[index // 3] if forced else MODES[index % 3]
        k = repeat * 12 + index + 2  # every answer is written differently: nothing is cached
        answer = f"\\frac{{{391 * k + index % 2}}}{{{k}}}"  # 391, or 391 + 1/k
        group.append(
            Trajectory(
                id=f"{repeat}-{index}",
                mode=mode,
                requested_mode=mode if forced else Mode.MODE_UNSPECIFIED,
                routing_strategy=RoutingStrategy.ROUTING_STRATEGY_FORCED if forced else RoutingStrategy.ROUTING_STRATEGY_MODEL,
                answer=answer,
                turns=[Turn(output=OUTPUT[mode].format(a=answer), usage=TokenUsage(input_tokens=300, output_tokens=120))],
            )
        )
    return group


def summary(name: str, seconds: list[float]) -> str:
    ordered = sorted(seconds)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return f"{name:<40} median {statistics.median(ordered) * 1e3:8.2f} ms   p90 {p90 * 1e3:8.2f} ms"


async def main(repeats: int, attempts: int) -> None:
    with tempfile.TemporaryDirectory() as data_dir:
        settings = Settings(data_dir=data_dir, metrics_port=0)
        async with running(await build(settings), settings) as server:
            async with channel(f"127.0.0.1:{server.port}", settings) as ch:
                stub = reward_pb2_grpc.RewardStub(ch)
                timings: dict[str, list[float]] = {"math": [], "exact": [], "cop": []}
                rng = random.Random(0)
                outcomes = [reward_pb2.Outcome(cost_usd=rng.uniform(0, 0.01), correct=rng.random() < 0.6) for _ in range(attempts)]
                for repeat in range(repeats):
                    group = apo_group(repeat)
                    for name, verifier in (("math", reward_pb2.VERIFIER_MATH), ("exact", reward_pb2.VERIFIER_EXACT)):
                        request = reward_pb2.ScoreRequest(reference_answer="391", verifier=verifier, kind=reward_pb2.REWARD_KIND_APO, rollouts=group)
                        started = time.perf_counter()
                        await stub.Score(request)
                        timings[name].append(time.perf_counter() - started)
                    started = time.perf_counter()
                    await stub.CostOfPass(reward_pb2.CostOfPassRequest(outcomes=outcomes, bootstrap_samples=2000, seed=repeat + 1))
                    timings["cop"].append(time.perf_counter() - started)
    print(summary("Score, APO group of 12, math-verify", timings["math"]))
    print(summary("Score, APO group of 12, exact match", timings["exact"]))
    print(summary(f"CostOfPass, {attempts} attempts x 2000", timings["cop"]))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--attempts", type=int, default=10_000)
    args = parser.parse_args()
    asyncio.run(main(args.repeats, args.attempts))
