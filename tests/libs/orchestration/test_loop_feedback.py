"""`gearshift loop --from-feedback`, the step that picks the round's data: on a Postgres store
holding gateway traffic beside every other kind, the feedback stage freezes exactly the served
trajectories clients judged correct, the SFT and APO runs the round would start read exactly
those (APO: their queries in their conversations, up to apo_prompts, the approved answers as
references), a new verdict makes a new round, and no verdict at all is a clear refusal."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from gearshift.api.common.v1.common_pb2 import Checkpoint
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.clients import channel
from gearshift.embedded import embedded
from gearshift.errors import FailedPrecondition
from gearshift.jobs.apo import trainer as apo
from gearshift.jobs.apo.config import APOConfig
from gearshift.jobs.sft.config import SFTConfig
from gearshift.orchestration import loop, task_bodies
from gearshift.settings import Settings
from gearshift.testing.postgres import scratch_database
from gearshift.training.data import load_trajectories

from tests import workers
from tests.libs.training.served import CONVERSATION, JUDGED_CORRECT, LIKED, ids, served, store_traffic, verdict

BASE = Checkpoint(id="base-1", kind="policy", uri="/models/base")


@pytest.fixture
async def store(tmp_path):
    """The store alone, on a Postgres database of its own."""
    with scratch_database("gearshift_loop_feedback") as url:
        settings = Settings(data_dir=tmp_path, metrics_port=0, log_level="WARNING", database_url=url)
        async with embedded(settings, ("store",)) as platform, channel(platform.settings.store_addr, platform.settings) as ch:
            yield platform.settings, store_pb2_grpc.TrajectoryStoreStub(ch)


def run_config(stack: Settings, job: str, body: dict, data: dict):
    """The --config of the run the round would start for a job."""
    spec = task_bodies.run_spec(stack, job, body, f"round:{job}", data, BASE)
    return (SFTConfig if job == "sft" else APOConfig).model_validate(spec.config)


async def test_the_round_learns_from_exactly_the_approved_served_trajectories(store):
    stack, stub = store
    rows = await store_traffic(stub)
    config = loop.QUICK_CONFIG.model_copy(update={"from_feedback": True, "apo_prompts": 2})
    report = loop.Reporter(None)

    sft_data, apo_data = await loop.feedback_stage(stack, config, report)

    figures = report.stages["feedback"]
    assert (figures["correct"], figures["judged"]) == (3, 4)  # the evaluation run's verdict is not training data
    frozen = json.loads(Path(stack.data_dir / "snapshots" / f"{figures['snapshot']}.json").read_text())
    assert frozen["trajectory_ids"] == ids(rows, *JUDGED_CORRECT)

    sft = run_config(stack, "sft", loop.sft_config(config), sft_data)
    read = await asyncio.to_thread(load_trajectories, stack.store_addr, sft.data)
    assert sorted(t.id for t in read) == ids(rows, *JUDGED_CORRECT)

    apo_run = run_config(stack, "apo", loop.apo_config(config, []), apo_data)
    prompts, lineage = await asyncio.to_thread(apo.gather_prompts, apo_run)
    # Export is oldest first: the first two approved ones, as put.
    assert lineage == [rows["liked, in a conversation"].id, rows["graded right"].id]
    assert [(p.query, p.reference_answer) for p in prompts] == [("Capital of France?", "Paris"), ("What is 17*23?", "391")]
    assert prompts[0].conversation.to_proto() == CONVERSATION and prompts[1].conversation is None

    named = loop.round_name(config, BASE, figures["snapshot"])
    assert named == loop.round_name(config, BASE, figures["snapshot"]) != loop.round_name(config.model_copy(update={"from_feedback": False}), BASE)
    later = served("Capital of Kenya?", "Nairobi")
    await stub.Put(store_pb2.PutRequest(trajectories=[later]))
    await stub.SetReward(store_pb2.SetRewardRequest(id=later.id, reward=verdict(later, LIKED)))
    again = loop.Reporter(None)
    await loop.feedback_stage(stack, config, again)
    assert again.stages["feedback"]["correct"] == 4
    assert loop.round_name(config, BASE, again.stages["feedback"]["snapshot"]) != named  # a new round, not a resumed one


async def test_a_round_from_feedback_without_any_is_refused_clearly(store):
    stack, stub = store
    put = served("Capital of Spain?", "Madrid")
    await stub.Put(store_pb2.PutRequest(trajectories=[put]))  # served, but nobody said anything about it
    with pytest.raises(FailedPrecondition, match=r"\(0 with a verdict\).*POST /v1/feedback"):
        await loop.feedback_stage(stack, loop.QUICK_CONFIG.model_copy(update={"from_feedback": True}), loop.Reporter(None))


def test_the_command_line_flag_sets_the_round_from_feedback(tmp_path, monkeypatch):
    from click.testing import CliRunner
    from gearshift.cli import main

    seen = {}

    async def fake_round(settings, config, console=None, out=None):  # the round itself is tested above and in test_loop.py
        seen["config"] = config
        return {}

    monkeypatch.setattr(loop, "run_round", fake_round)
    overrides = tmp_path / "loop.json"
    overrides.write_text(json.dumps({"apo_prompts": 5}))
    result = CliRunner().invoke(main, ["loop", "--quick", "--config", str(overrides), "--from-feedback"])
    assert result.exit_code == 0, result.output
    assert seen["config"].from_feedback and seen["config"].apo_prompts == 5 and seen["config"].sft_steps == loop.QUICK_CONFIG.sft_steps



def test_a_bad_round_config_is_one_line_naming_each_field(tmp_path):
    from click.testing import CliRunner
    from gearshift.cli import main

    overrides = tmp_path / "loop.json"
    for fields, message in [
        ({"seed_items": 0, "concurrency": 0}, "seed_items: Input should be greater than or equal to 1; concurrency: Input should be greater than or equal to 1"),
        ({"guard_suite": "headline"}, "LoopConfig: Value error, guard_suite needs guard_items of at least 1"),
    ]:
        overrides.write_text(json.dumps(fields))
        result = CliRunner().invoke(main, ["loop", "--config", str(overrides)])
        assert (result.exit_code, result.output) == (1, f"Error: {message}\n")

@pytest.mark.slow("every stage of a round on the real stack, SFT and APO on a tiny model")
@pytest.mark.timeout(600)
async def test_a_full_round_from_feedback_on_a_tiny_model(tmp_path):
    """Every stage on the real stack with a tiny random model: SFT learns the approved, well-formed
    served trajectories, APO rolls out on the first approved query in its conversation, and the
    candidate's lineage says so (the model's quality is not what is checked here)."""
    from gearshift.training.tiny import tiny_checkpoint

    from tests.libs.training.served import WELL_FORMED_CORRECT

    suite = tmp_path / "capitals.jsonl"
    suite.write_text("".join(json.dumps({"id": i, "question": q, "answer": a, "split": "test"}) + "\n"
                             for i, q, a in [("b", "What is the capital of Spain?", "Madrid"), ("c", "What is the capital of Italy?", "Rome")]))
    with scratch_database("gearshift_loop_feedback_round") as url:
        settings = Settings(data_dir=tmp_path, metrics_port=0, log_level="WARNING", database_url=url)
        async with embedded(settings, ("store",)) as platform, channel(platform.settings.store_addr, platform.settings) as ch:
            rows = await store_traffic(store_pb2_grpc.TrajectoryStoreStub(ch))
        config = loop.QUICK_CONFIG.model_copy(update={
            "from_feedback": True, "suite": str(suite), "base_model": str(tiny_checkpoint(tmp_path / "tiny")), "max_tokens_per_turn": 8,
            "threads": workers.threads_per_worker()})

        summary = await loop.run_round(settings, config, out=tmp_path / "summary.json")

        stages = summary["stages"]
        assert list(stages) == ["feedback", "sft", "apo", "evaluate", "gate", "publish"]
        assert stages["feedback"]["correct"] == stages["sft"]["correct"] == 3 and stages["apo"]["prompts"] == 1
        assert stages["sft"]["trajectories"] == len(WELL_FORMED_CORRECT)  # SFT keeps the well-formed ones
        async with embedded(settings, ("store",)) as platform, channel(platform.settings.store_addr, platform.settings) as ch:
            stub = store_pb2_grpc.TrajectoryStoreStub(ch)
            candidate = await stub.GetCheckpoint(store_pb2.GetCheckpointRequest(id=summary["candidate"], include_lineage=True))
            sft = await stub.GetCheckpoint(store_pb2.GetCheckpointRequest(id=candidate.parent_id, include_lineage=True))
            rollouts = [t async for t in stub.Export(store_pb2.ExportRequest(filter=store_pb2.TrajectoryFilter(run_id=f"apo-{candidate.id}")))]
    assert sft.job == "sft" and sft.parent_id == summary["base"] and sorted(sft.trajectory_ids) == ids(rows, *WELL_FORMED_CORRECT)
    assert candidate.job == "apo" and rows["liked, in a conversation"].id in candidate.trajectory_ids
    assert len(rollouts) == 3 * config.apo_rho and all(t.conversation == CONVERSATION for t in rollouts)
    assert {t.query for t in rollouts} == {"Capital of France?"}
