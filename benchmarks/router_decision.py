"""Learned-router decision latency: features + classifier + decision, as the router service runs
them (PublishedRouter.decide), per embedding kind, next to a bare function-call floor measured
in the same run. Also the embedding alone, since it is the expected cost.

    .venv/bin/python benchmarks/router_decision.py [--queries 2000] [--minilm-queries 300] [--threads 1]

Goal (issue 5): p99 under 2 ms on this CPU.
"""

from __future__ import annotations

import argparse
import random
import time

import numpy as np
from gearshift.routing.features import FeatureSpec, extractor_for
from gearshift.routing.model import train_router_model
from gearshift.services.router.learned import LoadedRouter, PublishedRouter
from gearshift.settings import LearnedRouterSettings

MODES = (1, 2, 3)
COSTS = {1: 0.00001, 2: 0.00004, 3: 0.0001}


def queries(n: int, seed: int) -> list[str]:
    """Distinct queries of the three shapes the router separates (so no cache could help)."""
    rng = random.Random(seed)
    shapes = [
        lambda: f"What is the capital of country number {rng.randint(1, 10**6)}?",
        lambda: f"Tom has {rng.randint(2, 99)} boxes of {rng.randint(2, 99)} apples and eats {rng.randint(1, 9)}. How many are left?",
        lambda: f"What is {rng.randint(10**7, 10**12)} * {rng.randint(10**7, 10**12)}?",
    ]
    return [shapes[i % 3]() for i in range(n)]


def fitted_router(spec: FeatureSpec, threads: int) -> PublishedRouter:
    """A router trained on labels that depend on the query shape (its accuracy is not measured here)."""
    extractor = extractor_for(spec, threads)
    train = queries(90, seed=1)
    features = extractor.transform_many(train)
    shape = np.arange(len(train)) % 3
    per_mode = {m: (np.arange(len(train)), (shape <= m - 1).astype(float), np.ones(len(train))) for m in MODES}
    model = train_router_model(f"bench-{spec.embedding}", spec, features, per_mode, COSTS, l2=1.0, max_iterations=30)
    router = PublishedRouter(LearnedRouterSettings(accuracy_floor=0.5))
    router.swap(LoadedRouter(model.version, model, extractor))
    return router


def percentiles(samples_s: list[float]) -> tuple[float, float]:
    ms = np.asarray(samples_s) * 1e3
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def timed(fn, inputs: list[str], warmup: int = 20) -> list[float]:
    for text in inputs[:warmup]:
        fn(text)
    out = []
    clock = time.perf_counter
    for text in inputs:
        start = clock()
        fn(text)
        out.append(clock() - start)
    return out


def noop(_: str) -> None:
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--minilm-queries", type=int, default=300, help="fewer: each takes milliseconds")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for the MiniLM embedding")
    args = parser.parse_args()

    rows = [("bare function call (floor)", percentiles(timed(noop, queries(args.queries, 7))))]
    for kind, n in (("none", args.queries), ("static", args.queries), ("minilm", args.minilm_queries)):
        spec = FeatureSpec(embedding=kind)
        started = time.perf_counter()
        router = fitted_router(spec, args.threads)
        load_s = time.perf_counter() - started
        inputs = queries(n, 11)
        rows.append((f"decide, embedding={kind} (n={n}, load+fit {load_s:.1f}s)", percentiles(timed(router.decide, inputs))))
        if kind != "none":
            embedder = extractor_for(spec, args.threads).embedder
            rows.append((f"  of which the {kind} embedding alone", percentiles(timed(lambda q: embedder.embed([q]), inputs))))

    width = max(len(name) for name, _ in rows)
    print(f"{'':<{width}}  {'p50 ms':>8}  {'p99 ms':>8}")
    for name, (p50, p99) in rows:
        print(f"{name:<{width}}  {p50:>8.4f}  {p99:>8.4f}")
    print("goal: p99 < 2 ms")


if __name__ == "__main__":
    main()
