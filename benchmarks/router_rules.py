"""The learned router's two decision rules side by side on stored outcomes, by k-fold
cross-validation over one run's items: the per-query cost of pass (artefact format 2) against
expected cost less the pass value x P(correct) (format 3, docs/protocol.md section 8). Run it on a
train run, so that no item a report quotes is looked at. Each fold's router is trained on the
other folds as `gearshift train router` trains it (its config's defaults); each held-out item's
chosen mode is scored by replaying its stored forced attempts. Reductions are paired item-level
bootstrap intervals.

    GEARSHIFT_DATA_DIR=/work/eval .venv/bin/python benchmarks/router_rules.py --suite generalisation --run-id gen-dk-train
"""

from __future__ import annotations

import argparse
import asyncio

import numpy as np
from gearshift.clients import channel
from gearshift.jobs.router.config import RouterConfig
from gearshift.jobs.router.trainer import expected_costs, key_hash, per_mode_costs, per_mode_targets
from gearshift.protocol.modes import NAME_OF
from gearshift.rewards.cost_of_pass import compute_cost_of_pass, paired_cost_of_pass_reduction
from gearshift.routing.dataset import DatasetQuery, QueryOutcomes, load_dataset
from gearshift.routing.features import FeatureSpec, extractor_for
from gearshift.routing.model import train_router_model
from gearshift.server import running
from gearshift.services.store.service import build as build_store
from gearshift.settings import Settings


async def stored_items(suite: str, run_id: str) -> list[QueryOutcomes]:
    """The run's items, read through a store service on the data dir's database."""
    settings = Settings(metrics_port=0)
    async with running(await build_store(settings), settings) as server:
        async with channel(f"127.0.0.1:{server.port}", settings) as ch:
            dataset = await load_dataset(ch, DatasetQuery(suite, (run_id,)))
    return [item for item in dataset.items if item.forced]


def fold_of(item: QueryOutcomes, folds: int) -> int:
    return key_hash(item) % folds


def cross_validated_choices(items: list[QueryOutcomes], config: RouterConfig, folds: int) -> dict[str, list[int]]:
    """Per rule, the mode chosen for each item by the router trained without its fold."""
    spec = FeatureSpec(embedding=config.embedding, max_tokens=config.max_tokens)
    features = extractor_for(spec).transform_many([item.query for item in items])
    chosen = {"per-query cost of pass": [0] * len(items), "pass value": [0] * len(items)}
    for fold in range(folds):
        held = [i for i, item in enumerate(items) if fold_of(item, folds) == fold]
        kept = [i for i, item in enumerate(items) if fold_of(item, folds) != fold]
        train = [items[i] for i in kept]
        model = train_router_model(f"fold-{fold}", spec, features[kept], per_mode_targets(train), expected_costs(train), config.l2,
                                   config.max_iterations, per_mode_cost=per_mode_costs(train), cost_l2=config.cost_l2,
                                   accuracy_floor=config.accuracy_floor)
        with_value = model.choose_many(features[held], config.accuracy_floor)
        model.pass_value_usd = None
        per_query = model.choose_many(features[held], config.accuracy_floor)
        for i, a, b in zip(held, per_query, with_value):
            chosen["per-query cost of pass"][i], chosen["pass value"][i] = a.mode, b.mode
    return chosen


def totals(items: list[QueryOutcomes], modes: list[int]) -> tuple[list[float], list[float]]:
    """Per item: the total cost and the number of correct attempts of its stored attempts in that mode."""
    return ([sum(a.cost_usd for a in item.forced[m]) for item, m in zip(items, modes)],
            [float(sum(a.correct for a in item.forced[m])) for item, m in zip(items, modes)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suite", required=True, help="the run's task source (suite name)")
    parser.add_argument("--run-id", required=True, help="a run with forced attempts in every mode (a train run)")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--bootstrap", type=int, default=2000)
    args = parser.parse_args()

    items = asyncio.run(stored_items(args.suite, args.run_id))
    modes = sorted({m for item in items for m in item.forced})
    items = [item for item in items if all(m in item.forced for m in modes)]
    if len(items) < 2 * args.folds:
        raise SystemExit(f"{args.run_id}: {len(items)} items with attempts in every mode, too few for {args.folds} folds")
    config = RouterConfig(store_addr="unused", output={"dir": "unused"})  # only its training defaults count here
    policies = {f"forced {NAME_OF[m]}": [m] * len(items) for m in modes} | cross_validated_choices(items, config, args.folds)

    print(f"{args.run_id}: {len(items)} items, {args.folds}-fold cross-validation, accuracy floor {config.accuracy_floor}\n")
    print("| policy | accuracy | cost of pass (USD) | 95% CI | " + " | ".join(f"share {NAME_OF[m]}" for m in modes) + " |")
    print("|---|---|---|---|" + "---|" * len(modes))
    for name, chosen in policies.items():
        attempts = [(str(index), a) for index, (item, m) in enumerate(zip(items, chosen)) for a in item.forced[m]]
        cop = compute_cost_of_pass([a.cost_usd for _, a in attempts], [a.correct for _, a in attempts], args.bootstrap,
                                   items=[key for key, _ in attempts])
        shares = " | ".join(f"{np.mean([c == m for c in chosen]):.0%}" for m in modes)
        print(f"| {name} | {cop.correct / cop.attempts:.1%} | {cop.cost_of_pass_usd:.6f} | {cop.ci_low_usd:.6f} - {cop.ci_high_usd:.6f} | {shares} |")

    print("\nCost-of-pass reduction of each rule (paired bootstrap):\n")
    rules, forced = ("per-query cost of pass", "pass value"), [f"forced {NAME_OF[m]}" for m in modes]
    for name, against in [(rule, f) for rule in rules for f in forced] + [("pass value", "per-query cost of pass")]:
        r = paired_cost_of_pass_reduction(*totals(items, policies[name]), *totals(items, policies[against]), samples=args.bootstrap)
        print(f"- {name} vs {against}: {r.value:+.1%} ({r.low:+.1%} to {r.high:+.1%})")


if __name__ == "__main__":
    main()
