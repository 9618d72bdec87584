"""Training from gateway feedback: a job's DataConfig with feedback_only selects exactly the served
trajectories a client gave a verdict on, from a Postgres store that holds every other kind too;
SFT learns the ones judged correct that were in their mode's format; APO and distillation take
their queries with their conversations (APO: the approved answers as references), and their
rollouts go through the executor in that conversation."""

from __future__ import annotations

import pytest
from gearshift.api.common.v1.common_pb2 import Trajectory
from gearshift.api.store.v1 import store_pb2_grpc
from gearshift.clients import channel
from gearshift.jobs.apo import trainer as apo
from gearshift.jobs.apo.config import APOConfig
from gearshift.jobs.apo.rollouts import collect, group_requests
from gearshift.jobs.distill import trainer as distill
from gearshift.jobs.distill.config import DistillConfig
from gearshift.jobs.sft import trainer as sft
from gearshift.jobs.sft.config import SFTConfig
from gearshift.rewards.formats import check_trajectory_format
from gearshift.settings import Settings
from gearshift.testing.postgres import scratch_database
from gearshift.training.config import DataConfig
from gearshift.training.data import load_trajectories

from tests.jobs.conftest import running_store
from tests.libs.training.served import CONVERSATION, JUDGED_CORRECT, WELL_FORMED_CORRECT, ids, store_traffic


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """The store service on a Postgres database of its own."""
    with scratch_database("gearshift_jobs_feedback") as url:
        settings = Settings(data_dir=tmp_path_factory.mktemp("store"), metrics_port=0, log_level="WARNING", database_url=url)
        with running_store(settings) as server:
            yield server


@pytest.fixture(scope="module")
def stored(store) -> dict[str, Trajectory]:
    async def put():
        async with channel(store.address, store.settings) as ch:
            return await store_traffic(store_pb2_grpc.TrajectoryStoreStub(ch))

    rows = store.call(put())
    assert not check_trajectory_format(rows["liked, malformed"]) and check_trajectory_format(rows["liked, in a conversation"])
    return rows


def test_feedback_only_selects_exactly_the_served_verdicts(store, stored):
    def selected(**fields) -> list[str]:
        return sorted(t.id for t in load_trajectories(store.address, DataConfig(**fields)))

    # Served traffic has no split: feedback_only reads every split unless one is given.
    assert DataConfig(feedback_only=True).split == "" and DataConfig().split == "train"
    assert selected(feedback_only=True) == ids(stored, "liked, in a conversation", "graded right", "disliked", "liked, malformed")
    assert selected(feedback_only=True, correctness="correct") == ids(stored, *JUDGED_CORRECT)
    assert selected(feedback_only=True, purposes=["evaluation"]) == ids(stored, "liked, an evaluation run")
    assert selected(feedback_only=True, split="train") == []
    assert len(selected(split="")) == 7  # without the flag, the rest of the serving and training traffic too


def test_sft_learns_the_liked_answers_in_their_format(tiny_dir, tmp_path, store, stored):
    config = SFTConfig.model_validate({
        "model": {"base": str(tiny_dir)}, "optim": {"max_steps": 2, "threads": 1}, "batch_size": 2,
        "output": {"dir": str(tmp_path / "sft"), "progress": False}, "store_addr": store.address,
        "data": {"feedback_only": True, "correctness": "correct"},
    })
    result = sft.train(config)
    assert result["trajectory_ids"] == ids(stored, *WELL_FORMED_CORRECT)
    assert sorted(store.checkpoint(result["checkpoint_id"]).trajectory_ids) == result["trajectory_ids"]


def apo_config(store, tmp_path, **extra) -> APOConfig:
    return APOConfig.model_validate({
        "model": {"base": "tiny"}, "output": {"dir": str(tmp_path / "apo")}, "store_addr": store.address,
        "data": {"feedback_only": True, "correctness": "correct"}, "rho": 1, "gamma": 1,
        "rollout": {"max_tokens_per_turn": 12, "max_steps": 1}, **extra,
    })


def test_apo_prompts_are_the_liked_queries_in_their_conversations(store, stored, tmp_path):
    prompts, lineage = apo.gather_prompts(apo_config(store, tmp_path))
    by_query = {p.query: p for p in prompts}
    assert sorted(lineage) == ids(stored, *JUDGED_CORRECT)
    assert {q: p.reference_answer for q, p in by_query.items()} == {
        "Capital of France?": "Paris", "What is 17*23?": "391", "Capital of Italy?": "Rome"}
    france = by_query["Capital of France?"]
    assert france.conversation.to_proto() == CONVERSATION and by_query["What is 17*23?"].conversation is None
    requests = group_requests(france, apo_config(store, tmp_path), "run", step=1, index=0)
    assert len(requests) == 4 and all(r.conversation == CONVERSATION for r in requests)
    assert not group_requests(by_query["What is 17*23?"], apo_config(store, tmp_path), "run", 1, 1)[0].HasField("conversation")


async def test_apo_and_distillation_rollouts_run_in_the_served_conversation(settings, store, stored, tmp_path):
    from gearshift.embedded import embedded
    from gearshift.testing.scripted_policy import instant_policy, serve_scripted

    bodies: list[dict] = []

    def policy(body: dict) -> str:
        bodies.append(body)
        return instant_policy(body)

    config = apo_config(store, tmp_path, gamma=0)
    prompts, _ = apo.gather_prompts(config)  # inside a running event loop, as the async trainers call it
    france = [p for p in prompts if p.conversation]
    students = DistillConfig.model_validate({"output": {"dir": str(tmp_path / "distill")}, "store_addr": store.address,
                                             "data": {"feedback_only": True, "correctness": "correct"}, "default_teacher": "tiny"})
    student_prompts, _ = distill.gather_prompts(students)
    rollout_stack = ("store", "sandbox", "reward", "planner", "router", "executor")  # what a rollout goes through
    async with serve_scripted(policy) as url, embedded(settings.with_policy(url), rollout_stack) as platform:
        stack = platform.settings
        (group,) = await collect(stack, stack.executor_addr, stack.reward_addr, france, config, "apo-feedback", step=1)
        episodes = await distill.student_rollouts(stack, student_prompts, students, "distill-feedback", step=1)
    assert len(group.rollouts) == 3 and all(t.conversation == CONVERSATION for t in group.rollouts)
    assert group.correct[0] and group.rewards[0] == 1.0  # the forced-instant rollout answered as the client liked
    in_conversation = [t.query for t in episodes if t.conversation == CONVERSATION]
    assert len(episodes) == 3 and in_conversation == ["Capital of France?"]
    in_france = [b for b in bodies if "Capital of France?" in str(b["messages"])]
    assert len(in_france) > len(group.rollouts) + 1
    for body in in_france:  # every model call: the client's instructions, then the earlier turns, then the query
        system, user, assistant = body["messages"][:3]
        assert system["content"].endswith("Answer in one word.") and user["content"] == "Hello"
        assert assistant["content"] == "Hello! Ask me anything."
