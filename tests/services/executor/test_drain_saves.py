"""At a drain's end nothing is lost (issue 60): a real executor process holds 4 agentic episodes
mid-turn (their second generation waits on a stand-in policy that stalls, named as such) when it
is sent SIGTERM with a 2 s grace. When the grace runs out, every episode is stored CANCELLED with
the turn it finished, before the process exits; with a store that does not answer then, each is
spooled in time and reaches the store when the next executor starts on the same volume. Before,
gRPC's stop returned as it cancelled the calls, the channels closed and the process exited
before the handlers saw the cancellation: none was stored."""

from __future__ import annotations

import asyncio
import time
import uuid

import grpc
import pytest
from gearshift.api.common.v1.common_pb2 import Mode, TrajectoryStatus
from gearshift.api.executor.v1 import executor_pb2, executor_pb2_grpc
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.clients import channel
from gearshift.embedded import embedded
from gearshift.testing.scripted_policy import serve_scripted

from tests.services.executor.test_deadlines import Stalling, second_generation
from tests.services.service_processes import environment, service_process
from tests.tcp_proxy import tcp_proxy

pytestmark = pytest.mark.slow("executor processes drained")

EPISODES = 4
GRACE_SECONDS = 2.0
NOTICE_SECONDS = 1.0  # gearshift.server.HEALTH_NOTICE_SECONDS, before the drain
SAVE_SECONDS = 3.0  # gearshift.services.executor.servicer.SHUTDOWN_SAVE_SECONDS, after it
EXIT_SECONDS = 3.0  # the rest of the way out, on a busy machine (a pod has 1 s: the chart leaves 5 s after the grace)
WITHOUT_EXECUTOR = ("store", "sandbox", "reward", "planner", "router")


async def solve(address: str, settings, request: executor_pb2.SolveRequest):
    """The stream's events and how it ended (None: with its final event)."""
    events = []
    async with channel(address, settings) as ch:
        try:
            async for item in executor_pb2_grpc.ExecutorStub(ch).Solve(request):
                events.append(item)
        except grpc.aio.AioRpcError as exc:
            return events, exc.code()
    return events, None


async def get(settings, trajectory_id: str):
    async with channel(settings.store_addr, settings) as ch:
        try:
            return (await store_pb2_grpc.TrajectoryStoreStub(ch).Get(store_pb2.GetRequest(id=trajectory_id))).trajectory
        except grpc.aio.AioRpcError as exc:
            return exc.code()


def requests() -> list[executor_pb2.SolveRequest]:
    return [executor_pb2.SolveRequest(query="What is 17*23?", mode=Mode.MODE_AGENTIC, reference_answer="391",
                                      trajectory_id=str(uuid.uuid4())) for _ in range(EPISODES)]


def assert_cancelled_with_their_turns(kept: list, asked: list[executor_pb2.SolveRequest]) -> None:
    for trajectory, request in zip(kept, asked):
        assert not isinstance(trajectory, grpc.StatusCode), f"{request.trajectory_id}: {trajectory}"  # before: NOT_FOUND
        assert trajectory.status == TrajectoryStatus.TRAJECTORY_STATUS_CANCELLED
        assert trajectory.mode == Mode.MODE_AGENTIC
        assert [turn.index for turn in trajectory.turns] == [0]  # the turn it finished; the one cut is not kept
        turn = trajectory.turns[0]
        assert turn.tool_calls and len(turn.tool_results) == len(turn.tool_calls) + 1  # the python call, the refused one
        assert "391" in turn.tool_results[0].output


async def hold_episodes(address: str, settings, policy: Stalling, asked: list) -> list[asyncio.Task]:
    streams = [asyncio.ensure_future(solve(address, settings, request)) for request in asked]
    deadline = time.monotonic() + 60
    while policy.holding < EPISODES:  # every episode is in its second turn, its generation waiting
        assert time.monotonic() < deadline and not any(s.done() for s in streams), [s.result() for s in streams if s.done()]
        await asyncio.sleep(0.05)
    return streams


async def test_episodes_mid_turn_when_the_grace_runs_out_are_stored_cancelled_with_their_turns(settings, tmp_path):
    policy = Stalling(second_generation)
    async with serve_scripted(policy) as policy_url, embedded(settings.with_policy(policy_url), WITHOUT_EXECUTOR) as platform:
        running = platform.settings
        env = environment(running, tmp_path / "executor", GEARSHIFT_GRACE_SECONDS=str(GRACE_SECONDS))
        with service_process("executor", env, tmp_path / "executor.log") as executor:
            asked = requests()
            streams = await hold_episodes(executor.address, running, policy, asked)
            took = await asyncio.to_thread(executor.terminate)
            ended = await asyncio.wait_for(asyncio.gather(*streams), 10)
            kept = [await get(running, request.trajectory_id) for request in asked]
        policy.release.set()
    log = executor.log.read_text()
    print(f"\nSIGTERM with {EPISODES} episodes mid-turn, grace {GRACE_SECONDS:g} s: exited after {took:.2f} s; "
          f"stored: {[TrajectoryStatus.Name(t.status) if not isinstance(t, grpc.StatusCode) else t.name for t in kept]}")
    assert executor.process.returncode == 0, log[-3000:]
    assert all(code is not None and not any(e.HasField("final") for e in events) for events, code in ended)  # cut, not finished
    assert_cancelled_with_their_turns(kept, asked)
    assert took < NOTICE_SECONDS + GRACE_SECONDS + SAVE_SECONDS + EXIT_SECONDS
    assert "Traceback" not in log, log[-3000:]
    assert not list((tmp_path / "executor" / "executor-spool").rglob("*.trajectory"))  # the store took them


async def test_with_the_store_silent_at_the_drains_end_they_are_spooled_in_time_and_stored_at_the_next_start(settings, tmp_path):
    policy = Stalling(second_generation)
    async with serve_scripted(policy) as policy_url, embedded(settings.with_policy(policy_url), WITHOUT_EXECUTOR) as platform:
        running = platform.settings
        host, port = running.store_addr.rsplit(":", 1)
        async with tcp_proxy(host, int(port)) as proxy:
            behind = running.model_copy(update={"store_addr": f"127.0.0.1:{proxy.port}"})
            env = environment(behind, tmp_path / "executor", GEARSHIFT_GRACE_SECONDS=str(GRACE_SECONDS))
            asked = requests()
            with service_process("executor", env, tmp_path / "executor.log") as executor:
                streams = await hold_episodes(executor.address, running, policy, asked)
                proxy.cut(hold_new=True)  # the store stops answering: connections dropped, new ones never answered
                took = await asyncio.to_thread(executor.terminate)
                await asyncio.wait_for(asyncio.gather(*streams), 10)
            spooled = sorted((tmp_path / "executor" / "executor-spool").rglob("*.trajectory"))
            assert [await get(running, request.trajectory_id) for request in asked] == [grpc.StatusCode.NOT_FOUND] * EPISODES

            proxy.restore()
            with service_process("executor", env, tmp_path / "executor-2.log"):  # replays its volume's spool
                deadline = time.monotonic() + 30
                kept = [await get(running, request.trajectory_id) for request in asked]
                while any(isinstance(t, grpc.StatusCode) for t in kept) and time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
                    kept = [await get(running, request.trajectory_id) for request in asked]
        policy.release.set()
    log = executor.log.read_text()
    print(f"\nSIGTERM with {EPISODES} episodes mid-turn and the store silent: exited after {took:.2f} s with {len(spooled)} spooled")
    assert executor.process.returncode == 0, log[-3000:]
    assert len(spooled) == EPISODES and took < NOTICE_SECONDS + GRACE_SECONDS + SAVE_SECONDS + EXIT_SECONDS
    assert_cancelled_with_their_turns(kept, asked)
    assert "Traceback" not in log, log[-3000:]
