"""The built images, run as the chart runs them (tests/images/conftest.py starts the stack): health
through the chart's own test pod, metrics ports, a Solve through every container stored in the
Postgres container, chat completions through the gateway container with the openai client (whole
and streamed, stored likewise), the hostile battery against the sandbox container under the
seccomp profile the chart's installer put on the node, a store restart that keeps every trajectory, and SIGTERMs that drain."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import time

import grpc
import httpx
import openai
import pytest
from gearshift import tls as gearshift_tls
from gearshift.api.common.v1.common_pb2 import Mode, ToolCall
from gearshift.api.executor.v1 import executor_pb2, executor_pb2_grpc
from gearshift.api.sandbox.v1 import sandbox_pb2, sandbox_pb2_grpc
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.clients import channel
from gearshift.settings import Settings
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.charts.k8s import named
from tests.images.pods import KUBELET_SECCOMP, container_runs
from tests.images.stack import Stack, docker
from tests.services.gateway.test_client_keys import every_method, status_of
from tests.services.sandbox.conftest import run_python
from tests.services.sandbox.test_hostile import BATTERY, Hostile

# The first test also starts the stack (a minute here); every wait inside has its own deadline.
pytestmark = pytest.mark.timeout(900)

GRPC_SERVICES = ("store", "sandbox", "reward", "planner", "router", "executor")
HTTP_SERVICES = ("gateway",)
INSTALLER = "sandbox-seccomp"  # the component of the DaemonSet that puts the sandbox's seccomp profile on the node
solved: list[str] = []  # trajectory ids the Solve test stored


def client_settings(stack: Stack, token: str | None = None) -> Settings:
    """Settings carrying the token the chart gave every service (or `token`), dialing with the
    stack's certificate and checking the server name the chart gives every client."""
    env = stack.runs["executor"].env
    tls = stack.certificate.settings(client_auth=True, server_name=env["GEARSHIFT_TLS__SERVER_NAME"])
    return Settings(auth_token=token or env["GEARSHIFT_AUTH_TOKEN"], tls=tls)


def https_client(stack: Stack) -> httpx.Client:
    """An HTTPS client with the stack's certificate (the policy server asks for one)."""
    return httpx.Client(verify=gearshift_tls.client_context(client_settings(stack).tls), timeout=10)


def sni(stack: Stack) -> dict:
    """httpx's request extension checking the certificate for the server name, not the pod IP dialed."""
    return {"sni_hostname": stack.runs["executor"].env["GEARSHIFT_TLS__SERVER_NAME"]}


def psql(stack: Stack, sql: str) -> str:
    """One query in the Postgres container, its rows as psql's unaligned text."""
    env = stack.runs["postgresql"].env
    rows = stack.exec("postgresql", "psql", "-h", "/var/run/postgresql", "-U", env["POSTGRES_USER"], "-d", env["POSTGRES_DB"], "-tAc", sql)
    assert rows.returncode == 0, rows.stdout + rows.stderr
    return rows.stdout.strip()


def image_size_mb(image: str) -> float:
    return int(docker("image", "inspect", "-f", "{{.Size}}", image).stdout) / 1e6


def test_service_images_carry_no_torch(stack: Stack):
    for component in (*GRPC_SERVICES, *HTTP_SERVICES, "worker"):
        image = stack.runs[component].image
        found = docker("run", "--rm", "--entrypoint", "python", image, "-c",
                       "import importlib.util as u; print(u.find_spec('torch') is not None)").stdout.strip()
        assert found == "False", f"{image} has torch ({image_size_mb(image):.0f} MB)"
    policy = stack.runs["policy"].image
    assert docker("run", "--rm", "--entrypoint", "python", policy, "-c", "import torch; print(torch.__version__)").stdout.startswith("2.13.0")


def test_images_run_as_the_chart_runs_them(stack: Stack):
    """Numeric non-root users (runAsNonRoot needs them) and a read-only root in every container."""
    for component, run in stack.runs.items():
        user = docker("inspect", "-f", "{{.Config.User}}", stack.container(component)).stdout.strip()
        if component == INSTALLER:  # writes into the node's root-owned kubelet directory: uid 0, no capability
            capabilities = json.loads(docker("inspect", "-f", "{{json .HostConfig.CapDrop}}", stack.container(component)).stdout)
            assert user.split(":")[0] == "0" and capabilities == ["ALL"], f"{component} runs as {user!r} dropping {capabilities}"
        else:
            assert user.split(":")[0].isdigit() and user.split(":")[0] != "0", f"{component} runs as {user!r}"
        assert docker("inspect", "-f", "{{.HostConfig.ReadonlyRootfs}}", stack.container(component)).stdout.strip() == "true"
        probe = stack.exec(component, "sh", "-c", "touch /usr/gearshift-probe 2>&1; id -u")
        assert "Read-only file system" in probe.stdout, f"{component}: {probe.stdout}"


def test_the_chart_health_check_pod_passes(stack: Stack, docs, given_secrets, tmp_path):
    """`helm test`'s pod (in the router image) run on the stack's network: every service SERVING."""
    pod = named(docs, "Pod", "gearshift-health-check")
    container = pod["spec"]["containers"][0]
    deployment = {"kind": "Deployment", "metadata": {"name": "gearshift-health-check", "labels": {"app.kubernetes.io/component": "health-check"}},
                  "spec": {"template": {"spec": pod["spec"]}}}
    run = container_runs([deployment], tmp_path, given_secrets=given_secrets)["health-check"]
    run.write_files()
    command = run.command(stack.network, stack.prefix)
    command[command.index("-d")] = "--rm"
    result = docker(*command[1:], check=False, timeout=120)
    report = result.stdout + result.stderr
    assert result.returncode == 0, report
    serving = sorted(line.split()[0] for line in report.splitlines() if line.split()[-1:] == ["SERVING"])
    assert serving == sorted((*GRPC_SERVICES, *HTTP_SERVICES)), report
    assert container["command"][0] == "python"


def test_metrics_ports_serve_prometheus_text(stack: Stack):
    for component in (*GRPC_SERVICES, *HTTP_SERVICES, "policy"):
        if component == "policy":  # on its API port, over mutual TLS
            reply = https_client(stack).get(f"https://{stack.address(component, 'http')}/metrics", extensions=sni(stack))
        else:  # a port of its own, plaintext (the gateway's too, apart from the API)
            reply = httpx.get(f"http://{stack.address(component, 'metrics')}/metrics", timeout=10)
        assert reply.status_code == 200 and "# TYPE" in reply.text, f"{component}: {reply.status_code} {reply.text[:200]}"


def test_the_worker_answers_its_liveness_probe(stack: Stack):
    probe = stack.runs["worker"].spec["livenessProbe"]
    assert stack.probe("worker", probe) is None


# Run in the training Job's container in place of the training itself: the job's config as the
# job reads it, and the store it names answering over the stack's network.
READ_JOB_CONFIG = """
import sys, grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from gearshift import tls
from gearshift.settings import get_settings
from gearshift.training.jobs import load_config
config = load_config(sys.argv[1], sys.argv[2])
settings = get_settings().tls  # the Job's own certificate, as the chart mounts it
with grpc.secure_channel(config.store_addr, tls.channel_credentials(settings), options=tls.channel_options(settings)) as channel:
    status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30).status
print(config.output.dir, config.store_addr, health_pb2.HealthCheckResponse.ServingStatus.Name(status))
"""


def test_the_training_job_runs_its_config_in_the_training_image(stack: Stack, docs, given_secrets, tmp_path):
    run = container_runs(docs, tmp_path, kinds=("Job",), given_secrets=given_secrets)["training"]
    assert run.entrypoint == ["gearshift", "train"] and run.args[1] == "--config"
    algorithm, config_path = run.args[0], run.args[2]
    run.write_files()
    run.entrypoint, run.args = ["python", "-c", READ_JOB_CONFIG], [algorithm, config_path]
    command = run.command(stack.network, stack.prefix)
    command[command.index("-d")] = "--rm"
    result = docker(*command[1:], check=False, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    # The store as every in-cluster client names it (the chart's gearshift.serviceAddress).
    store = stack.runs["executor"].env["GEARSHIFT_STORE_ADDR"]
    assert result.stdout.split() == ["/checkpoints/images-sft", store, "SERVING"], result.stdout


async def test_a_solve_runs_through_the_containers_and_is_stored_in_postgres(stack: Stack):
    settings = client_settings(stack)
    async with channel(stack.address("executor"), settings) as ch:
        stub = executor_pb2_grpc.ExecutorStub(ch)
        request = executor_pb2.SolveRequest(query="What is 2 + 3?", mode=Mode.MODE_INSTANT, reference_answer="5")
        events = [event async for event in stub.Solve(request, timeout=240)]
    kinds = [event.WhichOneof("event") for event in events]
    assert kinds[0] == "mode_chosen" and kinds[-1] == "final", kinds
    trajectory = events[-1].final.trajectory
    assert trajectory.id and trajectory.turns and trajectory.usage.output_tokens > 0
    assert trajectory.HasField("reward")  # scored by the reward container
    solved.append(trajectory.id)
    assert psql(stack, f"SELECT count(*) FROM trajectories WHERE id = '{trajectory.id}'") == "1"


# ---------------------------------------------------------------- the gateway, as clients outside reach it

GATEWAY_MODELS = {"gearshift", "gearshift-learned", "gearshift-instant", "gearshift-reasoning", "gearshift-agentic"}
QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]


def gateway_client(stack: Stack, api_key: str | None = None) -> openai.OpenAI:
    """The official client on the gateway container's port published on loopback, with the token
    the chart gave every service as its API key."""
    return openai.OpenAI(base_url=f"https://{stack.published('gateway', 'http')}/v1", max_retries=0, timeout=240,
                         api_key=api_key or stack.runs["gateway"].env["GEARSHIFT_AUTH_TOKEN"],
                         http_client=httpx.Client(verify=gearshift_tls.client_context(client_settings(stack).tls)))


def test_the_gateway_is_ready_lists_its_models_and_refuses_a_wrong_key(stack: Stack):
    probe = stack.runs["gateway"].spec["readinessProbe"]  # /ready: the executor container answers
    deadline, why = time.monotonic() + 60, "not probed"
    while time.monotonic() < deadline and (why := stack.probe("gateway", probe)) is not None:
        time.sleep(0.5)
    assert why is None, f"{why}\n{stack.logs('gateway')}"
    assert {model.id for model in gateway_client(stack).models.list()} == GATEWAY_MODELS
    with pytest.raises(openai.AuthenticationError):
        gateway_client(stack, api_key="not-the-token").models.list()


def test_a_chat_completion_through_the_gateway_container_is_answered_and_stored_in_postgres(stack: Stack):
    raw = gateway_client(stack).chat.completions.with_raw_response.create(model="gearshift-instant", messages=QUESTION)
    completion = raw.parse()
    (choice,) = completion.choices
    assert choice.message.content.strip() and choice.finish_reason in ("stop", "length"), completion
    assert completion.model == "gearshift-instant" and completion.usage.completion_tokens > 0
    extension = completion.gearshift  # the platform's extension object: what it did, what it cost
    assert extension["trajectory_id"] == raw.headers["x-gearshift-trajectory-id"]
    assert extension["mode"] == "instant" and extension["cost_usd"]["total"] > 0, extension
    solved.append(extension["trajectory_id"])
    stored = psql(stack, f"SELECT mode FROM trajectories WHERE id = '{extension['trajectory_id']}'")
    assert stored == str(Mode.MODE_INSTANT), f"stored mode {stored!r}"


async def test_a_streamed_completion_through_the_gateway_container_adds_up_to_the_stored_answer(stack: Stack):
    stream = gateway_client(stack).chat.completions.create(
        model="gearshift-instant", messages=QUESTION, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    content = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    finish = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason]
    assert finish in (["stop"], ["length"]) and content.strip(), chunks
    last = chunks[-1]
    assert last.usage.completion_tokens > 0 and last.gearshift["mode"] == "instant"
    trajectory_id = last.gearshift["trajectory_id"]
    solved.append(trajectory_id)
    async with channel(stack.address("store"), client_settings(stack)) as ch:
        stored = await store_pb2_grpc.TrajectoryStoreStub(ch).Get(store_pb2.GetRequest(id=trajectory_id), timeout=30)
    assert stored.trajectory.mode == Mode.MODE_INSTANT and stored.trajectory.usage.output_tokens == last.usage.completion_tokens
    if finish == ["stop"]:
        assert content == stored.trajectory.answer


# ---------------------------------------------------------------- TLS and client keys

APP_KEY, OTHER_KEY = "gsk-images-app-0f3c9a1d", "gsk-images-other-7b21e4c8"  # their sha256 are in tests/images/values.yaml


async def test_every_service_refuses_plaintext_and_a_client_without_a_certificate(stack: Stack):
    settings = client_settings(stack)
    plaintext = Settings(auth_token=settings.auth_token)
    anonymous = settings.model_copy(update={"tls": settings.tls.model_copy(update={"cert_file": None, "key_file": None})})
    for component in GRPC_SERVICES:
        for refused in (plaintext, anonymous):
            async with channel(stack.address(component), refused) as ch:
                with pytest.raises(grpc.aio.AioRpcError) as error:
                    await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
                assert error.value.code() == grpc.StatusCode.UNAVAILABLE, (component, error.value)
        async with channel(stack.address(component), settings) as ch:  # with the certificate: served
            reply = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING

    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://{stack.published('gateway', 'http')}/health", timeout=10)
    policy = f"{stack.address('policy', 'http')}/health"
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://{policy}", timeout=10)
    with pytest.raises((httpx.TransportError, ssl.SSLError)):  # trusts the CA, presents no certificate
        httpx.Client(verify=ssl.create_default_context(cafile=stack.certificate.ca)).get(f"https://{policy}", extensions=sni(stack))
    assert https_client(stack).get(f"https://{policy}", extensions=sni(stack)).status_code == 200


async def test_a_client_key_gets_unauthenticated_from_every_internal_service(stack: Stack):
    tls_settings = client_settings(stack).tls
    for service, method, streaming in every_method():
        assert await status_of(stack.address(service), method, streaming, APP_KEY, tls_settings) == grpc.StatusCode.UNAUTHENTICATED, method
    token = stack.runs["executor"].env["GEARSHIFT_AUTH_TOKEN"]  # the refusal was the key's: the token gets past
    assert await status_of(stack.address("store"), "/gearshift.store.v1.TrajectoryStore/Export", True, token, tls_settings) == grpc.StatusCode.OK


async def test_feedback_is_accepted_only_from_the_key_that_was_served(stack: Stack):
    raw = gateway_client(stack, api_key=APP_KEY).chat.completions.with_raw_response.create(model="gearshift-instant", messages=QUESTION)
    trajectory_id = raw.headers["x-gearshift-trajectory-id"]
    feedback = {"trajectory_id": trajectory_id, "correct": True}
    with pytest.raises(openai.PermissionDeniedError):
        gateway_client(stack, api_key=OTHER_KEY).post("/feedback", body=feedback, cast_to=object)
    async with channel(stack.address("store"), client_settings(stack)) as ch:
        stored = await store_pb2_grpc.TrajectoryStoreStub(ch).Get(store_pb2.GetRequest(id=trajectory_id), timeout=30)
    assert stored.trajectory.labels["api_key"] == "images-app"
    given = gateway_client(stack, api_key=APP_KEY).post("/feedback", body=feedback, cast_to=object)
    assert given["reward"]["verifier"] == "feedback"


def test_a_revoked_key_is_refused_within_seconds(stack: Stack):
    """The key removed from the Secret's file, as the kubelet rewrites a mounted Secret: the
    gateway container refuses it without a restart."""
    (keys_file,) = [path for path in stack.runs["gateway"].files if path.name == "api-keys.json"]
    other = gateway_client(stack, api_key=OTHER_KEY)
    other.models.list()
    keys = json.loads(keys_file.read_text())
    del keys["images-other"]
    partial = keys_file.with_name("partial")
    partial.write_text(json.dumps(keys))
    os.replace(partial, keys_file)
    revoked_at = time.monotonic()
    while True:
        try:
            other.models.list()
        except openai.AuthenticationError:
            break
        assert time.monotonic() - revoked_at < 5, "the revoked key is still accepted"
        time.sleep(0.1)
    gateway_client(stack, api_key=APP_KEY).models.list()  # the key left in the file still works


@pytest.fixture(scope="module")
async def sandbox_stub(stack: Stack):
    async with channel(stack.address("sandbox"), client_settings(stack)) as ch:
        yield sandbox_pb2_grpc.SandboxStub(ch)


async def test_the_sandbox_container_isolates_python(sandbox_stub):
    """Namespaces work under the chart's seccomp profile: python runs (it is refused where they do not)."""
    result = await run_python(sandbox_stub, "import os\nprint(os.getuid(), os.getpid())")
    assert not result.is_error and result.output.split() == ["1000", "1"], (result.error, result.output)


def test_the_sandbox_container_runs_under_the_profile_the_charts_installer_put_on_the_node(stack: Stack, docs, node):
    """The chart's installer (its DaemonSet's pod, started first) wrote its ConfigMap's profile where
    the kubelet reads the sandbox's Localhost profile; the sandbox's init container waited for it
    and the container runs under exactly that filter (the engine keeps the profile it loaded)."""
    profile = named(docs, "ConfigMap", f"gearshift-{INSTALLER}")["data"]["sandbox-seccomp.json"]
    localhost = stack.runs["sandbox"].spec["securityContext"]["seccompProfile"]["localhostProfile"]
    assert (node / KUBELET_SECCOMP / localhost).read_text() == profile
    assert [init.spec["name"] for init in stack.runs["sandbox"].inits] == ["seccomp-wait"]
    options = json.loads(docker("inspect", "-f", "{{json .HostConfig.SecurityOpt}}", stack.container("sandbox")).stdout)
    (loaded,) = [option.partition("=")[2] for option in options if option.startswith("seccomp=")]
    assert json.loads(loaded) == json.loads(profile)
    assert stack.state(INSTALLER)["Status"] == "running"


async def test_the_sandbox_names_its_pod_address_in_each_reply(stack: Stack, sandbox_stub):
    """The chart gives the sandbox its pod IP (status.podIP, in GEARSHIFT_SANDBOX__ADVERTISE_ADDRESS):
    each reply names it, where a python session's later calls reach this replica past the balancing."""
    call = ToolCall(id="c", name="python", arguments_json='{"code": "print(1)"}')
    reply = await sandbox_stub.Execute(sandbox_pb2.ExecuteRequest(call=call), timeout=30)
    assert not reply.result.is_error and reply.replica == stack.address("sandbox"), (reply.result.error, reply.replica)


@pytest.mark.parametrize("program", BATTERY, ids=[h.name for h in BATTERY])
async def test_hostile_program_is_contained_in_the_container(stack: Stack, sandbox_stub, program: Hostile):
    # The service's pid as the host sees it, as in tests/services/sandbox (inside the call's own pid
    # namespace, pid 1 is the call itself).
    code = program.code.replace("SERVICE_PID", str(stack.state("sandbox")["Pid"]))
    result = await run_python(sandbox_stub, code, timeout=program.timeout)
    assert program.contained(result), (f"{program.name}: is_error={result.is_error} error={result.error!r} "
                                       f"cpu={result.cpu_seconds:.2f} output={result.output[:300]!r}")


async def test_the_sandbox_still_answers_after_the_battery(sandbox_stub):
    started = time.monotonic()
    result = await run_python(sandbox_stub, "print(6 * 7)")
    assert result.output == "42\n" and time.monotonic() - started < 5


async def test_the_store_restarts_on_its_volume_and_keeps_every_trajectory(stack: Stack):
    """Postgres and the store are stopped and started again (the database on its named volume, as
    on the StatefulSet's claim): every stored trajectory is still there, through the store."""
    assert solved, "the Solve test stored nothing to look for"
    async with channel(stack.address("store"), client_settings(stack)) as ch:
        before = await store_pb2_grpc.TrajectoryStoreStub(ch).Query(store_pb2.QueryRequest(), timeout=30)
    ids = {t.id for t in before.trajectories}
    assert set(solved) <= ids
    for component in ("store", "postgresql"):
        docker("stop", "-t", "30", stack.container(component), timeout=60)
    for component in ("postgresql", "store"):
        docker("start", stack.container(component))
        stack.wait_ready(component)
    async with channel(stack.address("store"), client_settings(stack)) as ch:
        store = store_pb2_grpc.TrajectoryStoreStub(ch)
        after = await store.Query(store_pb2.QueryRequest(), timeout=30)
        assert {t.id for t in after.trajectories} == ids
        for trajectory_id in solved:
            stored = await store.Get(store_pb2.GetRequest(id=trajectory_id), timeout=30)
            assert stored.trajectory.turns


async def test_sigterm_drains_a_call_in_flight(stack: Stack, sandbox_stub):
    """SIGTERM while a python call runs: the call completes, then the service exits 0."""
    call = asyncio.ensure_future(run_python(sandbox_stub, "import time\ntime.sleep(2)\nprint('finished')", timeout=10))
    await asyncio.sleep(0.5)
    assert not call.done()
    docker("kill", "--signal", "SIGTERM", stack.container("sandbox"))
    result = await asyncio.wait_for(call, 30)
    assert not result.is_error and result.output == "finished\n", (result.error, result.output)
    exit_code = docker("wait", stack.container("sandbox"), timeout=60).stdout.strip()
    assert exit_code == "0", stack.logs("sandbox")
    assert "draining" in stack.logs("sandbox")
    # Nothing answers any more: the service stopped rather than lingering.
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await sandbox_stub.Execute(sandbox_pb2.ExecuteRequest(call=ToolCall(id="c", name="python", arguments_json='{"code": "1"}')),
                                   timeout=5)
    assert error.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def test_sigterm_lets_a_streamed_completion_finish_then_the_gateway_exits(stack: Stack):
    """SIGTERM to the gateway container while a completion streams: the stream still ends with
    its finish reason and the extension, then the gateway exits 0 (the last test to use it)."""
    stream = gateway_client(stack).chat.completions.create(model="gearshift-instant", messages=QUESTION, stream=True)
    first = next(stream)
    assert first.choices[0].delta.role == "assistant"
    docker("kill", "--signal", "SIGTERM", stack.container("gateway"))
    rest = list(stream)
    assert rest and rest[-1].choices[0].finish_reason in ("stop", "length") and rest[-1].gearshift["trajectory_id"], rest
    exit_code = docker("wait", stack.container("gateway"), timeout=60).stdout.strip()
    assert exit_code == "0", stack.logs("gateway")
    assert "draining" in stack.logs("gateway")
