"""`gearshift loop` with sft_steps 0: one round of APO alone, starting from the base, on the real
stack in this process with a tiny random model (the lineage, not the model's quality, is what is
checked here; tests/libs/orchestration/test_loop.py runs the full round with SmolLM2)."""

from __future__ import annotations

import json

import pytest
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.clients import channel
from gearshift.embedded import embedded
from gearshift.orchestration.loop import QUICK_CONFIG, run_round
from gearshift.settings import Settings
from gearshift.training.tiny import tiny_checkpoint

from tests import workers

pytestmark = [pytest.mark.slow("a round's stages on the real stack, APO on a tiny model"), pytest.mark.timeout(900)]

ITEMS = [("a", "What is the capital of France?", "Paris", "train"), ("b", "What is the capital of Spain?", "Madrid", "test"),
         ("c", "What is the capital of Italy?", "Rome", "test")]


async def test_apo_only_round_starts_from_the_base(tmp_path):
    suite = tmp_path / "capitals.jsonl"
    suite.write_text("".join(json.dumps({"id": i, "question": q, "answer": a, "split": s}) + "\n" for i, q, a, s in ITEMS))
    settings = Settings(data_dir=tmp_path, metrics_port=0, log_level="WARNING")
    config = QUICK_CONFIG.model_copy(update={"suite": str(suite), "base_model": str(tiny_checkpoint(tmp_path / "tiny")),
                                             "seed_items": 1, "seed_samples": 2, "seed_temperature": 1.0,
                                             "sft_steps": 0, "max_tokens_per_turn": 8, "threads": workers.threads_per_worker()})

    summary = await run_round(settings, config, out=tmp_path / "summary.json")

    stages = summary["stages"]
    assert list(stages) == ["seed", "score", "sft", "apo", "evaluate", "gate", "publish"]
    assert stages["seed"]["episodes"] == 2  # one item, one mode, two samples (rejection sampling)
    assert "checkpoint" not in stages["sft"] and stages["apo"]["parent"] == summary["base"]
    assert stages["apo"]["steps"] == config.apo_steps
    async with embedded(settings, ("store",)) as platform, channel(platform.settings.store_addr, platform.settings) as ch:
        candidate = await store_pb2_grpc.TrajectoryStoreStub(ch).GetCheckpoint(store_pb2.GetCheckpointRequest(id=summary["candidate"]))
    assert candidate.job == "apo" and candidate.parent_id == summary["base"]
    assert set(summary["before_after"]) >= {"auto"}
