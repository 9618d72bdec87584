"""The router job: stored forced-mode outcomes -> per-mode success classifiers and cost
regressions (the expected cost of one attempt for this query) -> a versioned
router artefact, evaluated offline on held-out items and registered as a checkpoint (kind
router). docs/protocol.md (cost of pass) says what it optimises.

A^2FM (arXiv 2510.12838) learns routing inside the policy's weights; here a small classifier
learns it from the platform's own evaluation runs, so it retrains in seconds. The router picks
the modes that keep the cost per correct answer over all queries lowest (routing.decision).

Example (a store holding forced-mode evaluation runs on the train split):

    gearshift train router --config router.yaml
    # router.yaml: {store_addr: 127.0.0.1:50056, task_source: facts, output: {dir: /tmp/router-1}}
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import json
import logging

import numpy as np
from gearshift import code_version
from gearshift.clients import channel
from gearshift.jobs.router.config import RouterConfig
from gearshift.protocol.modes import NAME_OF
from gearshift.routing.dataset import DatasetQuery, QueryOutcomes, RoutingDataset, load_dataset
from gearshift.routing.evaluate import RoutingEvaluation, evaluate_router
from gearshift.routing.features import FeatureSpec, extractor_for
from gearshift.routing.model import RouterModel, train_router_model
from gearshift.routing.registry import ROUTER_KIND
from gearshift.settings import Settings
from gearshift.training.results import register, write_result

log = logging.getLogger("gearshift.jobs.router")

SNAPSHOT_CHARS = 4_000  # the registry's dataset_snapshot column holds a few KB


class NotEnoughData(ValueError):
    """The store holds too few usable forced-mode outcomes to train on."""


def key_hash(item: QueryOutcomes) -> int:
    """A stable 32-bit hash of the item's key: splits drawn from it never move."""
    return int(hashlib.sha256(item.key.encode()).hexdigest()[:8], 16)


def holdout(items: list[QueryOutcomes], fraction: float) -> tuple[list[QueryOutcomes], list[QueryOutcomes]]:
    """(kept, held out): an item is held out by a hash of its key, so the split is stable."""
    held = [i for i in items if key_hash(i) / 0xFFFFFFFF < fraction]
    return [i for i in items if key_hash(i) / 0xFFFFFFFF >= fraction], held


def per_mode_targets(items: list[QueryOutcomes]) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """mode -> (item rows, success rates, attempt counts) over the items that tried the mode."""
    out = {}
    for mode in sorted({m for item in items for m in item.forced}):
        rows = [i for i, item in enumerate(items) if mode in item.forced]
        out[mode] = (
            np.asarray(rows),
            np.asarray([items[i].success_rate(mode) for i in rows]),
            np.asarray([float(len(items[i].forced[mode])) for i in rows]),
        )
    return out


def per_mode_costs(items: list[QueryOutcomes]) -> dict[int, np.ndarray]:
    """mode -> the mean attempt cost of each item that tried it, in per_mode_targets' row order:
    what the cost regressions learn (a long word problem costs more than a short fact)."""
    return {
        mode: np.asarray([items[i].mean_cost(mode) for i in rows])
        for mode, (rows, _, _) in per_mode_targets(items).items()
    }


def expected_costs(items: list[QueryOutcomes]) -> dict[int, float]:
    """Mean cost of one forced attempt per mode over the training items."""
    totals: dict[int, list[float]] = {}
    for item in items:
        for mode, attempts in item.forced.items():
            totals.setdefault(mode, []).extend(a.cost_usd for a in attempts)
    return {mode: float(np.mean(costs)) for mode, costs in totals.items()}


def snapshot(dataset: RoutingDataset, lineage: list[str]) -> str:
    """What the registry records as the dataset: run ids and a digest of the trajectory ids."""
    digest = hashlib.sha256("\n".join(sorted(lineage)).encode()).hexdigest()
    data = {"run_ids": dataset.run_ids, "trajectories": len(lineage), "sha256": digest}
    text = json.dumps(data, sort_keys=True)
    if len(text) > SNAPSHOT_CHARS:
        text = json.dumps({**data, "run_ids": f"{len(dataset.run_ids)} runs (see the artefact's metadata.json)"}, sort_keys=True)
    return text


def split(config: RouterConfig, dataset: RoutingDataset) -> tuple[list[QueryOutcomes], list[QueryOutcomes]]:
    """(training items, held-out items); items without forced attempts teach nothing."""
    usable = [item for item in dataset.items if item.forced]
    train_items = [i for i in usable if i.split in config.train_splits]
    held = [i for i in usable if config.eval_split and i.split == config.eval_split]
    if not held:
        train_items, held = holdout(train_items, config.holdout_fraction)
    if len(train_items) < config.min_items:
        raise NotEnoughData(
            f"{len(train_items)} training items with scored forced-mode attempts (at least {config.min_items} needed); "
            f"run `gearshift eval` with forced modes on the train split first"
        )
    return train_items, held


def fit(config: RouterConfig, version: str, dataset: RoutingDataset, train_items: list[QueryOutcomes],
        held: list[QueryOutcomes]) -> tuple[RouterModel, RoutingEvaluation | None]:
    """The classifiers and, when held-out items cover every mode, their offline evaluation."""
    spec = FeatureSpec(embedding=config.embedding, max_tokens=config.max_tokens)
    extractor = extractor_for(spec)
    features = extractor.transform_many([item.query for item in train_items])
    metadata = {
        "created_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "code_version": code_version(),
        "config": json.loads(config.model_dump_json()),
        "training": {
            "run_ids": dataset.run_ids,
            "task_source": config.task_source,
            "items": len(train_items),
            "held_out_items": len(held),
            "trajectories": len(lineage_of(train_items)),
            "unscored_skipped": dataset.unscored,
            "attempts_per_mode": {NAME_OF[m]: int(c.sum()) for m, (_, _, c) in per_mode_targets(train_items).items()},
        },
    }
    model = train_router_model(
        version, spec, features, per_mode_targets(train_items), expected_costs(train_items), config.l2, config.max_iterations, metadata,
        per_mode_costs(train_items), config.cost_l2, config.accuracy_floor,
    )
    evaluation = None
    covered = [i for i in held if all(m in i.forced for m in model.modes)]
    if covered:
        evaluation = evaluate_router(
            model, extractor.transform_many([i.query for i in covered]), covered, config.accuracy_floor, config.bootstrap_samples,
        )
        model.metadata["metrics"] = evaluation.metrics()
        log.info("offline evaluation of %s:\n%s", version, evaluation.table())
    else:
        log.warning("no held-out item has attempts in every mode: %s is not evaluated", version)
    return model, evaluation


def lineage_of(items: list[QueryOutcomes]) -> list[str]:
    return [a.trajectory_id for item in items for attempts in item.forced.values() for a in attempts]


def default_version(lineage: list[str]) -> str:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    return f"router-{stamp}-{hashlib.sha256(chr(10).join(sorted(lineage)).encode()).hexdigest()[:6]}"


async def train_async(config: RouterConfig) -> dict:
    """Trains, evaluates, saves (output.dir) and registers one router version; returns the result."""
    splits = (*config.train_splits, config.eval_split) if config.eval_split else tuple(config.train_splits)
    async with channel(config.store_addr, Settings()) as ch:
        dataset = await load_dataset(ch, DatasetQuery(config.task_source, tuple(config.run_ids), splits, config.model_version))
    train_items, held = split(config, dataset)
    lineage = lineage_of(train_items)
    version = config.output.checkpoint_id or default_version(lineage)
    model, evaluation = await asyncio.to_thread(fit, config, version, dataset, train_items, held)
    model.metadata["lineage"] = lineage
    path = await asyncio.to_thread(model.save, config.output.dir)
    log.info("router %s written to %s", version, path)
    result = write_result(path, {
        "checkpoint_id": version,
        "kind": ROUTER_KIND,
        "job": "router",
        "uri": str(path.resolve()),
        "config": json.loads(config.model_dump_json()),
        "code_version": model.metadata["code_version"],
        "dataset_snapshot": snapshot(dataset, lineage),
        "trajectory_ids": sorted(lineage),
        "metrics": {"items": len(train_items), "held_out_items": len(held), "trajectories": len(lineage),
                    "pass_value_usd": model.pass_value_usd},
        "eval_metrics": evaluation.metrics() if evaluation else {},
    })
    if config.output.register_checkpoint:
        await register(config.store_addr, result)
    return result | {"evaluation": evaluation}


def train(config: RouterConfig, on_step=None) -> dict:
    """Synchronous entry point (the CLI and the container); the result's "evaluation" holds the
    offline evaluation (None without covered held-out items)."""
    return asyncio.run(train_async(config))
