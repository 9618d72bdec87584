"""Scaling out on one machine, through the code paths a cluster uses: replicas of a service on
loopback addresses behind one gRPC target (what a headless Service resolves to), every other
service a process of its own, a stand-in policy that answers at once (named as such: the
platform's calls are what is measured). Calls must spread over the replicas, a replica killed
under load must fail no episode, and a drained executor must finish every episode it holds."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal

import grpc
import httpx
import pytest
from gearshift.api.common.v1.common_pb2 import Mode, ToolCall, TrajectoryStatus
from gearshift.api.executor.v1 import executor_pb2, executor_pb2_grpc
from gearshift.api.sandbox.v1 import sandbox_pb2, sandbox_pb2_grpc
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.clients import channel
from gearshift.settings import Settings
from gearshift.stack import Stack
from gearshift.testing.replicas import Replicas
from gearshift.testing.scripted_policy import instant_policy, instant_policy_process, serve_scripted

from tests.workers import FIXED_PORTS

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(FIXED_PORTS)]

BASE_PORT = 24600  # the stack's ports from here; replicas on REPLICA_PORT: below the ephemeral range
REPLICA_PORT = 24690
MODES = itertools.cycle([Mode.MODE_INSTANT, Mode.MODE_REASONING, Mode.MODE_AGENTIC])


def solve_request(n: int) -> executor_pb2.SolveRequest:
    return executor_pb2.SolveRequest(query=f"What is the capital of France? ({n})", mode=next(MODES), reference_answer="Paris")


async def solve(stub, request: executor_pb2.SolveRequest):
    """The episode's stored trajectory, or the status it failed with."""
    try:
        async for item in stub.Solve(request):
            if item.HasField("final"):
                return item.final.trajectory
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return None


async def solve_many(settings: Settings, count: int, concurrency: int, during=None) -> list:
    """count episodes, concurrency at a time; `during` runs (in a thread) once a third have finished."""
    results: list = []
    gate = asyncio.Semaphore(concurrency)
    async with channel(settings.executor_addr, settings) as ch:
        stub = executor_pb2_grpc.ExecutorStub(ch)
        fired = None

        async def one(n: int) -> None:
            nonlocal fired
            async with gate:
                results.append(await solve(stub, solve_request(n)))
                if during and fired is None and len(results) >= count // 3:
                    fired = asyncio.ensure_future(asyncio.to_thread(during))

        await asyncio.gather(*(one(n) for n in range(count)))
        if fired:
            await fired
    return results


def failures(results: list) -> list:
    return [r for r in results if not hasattr(r, "status") or r.status != TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED]


@pytest.fixture(scope="module")
def policy_url():
    with instant_policy_process() as url:
        yield url


@pytest.fixture
def reward_replicas(tmp_path, policy_url):
    """Three reward replicas behind one target, and the rest of the stack calling them there."""
    settings = Settings().with_policy(policy_url)
    replicas = Replicas("reward", REPLICA_PORT, slots=3, env={}, log_dir=str(tmp_path))
    stack = Stack(settings, data_dir=str(tmp_path / "data"), base_port=BASE_PORT, with_policy=False,
                  elsewhere={"reward": replicas.target})
    replicas.env = stack.environment()
    replicas.start_all(3)
    stack.start()
    try:
        states = stack.wait_ready(timeout=120)
        assert all(state == "SERVING" for _, state in states.values()), states
        yield replicas, stack.client_settings()
    finally:
        stack.stop()
        replicas.stop_all()


async def test_calls_spread_over_replicas_and_a_killed_replica_fails_no_episode(reward_replicas):
    replicas, settings = reward_replicas
    results = await solve_many(settings, count=90, concurrency=10)
    assert not failures(results), failures(results)[:3]
    served = [replicas.calls_served(i, "Score") for i in range(3)]
    assert sum(served) >= 90 and min(served) >= sum(served) / 5, served  # each at least a fifth

    # kill -9 of the replica that served most, a third of the way through the next 90 episodes
    busiest = served.index(max(served))
    results = await solve_many(settings, count=90, concurrency=20, during=lambda: replicas.kill(busiest))
    assert len(results) == 90 and not failures(results), failures(results)[:3]
    survivors = [i for i in range(3) if i != busiest]
    assert sum(replicas.calls_served(i, "Score") for i in survivors) >= sum(served[i] for i in survivors) + 60


async def test_a_session_call_on_another_replica_is_refused_not_run_empty(tmp_path):
    """Sandbox sessions live in one replica: through a balanced target a later call either reaches
    it (its address comes back with every reply) or is refused; it never runs in an empty one."""
    settings = Settings()
    sandboxes = Replicas("sandbox", REPLICA_PORT + 1, slots=2, env=dict(os.environ, GEARSHIFT_DATA_DIR=str(tmp_path / "sb"),
                                                                          GEARSHIFT_SANDBOX__WARM_WORKERS="1"))
    with sandboxes:
        sandboxes.start_all(2)
        call = ToolCall(id="c", name="python", arguments_json='{"code": "x = 41"}')
        async with channel(sandboxes.target, settings) as ch:
            stub = sandbox_pb2_grpc.SandboxStub(ch)
            opened = await stub.Execute(sandbox_pb2.ExecuteRequest(call=call, session_id="s", open_session=True))
            assert not opened.result.is_error, opened.result.error
            assert opened.replica in (sandboxes.address(0), sandboxes.address(1))
            follow = ToolCall(id="d", name="python", arguments_json='{"code": "print(x + 1)"}')
            outcomes = set()
            for _ in range(6):  # round robin: some of these reach the other replica
                try:
                    reply = await stub.Execute(sandbox_pb2.ExecuteRequest(call=follow, session_id="s"))
                    outcomes.add(reply.result.output)
                except grpc.aio.AioRpcError as exc:
                    outcomes.add(exc.code())
            assert outcomes == {"42\n", grpc.StatusCode.NOT_FOUND}, outcomes
        async with channel(opened.replica, settings) as ch:  # the replica that holds it
            reply = await sandbox_pb2_grpc.SandboxStub(ch).Execute(sandbox_pb2.ExecuteRequest(call=follow, session_id="s"))
            assert reply.result.output == "42\n"


async def slow_policy(body: dict) -> str:
    """The instant stand-in, taking seconds per call: episodes are in flight when SIGTERM comes."""
    await asyncio.sleep(2.5)
    return instant_policy(body)


async def test_sigterm_to_an_executor_finishes_every_episode_it_holds(tmp_path):
    async with serve_scripted(slow_policy, model="smollm2") as url:
        await drain_executor(tmp_path, Settings().with_policy(url))


async def test_sigterm_to_the_gateway_finishes_every_stream_it_holds(tmp_path):
    async with serve_scripted(slow_policy, model="smollm2") as url:
        stack = Stack(Settings().with_policy(url), data_dir=str(tmp_path / "data"), base_port=BASE_PORT + 40, with_policy=False)
        stack.start()
        try:
            states = await asyncio.to_thread(stack.wait_ready, 120)
            assert all(state == "SERVING" for _, state in states.values()), states
            base = f"http://{stack.client_settings().gateway_addr}/v1"
            body = {"model": "gearshift-agentic", "messages": [{"role": "user", "content": "Capital of France?"}], "stream": True}

            async def stream(http: httpx.AsyncClient) -> str:
                async with http.stream("POST", "/chat/completions", json=body) as reply:
                    assert reply.status_code == 200
                    return "".join([line async for line in reply.aiter_lines()])

            async with httpx.AsyncClient(base_url=base, timeout=120) as http:
                streams = [asyncio.ensure_future(stream(http)) for _ in range(8)]
                await asyncio.sleep(3.0)  # every stream is running its episode
                gateway = stack.processes["gateway"]
                gateway.send_signal(signal.SIGTERM)
                await asyncio.sleep(0.5)
                with pytest.raises(httpx.ConnectError):  # a request made during the drain
                    await httpx.AsyncClient(base_url=base).post("/chat/completions", json=body)
                texts = await asyncio.gather(*streams)
            assert gateway.wait(timeout=60) == 0
            assert all("Paris" in text and text.endswith("data: [DONE]") for text in texts), texts
        finally:
            stack.stop()


async def drain_executor(tmp_path, settings: Settings) -> None:
    stack = Stack(settings, data_dir=str(tmp_path / "data"), base_port=BASE_PORT + 20, with_policy=False)
    stack.start()
    try:
        states = await asyncio.to_thread(stack.wait_ready, 120)
        assert all(state == "SERVING" for _, state in states.values()), states
        client = stack.client_settings()
        async with channel(client.executor_addr, client) as ch:
            stub = executor_pb2_grpc.ExecutorStub(ch)
            requests = [executor_pb2.SolveRequest(query=f"q{n}", mode=Mode.MODE_AGENTIC, reference_answer="Paris") for n in range(12)]
            episodes = [asyncio.ensure_future(solve(stub, r)) for r in requests]
            await asyncio.sleep(3.0)  # every episode is past its first policy call, with more than 5 s to go
            executor = stack.processes["executor"]
            executor.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.5)
            refused = await solve(stub, solve_request(99))  # a call made during the drain
            results = await asyncio.gather(*episodes)
            assert executor.wait(timeout=60) == 0
        assert refused == grpc.StatusCode.UNAVAILABLE
        assert not failures(results), failures(results)[:3]
        async with channel(client.store_addr, client) as ch:
            store = store_pb2_grpc.TrajectoryStoreStub(ch)
            for trajectory in results:
                stored = (await store.Get(store_pb2.GetRequest(id=trajectory.id))).trajectory
                assert stored.status == TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED
    finally:
        stack.stop()
