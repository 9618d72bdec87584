"""`gearshift loop` end to end at its quick size, on the real stack (the six services and the
built-in policy server in this process, the SQLite store), the real SmolLM2 and the real
trainers as subprocesses: every stage runs, the candidate is registered with its lineage, the
gate decides as it must, and the summary carries the before/after figures. The SFT learning
rate is set to wreck the model, so the gate's answer is known: a candidate that answers nothing
correctly is refused, and serving stays on the base."""

from __future__ import annotations

import json

import pytest
from gearshift import weights
from gearshift.api.common.v1.common_pb2 import CheckpointStatus
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.clients import channel
from gearshift.embedded import embedded
from gearshift.orchestration.loop import QUICK_CONFIG, run_round
from gearshift.settings import Settings

# About 90 s on an idle 2-core machine; the limit leaves room for a shared, loaded one.
pytestmark = [pytest.mark.slow, pytest.mark.model, pytest.mark.timeout(900)]

# Questions SmolLM2 answers in instant mode often enough that the seed has a correct one.
ITEMS = [
    ("capital-france", "What is the capital of France?", "Paris", "train"),
    ("capital-italy", "What is the capital of Italy?", "Rome", "train"),
    ("capital-japan", "What is the capital of Japan?", "Tokyo", "train"),
    ("capital-germany", "What is the capital of Germany?", "Berlin", "test"),
    ("capital-spain", "What is the capital of Spain?", "Madrid", "test"),
]


async def test_quick_round_runs_every_stage_and_registers_the_candidate_with_lineage(tmp_path):
    weights.cache_smollm2(Settings().models_dir)  # once per machine, whatever the data directory
    suite = tmp_path / "capitals.jsonl"
    suite.write_text("".join(json.dumps({"id": i, "question": q, "answer": a, "split": s, "difficulty": "1"}) + "\n" for i, q, a, s in ITEMS))
    settings = Settings(data_dir=tmp_path, metrics_port=0, log_level="WARNING")
    config = QUICK_CONFIG.model_copy(update={"suite": str(suite), "sft_learning_rate": 0.05})

    summary = await run_round(settings, config, out=tmp_path / "summary.json")

    stages = summary["stages"]
    assert list(stages) == ["seed", "score", "sft", "apo", "evaluate", "gate", "publish"]
    assert stages["seed"]["episodes"] == 3 and stages["score"]["scored"] >= 1 and stages["sft"]["trajectories"] >= 1
    assert stages["sft"]["steps"] == config.sft_steps and stages["apo"]["steps"] == config.apo_steps
    assert stages["apo"]["rollouts"] == 3 * config.apo_rho + config.apo_gamma
    figures = summary["before_after"]["instant"]
    assert set(figures) >= {"accuracy", "apo_reward", "cost_of_pass_usd"}
    assert all(0 <= figures[name][side] <= 1 for name in ("accuracy", "apo_reward") for side in ("before", "after"))
    assert json.loads((tmp_path / "summary.json").read_text())["candidate"] == summary["candidate"]

    async with embedded(settings, ("store",)) as platform, channel(platform.settings.store_addr, platform.settings) as ch:
        store = store_pb2_grpc.TrajectoryStoreStub(ch)
        candidate = await store.GetCheckpoint(store_pb2.GetCheckpointRequest(id=summary["candidate"], include_lineage=True))
        sft = await store.GetCheckpoint(store_pb2.GetCheckpointRequest(id=candidate.parent_id, include_lineage=True))
    assert candidate.job == "apo" and sft.job == "sft" and sft.id == stages["sft"]["checkpoint"]
    assert sft.parent_id == summary["base"] and sft.dataset_snapshot == stages["sft"]["snapshot"]
    assert len(sft.trajectory_ids) == stages["sft"]["trajectories"] and candidate.trajectory_ids and candidate.dataset_snapshot
    # The gate decided on the model's own routing, on the same held-out items for both, and the
    # registry says so.
    evaluated = stages["evaluate"]
    assert evaluated["candidate"]["auto"]["accuracy"] == 0.0 and evaluated["candidate"]["auto"]["episodes"] == config.eval_items
    assert evaluated["base"]["auto"]["episodes"] == config.eval_items
    assert candidate.eval_metrics["capitals/test/auto/accuracy"] == 0.0
    assert not summary["promoted"] and any("auto: the candidate answers nothing correctly" in r for r in stages["gate"]["reasons"])
    assert candidate.status == CheckpointStatus.CHECKPOINT_STATUS_REJECTED
    assert stages["publish"]["serving"] != candidate.uri
