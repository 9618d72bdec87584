"""Held-out items never reach training: the default snapshot of a training round takes the
train split's serving and training-data trajectories only, whatever evaluations and gates ran
before, and the retraining trigger counts neither evaluation nor gate runs."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from gearshift.api.common.v1.common_pb2 import Purpose, Reward, TrajectoryStatus, Turn
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.clients import channel
from gearshift.embedded import embedded
from gearshift.orchestration import task_bodies

from tests.libs.rewards.trajectories import rollout

SERVING, EVALUATION, GATE, TRAINING = (Purpose.PURPOSE_UNSPECIFIED, Purpose.PURPOSE_EVALUATION,
                                       Purpose.PURPOSE_GATE, Purpose.PURPOSE_TRAINING)


def stored(split: str, purpose: int, item: str):
    trajectory = rollout(1, "Paris", ident=str(uuid.uuid4()))
    trajectory.split, trajectory.purpose, trajectory.status = split, purpose, TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED
    trajectory.query, trajectory.task_source, trajectory.run_id = f"question {item}", "facts", f"run-{split}-{purpose}"
    trajectory.labels["item_id"] = item
    trajectory.turns.append(Turn(index=0, output="Paris</answer>"))
    trajectory.reward.CopyFrom(Reward(value=1.0, correct=True, kind="apo", verifier="suite:facts"))
    return trajectory


async def test_a_test_split_item_never_enters_a_snapshot_whatever_ran_before(settings):
    runs = {
        "train data": stored("train", TRAINING, "facts-a"),
        "train serving": stored("train", SERVING, "facts-b"),
        "test evaluation": stored("test", EVALUATION, "facts-c"),
        "test gate": stored("test", GATE, "facts-c"),
        "test training data": stored("test", TRAINING, "facts-c"),
        "train evaluation": stored("train", EVALUATION, "facts-a"),
        "train gate": stored("train", GATE, "facts-a"),
        "user traffic": stored("", SERVING, "facts-d"),
    }
    async with embedded(settings, ("store",)) as platform:
        async with channel(platform.settings.store_addr, platform.settings) as ch:
            await store_pb2_grpc.TrajectoryStoreStub(ch).Put(store_pb2.PutRequest(trajectories=list(runs.values())))
        # What a Celery round freezes by default (tasks.build_snapshot) and what the loop freezes.
        for data in ({"correctness": "correct"}, {"correctness": "correct", "task_source": "facts"}):
            snapshot = await task_bodies.snapshot(platform.settings, data)
            kept = {name for name, t in runs.items() if t.id in set(_ids(snapshot))}
            assert kept == {"train data", "train serving"}
        count, _ = await task_bodies.count_scored_since(platform.settings, 0, 100)
    assert count == 4  # everything but the three evaluation and gate runs


def _ids(snapshot: dict) -> list[str]:
    return json.loads(Path(snapshot["path"]).read_text())["trajectory_ids"]


async def test_a_changed_teacher_keeps_the_snapshot_ids_and_changes_its_content(settings, tmp_path):
    """Episode ids are deterministic (run, item, mode), so a teacher that now writes another
    program keeps a snapshot's ids; its `content` (what names the default policy's checkpoint)
    tells the new data from the old, and the same data from itself."""
    snapshots = []
    for index, answer in enumerate(("Paris", "Lyon", "Paris")):
        trajectory = stored("train", TRAINING, "facts-a")
        trajectory.id, trajectory.turns[0].output = "6f1c2a52-3f0e-5a55-9d57-6e1b1d0c9a10", f"{answer}</answer>"
        local = settings.model_copy(update={"data_dir": tmp_path / str(index), "database_url": None})
        async with embedded(local, ("store",)) as platform:
            async with channel(platform.settings.store_addr, platform.settings) as ch:
                await store_pb2_grpc.TrajectoryStoreStub(ch).Put(store_pb2.PutRequest(trajectories=[trajectory]))
            snapshots.append(await task_bodies.snapshot(platform.settings, {"correctness": "correct"}, content=True))
    assert snapshots[0]["snapshot"] == snapshots[1]["snapshot"] == snapshots[2]["snapshot"]
    assert snapshots[0]["content"] != snapshots[1]["content"] and snapshots[0]["content"] == snapshots[2]["content"]
