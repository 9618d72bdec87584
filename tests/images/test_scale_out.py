"""Replicas as containers (issue 48, serving that scales out): the reward service run as three
containers of its workload sharing its Services' network aliases, so the engine's DNS answers its
headless Service's name (dns:///gearshift-reward-headless.gearshift.svc.cluster.local:50051, what
the chart gives the executor) with all of them, as a cluster's DNS answers with every ready pod.
Under a load of Solve episodes through the executor container (each scored by the reward
service, then stored), a fourth container is started and must serve calls within the servers'
max connection age plus the clients' DNS re-resolution, then one of the first three is stopped
(SIGTERM: it drains). No episode fails and every episode's trajectory is in the Postgres
container.

The policy is a stand-in for this test, named as such: the scripted instant policy of
gearshift.testing.scripted_policy, served from the executor image in a container that takes the
policy Service's names while the real policy's container is stopped (it is started again
afterwards). On the CI machine's two cores the real SmolLM2 served 0.7 episodes a second at this
concurrency, and 3 of 240 episodes failed on its streams stalling; the platform's calls are
what is tested here. The replicas'
connections are aged out after MAX_AGE seconds (GEARSHIFT_RPC__MAX_CONNECTION_AGE_SECONDS on
their containers; 30 s by default), so the test takes about a minute."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import tempfile
import time
from pathlib import Path

import grpc
import httpx
import pytest
from gearshift.api.common.v1.common_pb2 import Mode, TrajectoryStatus
from gearshift.api.executor.v1 import executor_pb2, executor_pb2_grpc
from gearshift.clients import DNS_RERESOLVE_MS, channel

from tests.images.stack import Stack, docker
from tests.images.test_images import client_settings, psql

pytestmark = pytest.mark.timeout(600)

SCALED = "reward"  # stateless, and called once by every episode that has a reference answer
MAX_AGE = 5.0  # seconds: the replicas' GEARSHIFT_RPC__MAX_CONNECTION_AGE_SECONDS
CONCURRENCY = 20  # episodes in flight
MIN_EPISODES = 300  # the load goes on until every step below is done and this many episodes have finished ...
LOAD_LIMIT_S = 150  # ... or for this long, whichever comes first
PHASE_S = 5.0  # seconds of load before the fourth container starts, between its first call and the stop, and after the stop
# What an episode here calls besides the reward service.
NEEDED = ("postgresql", "store", "router", "executor")
# A new replica gets calls once a client's connection to another ages out (MAX_AGE, +10% jitter)
# and the client re-resolves the name (at most every DNS_RERESOLVE_MS); the margin is for a busy
# 2-core machine running the executor and 20 episodes beside it.
FIRST_CALL_WITHIN = MAX_AGE * 1.1 + DNS_RERESOLVE_MS / 1000 + 5.0
FIGURES = Path(tempfile.gettempdir()) / "gearshift-image-scale-out.json"
# The stand-in policy (see the module's docstring) on the policy Service's port: argv port, model;
# over TLS as the pod's settings say (the certificate its Secret mounts), as the real one serves.
STAND_IN = """
import asyncio, ssl, sys
from gearshift.settings import get_settings
from gearshift.teaching.endpoint import _serve_connection
from gearshift.testing.scripted_policy import instant_policy

def tls_context():
    tls = get_settings().tls
    if not tls.enabled:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(tls.ca_file))
    context.load_cert_chain(tls.cert_file, tls.key_file)
    context.verify_mode = ssl.CERT_REQUIRED if tls.client_auth else ssl.CERT_NONE
    return context

async def main():
    port, model = int(sys.argv[1]), sys.argv[2]
    server = await asyncio.start_server(lambda r, w: _serve_connection(instant_policy, model, True, r, w), "0.0.0.0", port,
                                        ssl=tls_context())
    async with server:
        await server.serve_forever()

asyncio.run(main())
"""


def solve_request(n: int) -> executor_pb2.SolveRequest:
    return executor_pb2.SolveRequest(query=f"What is the capital of France? ({n})", mode=Mode.MODE_INSTANT, reference_answer="Paris")


async def solve(stub, request: executor_pb2.SolveRequest):
    """The episode's final trajectory, or the status code or text it failed with."""
    try:
        async for item in stub.Solve(request, timeout=120):
            if item.HasField("final"):
                return item.final.trajectory
    except grpc.aio.AioRpcError as error:
        return f"{error.code().name}: {error.details()}"
    return "the stream ended without a final event"


def failed(result) -> bool:
    return (isinstance(result, str) or result.status != TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED
            or not result.HasField("reward"))


SCORE_CALLS = re.compile(r'^grpc_server_handled_total\{[^}]*method="Score"[^}]*\} (\S+)$', re.M)


async def score_calls(http: httpx.AsyncClient, url: str) -> int:
    """Score calls a reward container answered (any status), from its /metrics."""
    return int(sum(float(value) for value in SCORE_CALLS.findall((await http.get(url, timeout=5)).text)))


async def metrics_url(stack: Stack, key: str) -> str:
    return f"http://{await asyncio.to_thread(stack.address, key, 'metrics')}/metrics"


async def first_call(http: httpx.AsyncClient, stack: Stack, key: str) -> float:
    """When (time.monotonic()) the container, being started, answers its first Score call."""
    while True:
        running = await asyncio.to_thread(docker, "inspect", "-f", "{{.State.Running}}", stack.container(key), check=False)
        if running.stdout.strip() == "true":
            break
        await asyncio.sleep(0.05)
    url = await metrics_url(stack, key)
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if await score_calls(http, url):
                return time.monotonic()
        await asyncio.sleep(0.05)


async def test_reward_as_three_containers_takes_a_fourth_mid_load_and_loses_one_without_a_failed_episode(stack: Stack):
    for component in NEEDED:  # earlier tests stop and start some
        if stack.state(component)["Status"] != "running":
            await asyncio.to_thread(stack.start, component)
    headless = stack.runs["executor"].env["GEARSHIFT_REWARD_ADDR"]  # dns:///<headless Service>.<ns>.svc.<domain>:50051
    assert headless.startswith("dns:///") and headless[len("dns:///"):].rpartition(":")[0] in stack.runs[SCALED].aliases, (
        headless, stack.runs[SCALED].aliases)
    executor = stack.runs["executor"]
    policy = stack.add_replica("policy", "stand-in", image=executor.image, entrypoint=["python", "-c", STAND_IN],
                               args=[str(stack.port("policy", "http")), executor.env["GEARSHIFT_POLICY_CLIENT__MODEL"]],
                               volumes={}, files={})
    env = {"GEARSHIFT_RPC__MAX_CONNECTION_AGE_SECONDS": f"{MAX_AGE:g}"}
    replicas = [stack.add_replica(SCALED, str(n), env) for n in (1, 2, 3)]
    fourth = stack.add_replica(SCALED, "4", env)
    figures: dict = {"concurrency": CONCURRENCY, "max_connection_age_s": MAX_AGE}
    try:
        # The stand-in answers for the policy Service's names, the real policy's container stopped.
        await asyncio.to_thread(stack.start, policy)
        await asyncio.to_thread(docker, "stop", "-t", "30", stack.container("policy"), timeout=90)
        for key in replicas:
            await asyncio.to_thread(stack.start, key)
        # The chart's one reward container leaves (drained): the three replicas answer for its names.
        await asyncio.to_thread(docker, "stop", "-t", "30", stack.container(SCALED), timeout=90)
        started_us = int(time.time() * 1e6)

        results: list = []
        enough = asyncio.Event()
        async with channel(stack.address("executor"), client_settings(stack)) as ch, httpx.AsyncClient() as http:
            stub = executor_pb2_grpc.ExecutorStub(ch)

            async def episodes(first: int) -> None:
                n = first
                while not enough.is_set():
                    results.append(await solve(stub, solve_request(n)))
                    n += CONCURRENCY

            checked = 0

            async def loaded(seconds: float) -> None:
                """Lets the load run this long, failing at once if an episode failed."""
                nonlocal checked
                deadline = time.monotonic() + seconds
                while time.monotonic() < deadline:
                    bad = [r for r in results[checked:] if failed(r)]
                    assert not bad, f"episode {checked + results[checked:].index(bad[0]) + 1} failed: {bad[:3]}"
                    checked = len(results)
                    await asyncio.sleep(0.1)

            load_started = time.monotonic()
            load = asyncio.gather(*(episodes(w) for w in range(CONCURRENCY)))
            try:
                await loaded(PHASE_S)
                urls = {key: await metrics_url(stack, key) for key in replicas}
                three = [await score_calls(http, urls[key]) for key in replicas]
                figures["episodes_before_the_fourth"] = len(results)
                figures["score_calls_before_the_fourth"] = three
                assert all(three), f"calls did not spread over the three containers: {three}"

                # A fourth container, mid-load: it must be called within about MAX_AGE + a re-resolution
                # of its being ready (a headless Service lists a pod once it is ready; the engine's DNS
                # answers with the container from its start, the clients' health checks wait for SERVING).
                called = asyncio.ensure_future(first_call(http, stack, fourth))
                run = time.monotonic()
                figures["fourth_ready_after_run_s"] = round(await asyncio.to_thread(stack.start, fourth), 2)
                ready = time.monotonic()
                try:
                    while not called.done():
                        waited = time.monotonic() - ready
                        assert waited < FIRST_CALL_WITHIN, f"the fourth container served no Score call {waited:.1f} s after it was ready"
                        await loaded(0.05)
                finally:
                    called.cancel()
                figures["fourth_first_call_after_run_s"] = round(called.result() - run, 2)
                figures["fourth_first_call_after_ready_s"] = round(called.result() - ready, 2)
                urls[fourth] = await metrics_url(stack, fourth)
                await loaded(PHASE_S)

                # Stop one of the first three (SIGTERM, as a scale-in or a rollout does): it drains.
                figures["episodes_before_the_stop"] = len(results)
                stopping = time.monotonic()
                await asyncio.to_thread(docker, "stop", "-t", "30", stack.container(replicas[0]), timeout=90)
                figures["stop_took_s"] = round(time.monotonic() - stopping, 2)
                after_stop = len(results)
                await loaded(PHASE_S)
                while len(results) < MIN_EPISODES and time.monotonic() - load_started < LOAD_LIMIT_S:
                    await loaded(0.5)
            finally:
                enough.set()  # each episode in flight finishes; no new one starts
                await asyncio.wait_for(load, 150)
            figures["episodes"] = len(results)
            figures["episodes_after_the_stop"] = len(results) - after_stop
            figures["load_s"] = round(time.monotonic() - load_started, 1)
            figures["episodes_per_s"] = round(len(results) / figures["load_s"], 1)
            figures["score_calls_at_the_end"] = {key: await score_calls(http, urls[key]) for key in (*replicas[1:], fourth)}

        state = stack.state(replicas[0])
        assert state["Status"] == "exited" and state["ExitCode"] == 0, (state, stack.logs(replicas[0]))
        assert "draining" in stack.logs(replicas[0])
        bad = [r for r in results if failed(r)]
        assert not bad, f"{len(bad)} of {len(results)} episodes failed: {bad[:3]}"
        assert figures["episodes_after_the_stop"] >= CONCURRENCY, figures
        assert all(figures["score_calls_at_the_end"].values()), figures["score_calls_at_the_end"]

        # Every episode's trajectory is in Postgres, once, with its reward; nothing else was stored meanwhile.
        ids = {r.id for r in results}
        assert len(ids) == len(results)
        rows = psql(stack, f"SELECT id, reward IS NOT NULL FROM trajectories WHERE created_at_us >= {started_us}").splitlines()
        stored = dict(row.split("|") for row in rows)
        figures["trajectories_in_postgres"] = len(stored)
        assert len(rows) == len(stored) and set(stored) == ids, (
            f"{len(ids - set(stored))} episodes not stored, {len(set(stored) - ids)} other rows; {len(rows)} rows")
        assert all(scored == "t" for scored in stored.values()), "stored without a reward"
    finally:
        FIGURES.write_text(json.dumps(figures, indent=1))
        print(json.dumps(figures))
        # Back as the chart runs them: the real policy and the one reward container, then the others drained away.
        for component in ("policy", SCALED):
            docker("start", stack.container(component), check=False)
            stack.wait_ready(component)
        for key in (policy, *replicas, fourth):
            stack.retire(key)
