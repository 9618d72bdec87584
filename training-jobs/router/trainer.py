"""RouterTrainer: stored forced-mode outcomes -> per-mode success classifiers -> a versioned
router artefact, evaluated offline on held-out items and registered as a checkpoint.

The idea follows A^2FM's cost of pass (arXiv 2510.12838): route each query to the mode with the
lowest expected cost per correct answer. A^2FM learns routing inside the policy's weights; here
a small classifier learns it from the platform's own evaluation runs, so it retrains in seconds.

Example (a store on GEARSHIFT_STORE_ADDR holding an evaluation run):

    config = RouterTrainingConfig(task_source="basic_arithmetic", embedding="static")
    result = asyncio.run(RouterTrainer(config, get_settings()).run())
    print(result.version, result.evaluation.table())
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import json
import logging
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gearshift.clients import channel
from gearshift.common.v1.common_pb2 import Checkpoint
from gearshift.jobs.router.config import RouterTrainingConfig
from gearshift.routing.dataset import DatasetQuery, QueryOutcomes, RoutingDataset, load_dataset
from gearshift.routing.evaluate import RoutingEvaluation, evaluate_router
from gearshift.routing.features import FeatureSpec, extractor_for
from gearshift.routing.model import MODE_KEYS, RouterModel, train_router_model
from gearshift.routing.registry import ROUTER_KIND
from gearshift.settings import Settings
from gearshift.store.v1 import store_pb2, store_pb2_grpc

log = logging.getLogger("gearshift.jobs.router")

SNAPSHOT_CHARS = 4_000  # the registry's dataset_snapshot column holds a few KB


class NotEnoughData(ValueError):
    """The store holds too few usable forced-mode outcomes to train on."""


@dataclass
class TrainingResult:
    version: str
    artefact_dir: Path
    model: RouterModel
    evaluation: RoutingEvaluation | None
    checkpoint: Checkpoint | None


def code_version() -> str:
    """The git commit of this code, or "unknown" outside a checkout."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, cwd=Path(__file__).parent, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() or "unknown"


def holdout(items: list[QueryOutcomes], fraction: float) -> tuple[list[QueryOutcomes], list[QueryOutcomes]]:
    """(kept, held out): an item is held out by a hash of its key, so the split is stable."""
    def bucket(item: QueryOutcomes) -> float:
        return int(hashlib.sha256(item.key.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF

    held = [i for i in items if bucket(i) < fraction]
    return [i for i in items if bucket(i) >= fraction], held


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


class RouterTrainer:
    """Trains, evaluates, saves and registers one router version."""

    def __init__(self, config: RouterTrainingConfig, settings: Settings):
        self.config = config
        self.settings = settings
        self.spec = FeatureSpec(embedding=config.embedding, max_tokens=config.max_tokens)

    def _query(self) -> DatasetQuery:
        splits = (*self.config.train_splits, self.config.eval_split) if self.config.eval_split else tuple(self.config.train_splits)
        return DatasetQuery(self.config.task_source, tuple(self.config.run_ids), splits, self.config.model_version)

    def split(self, dataset: RoutingDataset) -> tuple[list[QueryOutcomes], list[QueryOutcomes]]:
        """(training items, held-out items); items without forced attempts teach nothing."""
        usable = [item for item in dataset.items if item.forced]
        train = [i for i in usable if i.split in self.config.train_splits]
        held = [i for i in usable if self.config.eval_split and i.split == self.config.eval_split]
        if not held:
            train, held = holdout(train, self.config.holdout_fraction)
        if len(train) < self.config.min_items:
            raise NotEnoughData(
                f"{len(train)} training items with scored forced-mode attempts (at least {self.config.min_items} needed); "
                f"run `gearshift eval` with forced modes on the train split first"
            )
        return train, held

    async def run(self) -> TrainingResult:
        async with channel(self.settings.store_addr, self.settings) as ch:
            dataset = await load_dataset(ch, self._query())
            train, held = self.split(dataset)
            model, evaluation = await asyncio.to_thread(self._fit_and_evaluate, dataset, train, held)
            directory = self.config.artefact_dir or self.settings.learned_router.artefact_root(self.settings.data_dir)
            path = await asyncio.to_thread(model.save, directory / model.version)
            log.info("router %s written to %s", model.version, path)
            checkpoint = None
            if self.config.register_checkpoint:
                checkpoint = await self._register(store_pb2_grpc.TrajectoryStoreStub(ch), model, path, dataset)
        return TrainingResult(model.version, path, model, evaluation, checkpoint)

    def _fit_and_evaluate(
        self, dataset: RoutingDataset, train: list[QueryOutcomes], held: list[QueryOutcomes]
    ) -> tuple[RouterModel, RoutingEvaluation | None]:
        extractor = extractor_for(self.spec)
        features = extractor.transform_many([item.query for item in train])
        lineage = [a.trajectory_id for item in train for attempts in item.forced.values() for a in attempts]
        version = self.config.version or self._version(lineage)
        metadata = {
            "created_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "code_version": code_version(),
            "config": json.loads(self.config.model_dump_json()),
            "training": {
                "run_ids": dataset.run_ids,
                "task_source": self.config.task_source,
                "items": len(train),
                "held_out_items": len(held),
                "trajectories": len(lineage),
                "unscored_skipped": dataset.unscored,
                "attempts_per_mode": {MODE_KEYS[m]: int(c.sum()) for m, (_, _, c) in per_mode_targets(train).items()},
            },
        }
        model = train_router_model(
            version, self.spec, features, per_mode_targets(train), expected_costs(train),
            self.config.l2, self.config.max_iterations, metadata,
        )
        model.metadata["lineage"] = lineage
        evaluation = None
        covered = [i for i in held if all(m in i.forced for m in model.modes)]
        if covered:
            evaluation = evaluate_router(
                model, extractor.transform_many([i.query for i in covered]), covered,
                self.config.accuracy_floor, self.config.bootstrap_samples,
            )
            model.metadata["metrics"] = evaluation.metrics()
            log.info("offline evaluation of %s:\n%s", version, evaluation.table())
        else:
            log.warning("no held-out item has attempts in every mode: %s is not evaluated", version)
        return model, evaluation

    def _version(self, lineage: list[str]) -> str:
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
        digest = hashlib.sha256("\n".join(sorted(lineage)).encode()).hexdigest()[:6]
        return f"router-{stamp}-{digest}"

    async def _register(
        self, stub: store_pb2_grpc.TrajectoryStoreStub, model: RouterModel, path: Path, dataset: RoutingDataset
    ) -> Checkpoint:
        lineage = model.metadata["lineage"]
        checkpoint = Checkpoint(
            id=model.version,
            kind=ROUTER_KIND,
            uri=str(path.resolve()),
            job="router",
            config_json=self.config.model_dump_json(),
            code_version=model.metadata["code_version"],
            dataset_snapshot=snapshot(dataset, lineage),
            trajectory_ids=lineage,
            eval_metrics=model.metadata.get("metrics", {}),
        )
        return await stub.RegisterCheckpoint(store_pb2.RegisterCheckpointRequest(checkpoint=checkpoint))
