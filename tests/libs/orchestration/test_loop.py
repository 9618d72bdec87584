"""`gearshift loop` end to end at its quick size, on the real stack (the six services and the
built-in policy server in this process, the SQLite store), the real SmolLM2 and the real
trainers as subprocesses: every stage runs, the candidate is registered with its lineage, the
gate decides as it must, and the summary carries the before/after figures. The SFT learning
rate is set to wreck the model, so the gate's answer is known: a candidate that answers nothing
correctly is refused, and serving stays on the base. The round also replays a second suite's
train split (its correct trajectories train with the seed's) and guards that suite's families,
and its trainers adapt LoRA adapters, not the full weights."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from gearshift import weights
from gearshift.api.common.v1.common_pb2 import CheckpointStatus
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.clients import channel
from gearshift.embedded import embedded
from gearshift.evaluation.report import fetch_run
from gearshift.orchestration.loop import QUICK_CONFIG, cost_guard_verdict, guard_verdict, run_round
from gearshift.settings import Settings
from gearshift.training.data import snapshot_id

from tests import workers

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
# The replayed and guarded suite: two families (a JSONL row's domain), train and test items of each.
KEPT = [
    ("capital-peru", "What is the capital of Peru?", "Lima", "train", "capitals"),
    ("sum-small", "What is 2 + 3?", "5", "train", "sums"),
    ("capital-egypt", "What is the capital of Egypt?", "Cairo", "test", "capitals"),
    ("sum-tens", "What is 10 + 20?", "30", "test", "sums"),
]


async def test_quick_round_runs_every_stage_and_registers_the_candidate_with_lineage(tmp_path):
    weights.cache_smollm2(Settings().models_dir)  # once per machine, whatever the data directory
    suite = tmp_path / "capitals.jsonl"
    suite.write_text("".join(json.dumps({"id": i, "question": q, "answer": a, "split": s, "difficulty": "1"}) + "\n" for i, q, a, s in ITEMS))
    settings = Settings(data_dir=tmp_path, metrics_port=0, log_level="WARNING")
    kept = tmp_path / "kept.jsonl"
    kept.write_text("".join(json.dumps({"id": i, "question": q, "answer": a, "split": s, "domain": d}) + "\n" for i, q, a, s, d in KEPT))
    config = QUICK_CONFIG.model_copy(update={"suite": str(suite), "sft_learning_rate": 0.05, "replay_suite": str(kept),
                                             "replay_items": 2, "guard_suite": str(kept), "guard_items": 2,
                                             "lora_rank": 4, "threads": workers.threads_per_worker()})

    summary = await run_round(settings, config, out=tmp_path / "summary.json")

    stages = summary["stages"]
    assert list(stages) == ["seed", "score", "sft", "apo", "evaluate", "guard", "gate", "publish"]
    assert stages["seed"]["episodes"] == 3 and stages["seed"]["replay_episodes"] == 2
    assert stages["score"]["scored"] >= 1 and stages["sft"]["correct"] == stages["score"]["correct"] >= stages["sft"]["trajectories"] >= 1
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
    # Both trainers adapted rank-4 adapters and saved them beside the merged weights that serve.
    for checkpoint in (sft, candidate):
        model = json.loads(checkpoint.config_json)["model"]
        assert (model["lora"], model["lora_rank"], model["lora_alpha"]) == (True, 4, 8)
        assert json.loads((Path(checkpoint.uri) / "adapter" / "adapter_config.json").read_text())["r"] == 4
        assert (Path(checkpoint.uri) / "config.json").exists()
    # SFT learned from the seed and the replay, the correct and well-formed trajectories of both runs.
    async with embedded(settings, ("store",)) as platform, channel(platform.settings.store_addr, platform.settings) as ch:
        store = store_pb2_grpc.TrajectoryStoreStub(ch)
        solved = [t for run in (stages["seed"]["run_id"], stages["seed"]["replay_run_id"]) for t in await fetch_run(store, run)]
    assert {t.labels["item_id"] for t in solved} == {"capital-france", "capital-italy", "capital-japan", "capital-peru", "sum-small"}
    learned = {t.id for t in solved if t.reward.correct and t.reward.format_valid}
    assert set(sft.trajectory_ids) == learned and sft.dataset_snapshot == snapshot_id(learned)
    # The guard measured both checkpoints family by family; the wrecked candidate answers nothing.
    guard = stages["guard"]
    assert guard["base_run_id"] != guard["candidate_run_id"]
    assert set(guard["base"]) == set(guard["candidate"]) == {"capitals", "sums"}
    assert guard["candidate"] == {"capitals": 0.0, "sums": 0.0}
    assert guard["held"] == (max(guard["base"].values()) <= config.guard_max_drop)
    # ... and prices them: answering nothing, every family is infinitely dearer per pass, which
    # the guard says for each family the base answered.
    assert guard["candidate_cost_of_pass_usd"] == {"capitals": math.inf, "sums": math.inf}
    for family, share in guard["base"].items():
        assert math.isfinite(guard["base_cost_of_pass_usd"][family]) == (share > 0)
        assert any(r.startswith(f"guard: {family} cost of pass $") for r in guard["reasons"]) == (share > 0)
    assert all(reason in stages["gate"]["reasons"] for reason in guard["reasons"])
    # The gate decided on the model's own routing, on the same held-out items for both, and the
    # registry says so.
    evaluated = stages["evaluate"]
    assert evaluated["candidate"]["auto"]["accuracy"] == 0.0 and evaluated["candidate"]["auto"]["episodes"] == config.eval_items
    assert evaluated["base"]["auto"]["episodes"] == config.eval_items
    assert candidate.eval_metrics["capitals/test/auto/accuracy"] == 0.0
    assert not summary["promoted"] and any("auto: the candidate answers nothing correctly" in r for r in stages["gate"]["reasons"])
    assert candidate.status == CheckpointStatus.CHECKPOINT_STATUS_REJECTED
    assert stages["publish"]["serving"] != candidate.uri


def test_the_guard_refuses_a_family_that_fell_by_more_than_the_allowed_drop():
    # One item in 30 is 3.3 points: more than 3. One in 60 is 1.7: allowed; two are not.
    held, reasons = guard_verdict({"facts": 10 / 30, "sums": 0.5}, {"facts": 9 / 30, "sums": 0.9}, 0.03)
    assert not held and reasons == ["guard: facts fell 33.3% -> 30.0%"]
    assert guard_verdict({"facts": 20 / 60}, {"facts": 19 / 60}, 0.03)[0]
    assert not guard_verdict({"facts": 20 / 60}, {"facts": 18 / 60}, 0.03)[0]
    # A family the candidate's run lacks counts as answered by none.
    assert guard_verdict({"facts": 0.5, "sums": 0.2}, {"facts": 0.5}, 0.03) == (False, ["guard: sums fell 20.0% -> 0.0%"])
    assert guard_verdict({"facts": 0.5}, {"facts": 0.48}, 0.03) == (True, ["guard: no family fell by more than 3%"])


def test_the_guard_refuses_a_family_whose_cost_of_pass_rose_by_more_than_allowed():
    # facts as accurate but sent to reasoning: 1.6e-5 -> 2.4e-5 a pass is 50% dearer; sums 20% dearer is allowed
    held, reasons = cost_guard_verdict({"facts": 1.6e-5, "sums": 1e-4}, {"facts": 2.4e-5, "sums": 1.2e-4}, 0.25)
    assert not held and reasons == ["guard: facts cost of pass $0.000016 -> $0.000024"]
    assert cost_guard_verdict({"facts": 1e-4}, {"facts": 1.25e-4}, 0.25)[0]  # the bound itself is allowed
    # Answering nothing any more is infinitely dearer; a family that answered nothing before has nothing to keep.
    assert not cost_guard_verdict({"facts": 1e-4}, {"facts": math.inf}, 0.25)[0]
    assert not cost_guard_verdict({"facts": 1e-4}, {}, 0.25)[0]
    assert cost_guard_verdict({"gsm": math.inf}, {"gsm": math.inf}, 0.25) == (True, ["guard: no family's cost of pass rose by more than 25%"])
