"""The runner over real gRPC (every service in process, SQLite store): contract tags and ids, the
suite's verdict stored as the reward, and resume. The model is the ScriptedPolicy stand-in so the
answers are known; tests/libs/evaluation/test_model.py runs the real model."""

from __future__ import annotations

import json
import uuid

import pytest
from gearshift.api.common.v1.common_pb2 import Mode, RoutingStrategy, Sampling, Trajectory, TrajectoryStatus
from gearshift.api.executor.v1 import executor_pb2_grpc
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.clients import channel
from gearshift.embedded import embedded
from gearshift.evaluation.harness import evaluate
from gearshift.evaluation.runner import EvalRunner, parse_modes, trajectory_id
from gearshift.evaluation.suites import get_suite
from gearshift.testing.scripted_policy import serve_scripted


def always_42(body: dict) -> str:
    """Routes everything to instant mode and answers 42."""
    if "</classification>" in (body.get("stop") or []):
        return "Easy.\n<classification>\ndefault_agent\n</classification>"
    return "42</answer>"


class CountingExecutor:
    """The real executor stub, counting Solve calls."""

    def __init__(self, stub):
        self.stub, self.calls = stub, 0

    def Solve(self, request):
        self.calls += 1
        return self.stub.Solve(request)


@pytest.fixture
def suite_path(tmp_path):
    path = tmp_path / "answers.jsonl"
    rows = [{"id": f"q{i}", "question": f"Question {i}?", "answer": "42" if i % 2 == 0 else "7", "split": "test",
             "difficulty": i % 2 + 1, "domain": "toy"} for i in range(4)]
    path.write_text("\n".join(json.dumps(row) for row in rows))
    return str(path)


@pytest.fixture
async def stack(settings):
    async with serve_scripted(always_42) as policy_url:
        async with embedded(settings.with_policy(policy_url)) as platform:
            running = platform.settings
            yield running


async def export(settings, run_id) -> dict[str, Trajectory]:
    async with channel(settings.store_addr, settings) as ch:
        request = store_pb2.ExportRequest(filter=store_pb2.TrajectoryFilter(run_id=run_id))
        return {t.id: t async for t in store_pb2_grpc.TrajectoryStoreStub(ch).Export(request)}


async def counting(settings, suite, n, run_id, tmp_path, modes=("instant", "auto")):
    async with channel(settings.executor_addr, settings) as ch:
        executor = CountingExecutor(executor_pb2_grpc.ExecutorStub(ch))
        result = await evaluate(settings, suite, list(modes), n, run_id=run_id, concurrency=3,
                                out_dir=tmp_path / run_id, executor=executor)
    return executor.calls, result


async def test_tags_verdicts_and_resume(stack, suite_path, tmp_path):
    calls, result = await counting(stack, suite_path, 2, "r1", tmp_path)
    assert calls == 4 and (result.summary.solved, result.summary.skipped, result.summary.errors) == (4, 0, [])
    stored = await export(stack, "r1")
    assert len(stored) == 4
    for item in get_suite(suite_path).items("test", 2):
        for mode in ("instant", "auto"):
            t = stored[trajectory_id("r1", item.id, mode, 0)]
            assert t.id == str(uuid.uuid5(uuid.NAMESPACE_URL, f"r1/{item.id}/{mode}/0"))
            assert (t.task_source, t.split, t.run_id) == ("answers", "test", "r1")
            assert {k: t.labels[k] for k in ("item_id", "difficulty", "domain", "family", "sample")} == item.labels(0)
            if mode == "instant":
                assert t.routing_strategy == RoutingStrategy.ROUTING_STRATEGY_FORCED and t.requested_mode == Mode.MODE_INSTANT
            else:
                assert t.routing_strategy == RoutingStrategy.ROUTING_STRATEGY_MODEL and t.mode == Mode.MODE_INSTANT
            assert (t.reward.kind, t.reward.verifier) == ("correctness", "suite:answers")
            assert t.reward.correct == (item.answer == "42") and t.reward.value == float(item.answer == "42")
    assert result.report.modes["instant"].pass_at_1 == 0.5 and result.report.modes["auto"].mode_share == {"instant": 1.0}
    assert (tmp_path / "r1" / "report.md").exists()

    calls, result = await counting(stack, suite_path, 2, "r1", tmp_path)  # everything stored: nothing re-run
    assert calls == 0 and result.summary.skipped == 4


async def test_resume_reruns_cancelled_and_grades_ungraded(stack, suite_path, tmp_path):
    await counting(stack, suite_path, 1, "r2", tmp_path)
    items = get_suite(suite_path).items("test")
    # What an interruption leaves behind: an episode the executor stored as CANCELLED, and one
    # stored (COMPLETED) but not yet graded by the suite.
    cancelled = Trajectory(id=trajectory_id("r2", items[1].id, "instant", 0), query=items[1].question, run_id="r2",
                           task_source="answers", status=TrajectoryStatus.TRAJECTORY_STATUS_CANCELLED, labels=items[1].labels(0))
    ungraded = Trajectory(id=trajectory_id("r2", items[1].id, "auto", 0), query=items[1].question, run_id="r2", answer="7",
                          task_source="answers", status=TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED,
                          labels=items[1].labels(0) | {"eval_mode": "auto"})
    failed = Trajectory(id=trajectory_id("r2", items[2].id, "instant", 0), query=items[2].question, run_id="r2",
                        task_source="answers", status=TrajectoryStatus.TRAJECTORY_STATUS_FAILED, labels=items[2].labels(0))
    async with channel(stack.store_addr, stack) as ch:
        await store_pb2_grpc.TrajectoryStoreStub(ch).Put(store_pb2.PutRequest(trajectories=[cancelled, ungraded, failed]))

    calls, result = await counting(stack, suite_path, 3, "r2", tmp_path)
    # 3 items x 2 modes = 6 jobs: 2 done before, 1 stored ungraded, 1 cancelled and 1 failed (both
    # re-run under their next attempt id), 1 new
    assert calls == 3 and result.summary.skipped == 3
    stored = await export(stack, "r2")
    rerun = stored[trajectory_id("r2", items[1].id, "instant", 0, attempt=1)]
    assert rerun.status == TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED and not rerun.reward.correct
    assert stored[trajectory_id("r2", items[2].id, "instant", 0, attempt=1)].reward.correct
    graded = stored[ungraded.id]
    assert graded.reward.verifier == "suite:answers" and graded.reward.correct  # "7" is item 1's answer
    assert result.report.modes["instant"].trajectories == 3  # only the latest attempt of each job counts
    assert result.report.modes["auto"].correct == 3  # q0 and q2 answer 42; the stored "7" is q1's answer


def test_parse_modes():
    assert parse_modes("instant, auto,instant,learned") == ["instant", "auto", "learned"]
    with pytest.raises(ValueError):
        parse_modes("instant,fast")


def test_a_seeded_run_gives_each_episode_its_own_seed_the_same_in_every_run(suite_path):
    suite = get_suite(suite_path)

    def seeds(run_id: str, sampling: Sampling) -> list:
        runner = EvalRunner(None, None, suite, run_id, sampling=sampling)
        jobs = runner.jobs(suite.items("test", 2), ["instant", "auto"], samples=2)
        return [runner.request(job, attempt=0).sampling for job in jobs]

    sampled = seeds("base", Sampling(temperature=1.0, top_p=1.0, seed=3))
    assert len({s.seed for s in sampled}) == 8 and {s.temperature for s in sampled} == {1.0}
    assert seeds("candidate", Sampling(temperature=1.0, top_p=1.0, seed=3)) == sampled  # two checkpoints' samples pair up
    assert not {s.seed for s in seeds("base", Sampling(temperature=1.0, top_p=1.0, seed=4))} & {s.seed for s in sampled}
    assert not any(s.HasField("seed") for s in seeds("base", Sampling(temperature=1.0, top_p=1.0)))  # unseeded stays so
