"""The gateway as an OpenAI client application meets it: the official `openai` package over
loopback against the embedded platform (real gRPC services, the store on Postgres, the real
default policy), every answer checked against the trajectory the store holds."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import httpx
import openai
import pytest
from prometheus_client import generate_latest
from gearshift.api.common.v1.common_pb2 import ChatRole, Mode, TrajectoryStatus
from gearshift.api.store.v1 import store_pb2
from gearshift.http_server import running
from gearshift.jobs.router.config import RouterConfig
from gearshift.jobs.router.trainer import train_async
from gearshift.protocol.a2fm import render_transcript, tag_content
from gearshift.protocol.modes import mode_name
from gearshift.routing.registry import publish
from gearshift.services.gateway.service import build
from gearshift.testing.ports import free_port

from tests.libs.routing.synthetic import SUITE, put, world
from tests.services.gateway.conftest import MAX_BODY_BYTES, TOKEN

pytestmark = pytest.mark.model

QUESTION = "What is the capital of France?"
ASK = [{"role": "user", "content": QUESTION}]
FORCED = {"gearshift-instant": Mode.MODE_INSTANT, "gearshift-reasoning": Mode.MODE_REASONING, "gearshift-agentic": Mode.MODE_AGENTIC}
STRATEGY = {"gearshift": {"model", "fallback"}, "gearshift-learned": {"learned"}} | {name: {"forced"} for name in FORCED}
COMPLETED = TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED
CANCELLED = TrajectoryStatus.TRAJECTORY_STATUS_CANCELLED
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
async def learned(served, tmp_path_factory):
    """A learned router trained on a synthetic world in the platform's store, and published:
    the router service loads it on its next poll."""
    await put(served.store, world("gateway-router", {"train": 60, "dev": 15}))
    config = RouterConfig(task_source=SUITE, embedding="none", bootstrap_samples=50, store_addr=served.settings.store_addr,
                          output={"dir": tmp_path_factory.mktemp("router"), "checkpoint_id": "gateway-router-v1"})
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GEARSHIFT_AUTH_TOKEN", TOKEN)  # the trainer reads the platform token from the environment
        await train_async(config)
    await publish(served.store, "gateway-router-v1")
    async with openai.AsyncOpenAI(base_url=served.base_url, api_key=TOKEN, max_retries=0, timeout=600) as client:
        for _ in range(100):  # until the router service has loaded it (FAILED_PRECONDITION -> 400 until then)
            try:
                return await client.chat.completions.create(model="gearshift-learned", messages=ASK)
            except openai.BadRequestError as exc:
                assert "learned router" in exc.message
                await asyncio.sleep(0.2)
    raise AssertionError("the published router was never loaded")


async def stored(served, trajectory_id: str):
    return (await served.store.Get(store_pb2.GetRequest(id=trajectory_id))).trajectory


def check_against_store(trajectory, model: str, content: str, reasoning: str | None, finish: str, usage, gearshift: dict) -> None:
    """What the client was told is what the platform did and stored."""
    completed = trajectory.status == COMPLETED
    assert finish == ("stop" if completed else "length")
    transcript = render_transcript(trajectory)
    assert content == (trajectory.answer if completed else tag_content(transcript, "answer") or "")
    assert (reasoning or None) == (tag_content(transcript, "reasoning") or None)
    assert (usage.prompt_tokens, usage.completion_tokens) == (trajectory.usage.input_tokens, trajectory.usage.output_tokens)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens

    assert gearshift["trajectory_id"] == trajectory.id
    assert gearshift["status"] == TrajectoryStatus.Name(trajectory.status).removeprefix("TRAJECTORY_STATUS_").lower()
    assert gearshift["mode"] == mode_name(trajectory.mode)
    if model in FORCED:
        assert trajectory.mode == FORCED[model]
    assert gearshift["routing_strategy"] in STRATEGY[model]
    assert gearshift["routing_rationale"] == trajectory.routing_rationale
    assert 0 < gearshift["routing_seconds"] < 120
    tokens = gearshift["tokens"]
    assert (tokens["input"], tokens["output"]) == (trajectory.usage.input_tokens, trajectory.usage.output_tokens)
    routing_in = trajectory.usage.input_tokens - sum(turn.usage.input_tokens for turn in trajectory.turns)
    assert tokens["routing"] == {"input": routing_in, "output": trajectory.usage.output_tokens - sum(t.usage.output_tokens for t in trajectory.turns)}
    assert (routing_in > 0) is (model == "gearshift")  # forced and learned routing make no model call
    cost = trajectory.cost
    assert gearshift["cost_usd"] == pytest.approx({"total": cost.total_usd, "input": cost.input_usd, "output": cost.output_usd,
                                                  "tools": cost.tools_usd, "sandbox": cost.sandbox_usd})
    assert cost.total_usd > 0
    ran = [(call.name, call.arguments_json) for turn in trajectory.turns for call in turn.tool_calls]
    assert [(call["name"], call["arguments"]) for call in gearshift["tool_calls"] if call["name"]] == ran
    outputs = {result.call_id: result for turn in trajectory.turns for result in turn.tool_results}
    for call in gearshift["tool_calls"]:
        assert (call["output"], call["is_error"]) == (outputs[call["id"]].output, outputs[call["id"]].is_error)


MODELS = ["gearshift", "gearshift-learned", "gearshift-instant", "gearshift-reasoning", "gearshift-agentic"]


async def test_models_are_listed(client):
    assert [model.id for model in (await client.models.list()).data] == MODELS
    assert (await client.models.retrieve("gearshift-agentic")).owned_by == "gearshift"
    with pytest.raises(openai.NotFoundError):
        await client.models.retrieve("gpt-4o")


@pytest.mark.parametrize("model", MODELS)
async def test_a_completion_per_model(served, client, learned, model):
    raw = await client.chat.completions.with_raw_response.create(model=model, messages=ASK)
    completion = raw.parse()
    trajectory_id = raw.headers["x-gearshift-trajectory-id"]
    assert completion.id == f"chatcmpl-{trajectory_id}" and completion.model == model and completion.object == "chat.completion"
    trajectory = await stored(served, trajectory_id)
    (choice,) = completion.choices
    assert choice.message.role == "assistant"
    check_against_store(trajectory, model, choice.message.content, choice.message.model_extra.get("reasoning_content"),
                        choice.finish_reason, completion.usage, completion.model_extra["gearshift"])
    assert trajectory.query == QUESTION and not trajectory.conversation.messages and trajectory.task_source == "user"


@pytest.mark.parametrize("model", MODELS)
async def test_a_streamed_completion_per_model(served, client, learned, model):
    raw = await client.chat.completions.with_raw_response.create(model=model, messages=ASK, stream=True,
                                                                 stream_options={"include_usage": True})
    assert raw.headers["content-type"].startswith("text/event-stream")
    trajectory_id = raw.headers["x-gearshift-trajectory-id"]
    chunks = [chunk async for chunk in raw.parse()]
    assert {chunk.id for chunk in chunks} == {f"chatcmpl-{trajectory_id}"} and {c.object for c in chunks} == {"chat.completion.chunk"}
    assert chunks[0].choices[0].delta.role == "assistant"
    *deltas, finish, last = chunks
    assert last.choices == [] and last.usage is not None  # include_usage: the usage chunk comes last, with the extension
    assert all(chunk.usage is None and "gearshift" not in (chunk.model_extra or {}) for chunk in chunks[:-1])
    assert finish.choices[0].finish_reason and all(chunk.choices[0].finish_reason is None for chunk in deltas)
    content = "".join(chunk.choices[0].delta.content or "" for chunk in deltas)
    reasoning = "".join(chunk.choices[0].delta.model_extra.get("reasoning_content") or "" for chunk in deltas)
    trajectory = await stored(served, trajectory_id)
    check_against_store(trajectory, model, content, reasoning, finish.choices[0].finish_reason, last.usage, last.model_extra["gearshift"])


async def test_the_stream_is_server_sent_events_ending_done(served):
    async with httpx.AsyncClient(base_url=served.base_url, headers=AUTH, timeout=600) as http:
        reply = await http.post("/chat/completions", json={"model": "gearshift-instant", "messages": ASK, "stream": True})
    assert reply.status_code == 200 and reply.headers["cache-control"] == "no-cache"
    events = [line for line in reply.text.split("\n\n") if line]
    assert all(event.startswith("data: ") for event in events) and events[-1] == "data: [DONE]"
    last = json.loads(events[-2].removeprefix("data: "))
    assert last["choices"][0]["finish_reason"] and "gearshift" in last and "usage" not in last  # no include_usage: the finish chunk is last


async def test_reasoning_effort_pins_the_mode_of_gearshift(served, client):
    for effort, mode in (("minimal", Mode.MODE_INSTANT), ("low", Mode.MODE_REASONING)):
        raw = await client.chat.completions.with_raw_response.create(model="gearshift", messages=ASK, reasoning_effort=effort)
        trajectory = await stored(served, raw.headers["x-gearshift-trajectory-id"])
        assert (trajectory.mode, raw.parse().model_extra["gearshift"]["routing_strategy"]) == (mode, "forced")
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(model="gearshift", messages=ASK, reasoning_effort="extreme")
    assert (refused.value.type, refused.value.param) == ("invalid_request_error", "reasoning_effort")


async def test_a_two_turn_conversation_reaches_the_trajectory(served, client):
    messages = [
        {"role": "system", "content": "You are a geography tutor."},
        {"role": "developer", "content": "Answer with the city name only."},
        {"role": "user", "content": "What is the capital of Italy?"},
        {"role": "assistant", "content": "Rome"},
        {"role": "user", "content": "And of France?"},
    ]
    raw = await client.chat.completions.with_raw_response.create(model="gearshift-instant", messages=messages)
    trajectory = await stored(served, raw.headers["x-gearshift-trajectory-id"])
    assert trajectory.query == "And of France?"
    assert trajectory.conversation.instructions == "You are a geography tutor.\n\nAnswer with the city name only."
    assert [(m.role, m.content) for m in trajectory.conversation.messages] == [
        (ChatRole.CHAT_ROLE_USER, "What is the capital of Italy?"), (ChatRole.CHAT_ROLE_ASSISTANT, "Rome")]
    assert raw.parse().choices[0].message.content == trajectory.answer


async def test_request_fields_reach_the_episode(served, client):
    raw = await client.chat.completions.with_raw_response.create(
        model="gearshift-instant", messages=ASK, user="alice", metadata={"app": "tests"}, temperature=0.7, top_p=0.9)
    trajectory = await stored(served, raw.headers["x-gearshift-trajectory-id"])
    assert dict(trajectory.labels) == {"app": "tests", "user": "alice", "api_key": "platform"}  # no keys file: the token is the key

    # The token budget covers every model call of the episode: routing alone spends one token.
    raw = await client.chat.completions.with_raw_response.create(model="gearshift", messages=ASK, max_completion_tokens=1)
    completion = raw.parse()
    trajectory = await stored(served, raw.headers["x-gearshift-trajectory-id"])
    assert trajectory.status == TrajectoryStatus.TRAJECTORY_STATUS_BUDGET_EXHAUSTED and not trajectory.turns
    assert (completion.choices[0].finish_reason, completion.choices[0].message.content) == ("length", "")
    assert completion.model_extra["gearshift"]["status"] == "budget_exhausted"


async def test_stop_sequences_cut_the_answer(served, client):
    answer = (await client.chat.completions.create(model="gearshift-instant", messages=ASK)).choices[0].message.content
    assert len(answer) >= 3, answer
    stop = answer[1:3]
    expected = answer[: answer.index(stop)]
    cut = await client.chat.completions.create(model="gearshift-instant", messages=ASK, stop=[stop])
    assert (cut.choices[0].message.content, cut.choices[0].finish_reason) == (expected, "stop")
    stream = await client.chat.completions.create(model="gearshift-instant", messages=ASK, stop=stop, stream=True)
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "stop" and "gearshift" in chunks[-1].model_extra


@pytest.mark.parametrize("fields, param", [
    ({"n": 2}, "n"),
    ({"logprobs": True}, "logprobs"),
    ({"tools": [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}]}, "tools"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"frequency_penalty": 2.5}, "frequency_penalty"),
    ({"messages": [*ASK, {"role": "assistant", "content": "Paris"}]}, "messages"),
    ({"messages": [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"}, {"role": "user", "content": "So?"}]}, "messages"),
    ({"messages": [{"role": "user", "content": "x" * 33_000}]}, None),  # longer than the executor takes: its INVALID_ARGUMENT
])
async def test_what_cannot_be_honoured_is_a_400(client, fields, param):
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(**({"model": "gearshift", "messages": ASK} | fields))
    assert (refused.value.status_code, refused.value.type, refused.value.param) == (400, "invalid_request_error", param)
    assert refused.value.body["code"] == 400 and refused.value.message


async def test_unknown_models_auth_bad_json_and_big_bodies(served, client):
    with pytest.raises(openai.NotFoundError) as missing:
        await client.chat.completions.create(model="gpt-4o", messages=ASK)
    assert (missing.value.type, missing.value.param) == ("not_found_error", "model")

    async with openai.AsyncOpenAI(base_url=served.base_url, api_key="wrong", max_retries=0) as stranger:
        with pytest.raises(openai.AuthenticationError) as denied:
            await stranger.chat.completions.create(model="gearshift", messages=ASK)
        with pytest.raises(openai.AuthenticationError):
            await stranger.models.list()
    assert denied.value.type == "authentication_error"

    with pytest.raises(openai.APIStatusError) as too_big:
        await client.chat.completions.create(model="gearshift", messages=[{"role": "user", "content": "x" * MAX_BODY_BYTES}])
    assert (too_big.value.status_code, too_big.value.type) == (413, "invalid_request_error")

    async with httpx.AsyncClient(base_url=served.base_url, timeout=30) as http:
        bad = await http.post("/chat/completions", content=b'{"model": "gearshift", "messages": [', headers=AUTH | {"content-type": "application/json"})
        anonymous = await http.post("/chat/completions", json={"model": "gearshift", "messages": ASK})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error" and "JSON" in bad.json()["error"]["message"]
    assert anonymous.status_code == 401 and set(anonymous.json()["error"]) == {"message", "type", "param", "code"}


async def test_an_executor_that_is_down_is_a_503_and_not_ready(served, caplog):
    port = free_port()
    down = served.settings.model_copy(update={"executor_addr": f"127.0.0.1:{port}", "store_addr": f"127.0.0.1:{port}"})
    async with running(await build(down), down) as gateway:
        base = f"http://127.0.0.1:{gateway.port}"
        async with openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=TOKEN, max_retries=0, timeout=600) as client:
            with pytest.raises(openai.InternalServerError) as unavailable:
                await client.chat.completions.create(model="gearshift-instant", messages=ASK)
            with pytest.raises(openai.APIStatusError) as store_down:
                await feedback(client, trajectory_id=str(uuid.uuid4()), correct=True)
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            ready, live = await http.get("/ready"), await http.get("/health")
            streamed = await http.post("/v1/chat/completions", headers=AUTH | {"x-request-id": "rid-down"},
                                       json={"model": "gearshift-instant", "messages": ASK, "stream": True})
    assert unavailable.value.status_code == 503 and unavailable.value.response.headers["retry-after"] == "1"
    assert unavailable.value.body["message"].startswith("executor")
    assert ready.status_code == 503 and ready.json()["executor"].startswith("DOWN") and live.status_code == 200
    # No 5xx body names an address (gRPC's details do: ipv4:127.0.0.1:port); each names its request id, and the log the details.
    assert store_down.value.status_code >= 500 and streamed.status_code >= 500
    for reply in (unavailable.value.response, store_down.value.response, streamed):
        body = reply.text
        assert not any(inside in body for inside in ("ipv4", "127.0.0.1", str(port))), body
        assert reply.headers["x-request-id"] in reply.json()["error"]["message"]
    assert "rid-down" in streamed.json()["error"]["message"]
    assert any(str(port) in record.getMessage() for record in caplog.records if record.name == "gearshift.gateway")


async def wait_for_status(served, trajectory_id: str, status: int, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            trajectory = await stored(served, trajectory_id)
            if trajectory.status == status or time.monotonic() > deadline:
                return trajectory
        except Exception:  # noqa: BLE001 - not stored yet
            assert time.monotonic() < deadline, f"{trajectory_id} never stored"
        await asyncio.sleep(0.2)


async def test_a_client_leaving_mid_stream_cancels_the_episode(served):
    async with httpx.AsyncClient(base_url=served.base_url, headers=AUTH, timeout=600) as http:
        body = {"model": "gearshift-agentic", "messages": ASK, "stream": True}
        async with http.stream("POST", "/chat/completions", json=body) as reply:
            trajectory_id = reply.headers["x-gearshift-trajectory-id"]
            async for line in reply.aiter_lines():
                if line.startswith("data: "):
                    break  # the first chunk: the episode is under way; hang up
    trajectory = await wait_for_status(served, trajectory_id, CANCELLED)
    assert trajectory.status == CANCELLED, TrajectoryStatus.Name(trajectory.status)


async def test_a_client_leaving_a_plain_request_cancels_the_episode(served):
    marker = f"leaver-{uuid.uuid4().hex[:8]}"
    async with httpx.AsyncClient(base_url=served.base_url, headers=AUTH, timeout=httpx.Timeout(30, read=1.5)) as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.post("/chat/completions", json={"model": "gearshift-agentic", "messages": ASK, "user": marker})
    deadline = time.monotonic() + 60
    while True:
        page = await served.store.Query(store_pb2.QueryRequest(filter=store_pb2.TrajectoryFilter(statuses=[CANCELLED]), page_size=50))
        mine = [t for t in page.trajectories if t.labels.get("user") == marker]
        if mine or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    assert len(mine) == 1 and mine[0].status == CANCELLED


async def feedback(client: openai.AsyncOpenAI, **body) -> dict:
    return await client.post("/feedback", body=body, cast_to=object)


async def test_feedback_becomes_the_reward_and_says_what_it_replaced(served, client):
    raw = await client.chat.completions.with_raw_response.create(model="gearshift-instant", messages=ASK)
    trajectory_id = raw.headers["x-gearshift-trajectory-id"]
    first = await feedback(client, trajectory_id=trajectory_id, correct=True)
    assert (first["replaced"], first["previous"]) == (False, None)
    reward = (await stored(served, trajectory_id)).reward
    assert (reward.value, reward.correct, reward.verifier) == (1.0, True, "feedback")

    second = await feedback(client, trajectory_id=trajectory_id, reward=0.25)
    assert second["replaced"] is True and second["previous"]["correct"] is True and second["previous"]["verifier"] == "feedback"
    reward = (await stored(served, trajectory_id)).reward
    assert (reward.value, reward.correct, reward.verifier, reward.kind) == (0.25, False, "feedback", "feedback")

    answer = (await stored(served, trajectory_id)).answer
    graded = await feedback(client, trajectory_id=trajectory_id, reference_answer=answer)
    assert graded["replaced"] is True and graded["previous"]["value"] == 0.25
    reward = (await stored(served, trajectory_id)).reward
    assert reward.verifier.startswith("feedback:") and len(reward.verifier) > len("feedback:") and reward.correct
    assert graded["reward"]["verifier"] == reward.verifier

    page = await served.store.Query(store_pb2.QueryRequest(filter=store_pb2.TrajectoryFilter(feedback_only=True), page_size=500))
    assert trajectory_id in {t.id for t in page.trajectories}


@pytest.mark.parametrize("body, error", [
    ({"trajectory_id": str(uuid.uuid4()), "correct": True}, openai.NotFoundError),
    ({"trajectory_id": "not-a-uuid", "correct": True}, openai.BadRequestError),
    ({"trajectory_id": str(uuid.uuid4()), "correct": True, "reward": 1.0}, openai.BadRequestError),
    ({"trajectory_id": str(uuid.uuid4())}, openai.BadRequestError),
    ({"trajectory_id": str(uuid.uuid4()), "reward": 1.5}, openai.BadRequestError),
    ({"trajectory_id": str(uuid.uuid4()), "correct": "yes"}, openai.BadRequestError),
    ({"trajectory_id": str(uuid.uuid4()), "rating": 5}, openai.BadRequestError),
])
async def test_feedback_refusals(client, body, error):
    with pytest.raises(error) as refused:
        await feedback(client, **body)
    assert refused.value.type == ("not_found_error" if error is openai.NotFoundError else "invalid_request_error")


async def test_the_platform_token_gives_no_feedback_on_a_trajectory_it_was_not_served(served, client):
    """The platform token is the gateway's one client key here (no keys file): a rollout the
    platform stored itself (evaluation, training) is no client's to reward."""
    rollouts = world("unserved-rollout", {"train": 1})
    await put(served.store, rollouts)
    rollout = rollouts[0]
    with pytest.raises(openai.PermissionDeniedError) as refused:
        await feedback(client, trajectory_id=rollout.id, correct=False)
    assert refused.value.param == "trajectory_id" and "not served to this API key" in refused.value.message
    assert (await stored(served, rollout.id)).reward == rollout.reward  # its verifier's, untouched


async def test_metrics_on_their_own_port_health_and_readiness(served):
    service = await build(served.settings)
    async with running(service, served.settings) as gateway:
        base = f"http://127.0.0.1:{gateway.port}"
        async with openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=TOKEN, max_retries=0, timeout=600) as client:
            await client.chat.completions.create(model="gearshift-instant", messages=ASK)
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:  # open: no token
            live, ready, on_api_port = await http.get("/health"), await http.get("/ready"), await http.get("/metrics")
    assert live.status_code == 200 and ready.json() == {"status": "ready", "executor": "SERVING"}
    assert on_api_port.status_code == 404  # clients never read the metrics; Prometheus reads the metrics port
    text = generate_latest(service.metrics_registry).decode()  # what serve_metrics serves there
    assert 'gearshift_gateway_requests_total{model="gearshift-instant",route="/v1/chat/completions",status="200"}' in text
    assert 'gearshift_gateway_request_seconds_bucket{le="0.5",model="gearshift-instant",route="/v1/chat/completions"}' in text
    assert 'gearshift_gateway_routing_seconds_count{model="gearshift-instant"}' in text
    assert 'gearshift_gateway_cancelled_total{model="gearshift-instant"}' not in text  # finished episodes are not cancellations



def platform_environment(served, **extra: str) -> dict[str, str]:
    settings = served.settings
    return dict(os.environ, GEARSHIFT_AUTH_TOKEN=TOKEN, GEARSHIFT_LOG_LEVEL="WARNING", GEARSHIFT_DATA_DIR=str(settings.data_dir),
                GEARSHIFT_POLICY_CLIENT__URL=settings.policy_client.url,
                **{f"GEARSHIFT_{name.upper()}_ADDR": settings.address_of(name) for name in ("store", "sandbox", "reward", "planner",
                                                                                             "router", "executor", "gateway")},
                **extra)


async def test_gearshift_status_reports_the_gateway(served):
    status = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "gearshift.cli", "status"], env=platform_environment(served),
                                     capture_output=True, text=True, timeout=120)
    lines = {line.split()[0]: line.split()[-1] for line in status.stdout.splitlines()}
    assert lines["gateway"] == "SERVING" and status.returncode == 0, status.stdout + status.stderr


async def test_sigterm_drains_streams_in_flight_and_refuses_new_ones(served):
    port = free_port()
    gateway = subprocess.Popen([sys.executable, "-m", "gearshift.services.gateway"],
                               env=platform_environment(served, GEARSHIFT_PORT=str(port), GEARSHIFT_GRACE_SECONDS="60"))
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=base, headers=AUTH, timeout=600) as http:
            for _ in range(300):
                try:
                    if (await http.get("/health")).status_code == 200:
                        break
                except httpx.TransportError:
                    await asyncio.sleep(0.1)
            body = {"model": "gearshift-reasoning", "messages": ASK, "stream": True}
            started = time.monotonic()
            async with http.stream("POST", "/v1/chat/completions", json=body) as reply:
                trajectory_id = reply.headers["x-gearshift-trajectory-id"]
                lines = reply.aiter_lines()
                assert (await anext(lines)).startswith("data: ")
                gateway.send_signal(signal.SIGTERM)
                signalled = time.monotonic() - started
                refused = await refused_within(base, 5.0)
                rest = [line async for line in lines if line]
            assert refused, "the gateway still accepted connections after SIGTERM"
            assert rest[-1] == "data: [DONE]" and not any('"error"' in line for line in rest)
        assert await asyncio.to_thread(gateway.wait, 30) == 0
        trajectory = await stored(served, trajectory_id)
        assert trajectory.status != CANCELLED  # the stream in flight was finished, not cut
        assert trajectory.wall_seconds > signalled  # it was still running when the signal came
    finally:
        if gateway.poll() is None:
            gateway.kill()
            gateway.wait()


async def refused_within(base: str, seconds: float) -> bool:
    """Whether new connections are refused within the time (the listener closed).

    A connection the kernel accepted into the backlog just before the listener
    closed is dropped unanswered or reset: that is a refusal too, not a request served.
    """
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=base, timeout=1.0) as fresh:
        while time.monotonic() < deadline:
            try:
                await fresh.get("/health", headers={"connection": "close"})
            except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError):
                return True
            await asyncio.sleep(0.05)
    return False
