"""A vllm_lora publish reaches every replica: two real vLLM CPU servers (tests/vllm_servers.py)
behind the policy Service's EndpointSlices in the fake Kubernetes API. After each publish every
replica's greedy output is the new adapter's; a replica that cannot be reached fails the publish
by name. A replica starting later gets the newest published adapter from the registry (the
chart's init step, `gearshift publish-startup-adapters`)."""

from __future__ import annotations

import asyncio
import json
import shlex
from urllib.parse import urlsplit

import pytest
from click.testing import CliRunner
from gearshift.api.common.v1.common_pb2 import Checkpoint, CheckpointStatus
from gearshift.api.store.v1 import store_pb2
from gearshift.cli import main
from gearshift.errors import FailedPrecondition
from gearshift.orchestration.publishing import publish_vllm_lora
from gearshift.policy_client import PolicyClient
from gearshift.settings import KubernetesSettings, PolicyClientSettings, Settings, get_settings
from gearshift.training.runtime import Run

from tests.jobs.test_weight_sync import PROMPT, apo_config, teach
from tests.libs.routing.synthetic import running_store

ALIAS = "published-policy"  # the name executors ask for; the session's servers serve no such adapter yet
LORA_CONFIG = json.dumps({"model": {"lora": True}})


def settings(policy_service: str | None = "gearshift-policy", **update) -> Settings:
    return Settings(
        kubernetes=KubernetesSettings(namespace="serving", policy_service=policy_service),
        policy_client=PolicyClientSettings(url="http://gearshift-policy:8000/v1", model=ALIAS),
        **update,
    )


def adapters(tmp_path, answers: list[str]) -> list[Checkpoint]:
    """A LoRA checkpoint per answer, each trained until PROMPT's greedy continuation starts with it."""
    found = []
    for index, answer in enumerate(answers):
        run = Run.start("apo", apo_config(tmp_path / f"run-{index}", "smollm2", "http://unused", lora=True))
        teach(run, answer)
        directory = tmp_path / f"checkpoint-{index}"
        run.save_weights(directory, merged=False)
        found.append(Checkpoint(id=f"apo-{index}", kind="policy", uri=str(directory), config_json=LORA_CONFIG, job="apo"))
    return found


def behind_the_service(fake_kube, urls: list[str]) -> None:
    """Each server as a pod of the policy Service: one EndpointSlice per port, as for pods on
    loopback that differ only by port."""
    for url in urls:
        fake_kube.add_endpoint_slice("gearshift-policy", [("127.0.0.1", True)],
                                     ports=[{"name": "http", "port": urlsplit(url).port}], namespace="serving")


async def greedy(url: str) -> str:
    async with PolicyClient(url, ALIAS, retries=0) as policy:
        return (await policy.complete(PROMPT, max_tokens=6)).text


@pytest.mark.model
@pytest.mark.vllm
async def test_each_publish_reaches_every_replica_and_a_dead_one_fails_it_by_name(vllm_servers, fake_kube, kubeconfig, tmp_path):
    berlin, rome = adapters(tmp_path, [" Berlin. Berlin is a city", " Rome. Rome is a city"])
    behind_the_service(fake_kube, vllm_servers)
    try:
        for checkpoint, answer in ((berlin, " Berlin"), (rome, " Rome")):
            report = await publish_vllm_lora(checkpoint, settings())
            assert sorted(report.details["pods"]) == sorted(f"127.0.0.1:{urlsplit(u).port}" for u in vllm_servers)
            assert report.details["adapter"] == f"{checkpoint.uri}/adapter"
            for url in vllm_servers:
                assert (await greedy(url)).startswith(answer), url
        print(f"\nvllm_lora publish to {len(vllm_servers)} replicas: {report.switch_seconds:.2f} s, per pod {report.details['pods']}")

        fake_kube.add_endpoint_slice("gearshift-policy", [("127.0.0.1", True)], ports=[{"name": "http", "port": 9}], namespace="serving")
        with pytest.raises(FailedPrecondition, match=r"1 of 3 policy pods refused the adapter .*127\.0\.0\.1:9: "):
            await publish_vllm_lora(berlin, settings())
        for url in vllm_servers:  # the reachable ones took it: publishing again converges the rest
            assert (await greedy(url)).startswith(" Berlin")
    finally:
        for url in vllm_servers:
            async with PolicyClient(url, ALIAS) as policy:
                await policy.unload_lora_adapter(ALIAS)


async def test_full_weights_are_refused_before_any_pod_is_asked(fake_kube, kubeconfig):
    full = Checkpoint(id="sft-1", kind="policy", uri="/checkpoints/sft-1", config_json=json.dumps({"model": {"lora": False}}))
    with pytest.raises(FailedPrecondition, match="sft-1 holds full weights, not a LoRA adapter"):
        await publish_vllm_lora(full, settings())
    assert not [r for r in fake_kube.requests if r.kind == "EndpointSlice"]


async def invoke(output):
    """The command as the init container runs it (a fresh process's settings, its own loop)."""
    get_settings.cache_clear()
    return await asyncio.to_thread(CliRunner().invoke, main, ["publish-startup-adapters", "--output", str(output)])


@pytest.fixture
def uncached_settings():
    """The command reads settings from the environment the test sets; none of it outlives the test."""
    yield
    get_settings.cache_clear()


async def test_a_replica_starting_later_gets_the_newest_published_adapter(tmp_path, monkeypatch, uncached_settings):
    base = settings(policy_service=None, data_dir=tmp_path)
    async with running_store(base) as (configured, stub):
        for index, lora in ((1, True), (2, True), (3, False)):
            config = json.dumps({"model": {"lora": lora}})
            await stub.RegisterCheckpoint(store_pb2.RegisterCheckpointRequest(checkpoint=Checkpoint(
                id=f"apo-{index}", kind="policy", uri=f"/checkpoints/apo-{index}", job="apo", config_json=config)))
        monkeypatch.setenv("GEARSHIFT_STORE_ADDR", configured.store_addr)
        monkeypatch.setenv("GEARSHIFT_POLICY_CLIENT__MODEL", ALIAS)
        monkeypatch.setenv("GEARSHIFT_DATA_DIR", str(tmp_path))
        output = tmp_path / "lora" / "args"

        async def startup_arguments() -> list[str]:
            result = await invoke(output)
            assert result.exit_code == 0, result.output
            return shlex.split(output.read_text())

        assert await startup_arguments() == []  # nothing published yet: the pod's own arguments
        for published in ("apo-1", "apo-2"):
            await stub.UpdateCheckpoint(store_pb2.UpdateCheckpointRequest(id=published, status=CheckpointStatus.CHECKPOINT_STATUS_PUBLISHED))
        assert await startup_arguments() == ["--lora-modules", f"{ALIAS}=/checkpoints/apo-2/adapter"]
        await stub.UpdateCheckpoint(store_pb2.UpdateCheckpointRequest(id="apo-3", status=CheckpointStatus.CHECKPOINT_STATUS_PUBLISHED))
        assert await startup_arguments() == []  # the newest is full weights: a rolling publish's --model serves it

    result = await invoke(output)  # the store is gone
    assert result.exit_code == 1 and "cannot reach the store" in result.output and "Traceback" not in result.output
