"""What exact-token training changes on real rollouts: the default policy, served by the built-in
server, runs APO-style rollouts (temperature 1 on every model call, the model routing itself)
on train items of the headline suite; for each kept sample (SampledSpan) it reports whether
re-tokenising its text gives back the ids that were sampled, and how many learned tokens no
sample covers (masked with rollout.exact_tokens).

    .venv/bin/python benchmarks/sampled_tokens.py [--episodes 30] [--temperature 1.0]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from gearshift import weights
from gearshift.api.common.v1.common_pb2 import Sampling
from gearshift.api.executor.v1 import executor_pb2, executor_pb2_grpc
from gearshift.clients import channel
from gearshift.embedded import embedded
from gearshift.evaluation.suites import get_suite
from gearshift.settings import Settings
from gearshift.training import tokenization
from transformers import AutoTokenizer

BUDGET = executor_pb2.Budget(max_steps=3, max_tokens=1500)  # sampled at temperature 1, episodes can ramble


async def rollouts(episodes: int, temperature: float) -> list:
    settings = Settings(log_level="WARNING")
    items = get_suite("headline").items("train", episodes)
    async with embedded(settings, policy_model=weights.DEFAULT) as platform, channel(platform.settings.executor_addr, platform.settings) as ch:
        stub = executor_pb2_grpc.ExecutorStub(ch)
        sampling = Sampling(temperature=temperature, top_p=1.0)

        async def one(item):
            request = executor_pb2.SolveRequest(query=item.question, reference_answer=item.answer, sampling=sampling, budget=BUDGET)
            trajectory = [event async for event in stub.Solve(request)][-1].final.trajectory
            print(f"  {len(trajectory.turns)} turn(s), {trajectory.usage.output_tokens} tokens out", flush=True)
            return trajectory

        return list(await asyncio.gather(*(one(item) for item in items)))


def report(trajectories: list, tokenizer) -> None:
    spans = differs = sampled_tokens = learned_exact = learned_loose = unsampled = 0
    for trajectory in trajectories:
        segments = tokenization.assistant_segments(trajectory)
        for segment in segments:
            if segment.sampled is None or not segment.target:
                continue
            ids, chars = tokenization.sampled_prefix(tokenizer, segment.sampled, segment.text)
            spans += 1
            sampled_tokens += len(ids)
            differs += tokenizer(segment.text[:chars], add_special_tokens=False)["input_ids"] != ids
        exact = tokenization.encode(tokenizer, trajectory.query, segments, False, exact=True)
        loose = tokenization.encode(tokenizer, trajectory.query, segments, False)
        learned_exact += exact.target_count
        learned_loose += loose.target_count
        unsampled += exact.unsampled
    print(f"episodes {len(trajectories)}, learned samples (spans) {spans}, sampled tokens {sampled_tokens}")
    print(f"spans whose re-tokenised text differs from the sampled ids: {differs} ({differs / max(spans, 1):.1%})")
    print(f"learned tokens: exact {learned_exact}, re-tokenised {learned_loose}; "
          f"learned text no sample covers: {unsampled} tokens ({unsampled / max(learned_loose, 1):.1%} of re-tokenised targets)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=30)
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args()
    started = time.perf_counter()
    trajectories = asyncio.run(rollouts(args.episodes, args.temperature))
    report(trajectories, AutoTokenizer.from_pretrained(weights.cache_smollm2(Settings().models_dir)))
    print(f"wall {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
