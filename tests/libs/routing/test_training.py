"""Training on a learnable synthetic world stored in a real store: held-out routing accuracy,
the registered checkpoint and its lineage, and the artefact round trip."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from gearshift.api.common.v1.common_pb2 import CheckpointStatus
from gearshift.api.store.v1 import store_pb2
from gearshift.jobs.router.config import RouterConfig
from gearshift.jobs.router.trainer import NotEnoughData, train_async
from gearshift.routing.features import FeatureSpec, extractor_for
from gearshift.routing.model import METADATA_FILE, RouterModel
from gearshift.settings import Settings

from tests.libs.routing.synthetic import AGENTIC, INSTANT, REASONING, SUITE, put, running_store, world

RUN = "eval-synthetic"


@pytest.fixture(scope="module")
async def trained(tmp_path_factory):
    """A store holding 90 training and 30 dev items, and a static-embedding router trained on it."""
    settings = Settings(data_dir=tmp_path_factory.mktemp("routing"), metrics_port=0)
    async with running_store(settings) as (configured, stub):
        await put(stub, world(RUN, {"train": 90, "dev": 30}))
        config = RouterConfig(task_source=SUITE, run_ids=[RUN], embedding="static", accuracy_floor=0.5, bootstrap_samples=200,
                              store_addr=configured.store_addr, output={"dir": settings.data_dir / "router-1"})
        result = await train_async(config)
        yield result, stub, configured


async def test_routing_is_learned_and_beats_every_forced_mode(trained):
    result, _, _ = trained
    evaluation = result["evaluation"]
    assert evaluation.items == 30 and evaluation.skipped_items == 0 and evaluation.items_with_oracle == 30
    assert evaluation.routing_accuracy >= 0.9
    assert set(evaluation.mode_share) == {INSTANT, REASONING, AGENTIC}
    assert all(share > 0.2 for share in evaluation.mode_share.values())  # a third of each family
    learned = evaluation.policies["learned"]
    agentic = evaluation.policies["forced_agentic"]
    assert learned.accuracy >= agentic.accuracy - 0.05  # agentic answers everything here
    assert evaluation.change_vs("forced_agentic") < -0.3  # and costs far more per correct answer
    assert evaluation.change_vs("forced_reasoning") < 0  # reasoning fails the big numbers
    assert "native" in evaluation.policies  # the always-agentic model-native attempts
    metrics = evaluation.metrics()
    assert metrics["routing_accuracy"] == evaluation.routing_accuracy and all(np.isfinite(list(metrics.values())))


async def test_the_checkpoint_is_registered_with_lineage(trained):
    result, stub, _ = trained
    stored = await stub.GetCheckpoint(store_pb2.GetCheckpointRequest(id=result["checkpoint_id"], include_lineage=True))
    assert (stored.kind, stored.job, stored.status) == ("router", "router", CheckpointStatus.CHECKPOINT_STATUS_CANDIDATE)
    assert stored.uri == result["uri"] and stored.id.startswith("router-")
    assert len(stored.trajectory_ids) == 90 * 3  # every forced training attempt, no dev item
    assert json.loads(stored.dataset_snapshot)["run_ids"] == [RUN]
    assert json.loads(stored.config_json)["embedding"] == "static"
    assert stored.code_version and stored.eval_metrics["routing_accuracy"] == pytest.approx(result["evaluation"].routing_accuracy)
    assert stored.eval_metrics["train/items"] == 90
    # the pass value it decides by: every family has a cheap sure mode here, so about the mean
    # cost of those modes (instant 1e-5, reasoning 4e-5, agentic 1e-4)
    assert stored.eval_metrics["train/pass_value_usd"] == pytest.approx(RouterModel.load(Path(stored.uri)).pass_value_usd)
    assert 1e-5 < stored.eval_metrics["train/pass_value_usd"] < 1e-4


async def test_artefact_round_trip(trained, tmp_path):
    result, _, _ = trained
    artefact = Path(result["uri"])
    loaded = RouterModel.load(artefact)
    assert loaded.version == result["checkpoint_id"] and loaded.spec == FeatureSpec(embedding="static")
    assert loaded.modes == (INSTANT, REASONING, AGENTIC)
    assert json.loads((artefact / "result.json").read_text())["checkpoint_id"] == loaded.version
    meta = json.loads((artefact / METADATA_FILE).read_text())
    assert meta["training"]["run_ids"] == [RUN] and meta["training"]["items"] == 90 and meta["metrics"]

    extractor = extractor_for(loaded.spec)
    rows = extractor.transform_many(["What is 73918273 * 1928374655?", "What is the capital of Peru?"])
    big, fact = loaded.predict(rows)
    assert big[2] > 0.5 > big[0] and fact[0] > 0.5  # agentic for big numbers, instant for facts

    with pytest.raises(FileExistsError):
        loaded.save(artefact)  # a version is never overwritten
    meta["format_version"] = 99
    copy = tmp_path / "copy"
    loaded.save(copy)
    (copy / METADATA_FILE).write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="format"):
        RouterModel.load(copy)


async def test_too_little_data_is_refused(settings):
    async with running_store(settings) as (configured, stub):
        await put(stub, world(RUN, {"train": 2}))
        with pytest.raises(NotEnoughData, match="2 training items"):
            await train_async(RouterConfig(embedding="none", store_addr=configured.store_addr,
                                           output={"dir": settings.data_dir / "r", "register_checkpoint": False}))
