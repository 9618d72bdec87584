"""Publishing a checkpoint: the serving side switches to it, chosen by settings:

- builtin: POST /v1/load on the built-in policy server. The server loads the new weights next
  to the old ones and swaps them atomically; generations in flight finish on the old weights,
  so no request is dropped. The switch time is measured here, end to end.
- vllm_lora: vLLM's runtime LoRA loading (POST /v1/load_lora_adapter; the server needs
  VLLM_ALLOW_RUNTIME_LORA_UPDATING=True). The adapter is then served under the checkpoint id.
- deployment: a rolling restart of the policy Deployment with the new weights (vLLM's --model
  argument, or the built-in server's GEARSHIFT_POLICY_SERVER__MODEL), through the Kubernetes API.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from gearshift.api.common.v1.common_pb2 import Checkpoint
from gearshift.errors import FailedPrecondition, InvalidArgument
from gearshift.policy_client import PolicyClient
from gearshift.settings import Settings

CHECKPOINT_ANNOTATION = "gearshift.io/checkpoint"


@dataclass
class PublishReport:
    """What publishing did and how long the switch took (seconds, measured by the caller)."""

    target: str
    checkpoint_id: str
    switch_seconds: float
    details: dict = field(default_factory=dict)


async def publish_builtin(checkpoint: Checkpoint, settings: Settings) -> PublishReport:
    """POST /v1/load with the checkpoint directory; the report carries the server's own split
    of the time (load vs swap) next to the end-to-end figure."""
    admin = settings.policy_server.admin_token.get_secret_value() if settings.policy_server.admin_token else None
    started = time.perf_counter()
    async with PolicyClient.from_settings(settings) as client:
        report = await client.load(checkpoint.uri, admin_token=admin)
    return PublishReport("builtin", checkpoint.id, time.perf_counter() - started, report)


async def publish_vllm_lora(checkpoint: Checkpoint, settings: Settings) -> PublishReport:
    """Loads the checkpoint's LoRA adapter into a running vLLM under the checkpoint id."""
    client = settings.policy_client.model_copy(update={"timeout_seconds": settings.orchestration.publish_timeout_seconds})
    started = time.perf_counter()
    async with PolicyClient.from_settings(settings.model_copy(update={"policy_client": client})) as policy:
        try:
            await policy.load_lora_adapter(checkpoint.id, checkpoint.uri)
        except InvalidArgument as exc:
            raise FailedPrecondition(f"vLLM refused the adapter {checkpoint.uri}: {exc}") from None
    return PublishReport("vllm_lora", checkpoint.id, time.perf_counter() - started, {"served_model_name": checkpoint.id})


def deployment_patch(deployment: dict, container_name: str, checkpoint: Checkpoint) -> dict:
    """A strategic-merge patch that points the policy container at the checkpoint: vLLM's
    `--model` argument when it has one, else the built-in server's GEARSHIFT_POLICY_SERVER__MODEL, and
    an annotation with the checkpoint id so the pod template changes (a rolling restart)."""
    pod = deployment["spec"]["template"]
    container = next(c for c in pod["spec"]["containers"] if c["name"] == container_name)
    change: dict = {"name": container_name}
    args = list(container.get("args") or [])
    if "--model" in args:
        args[args.index("--model") + 1] = checkpoint.uri
        change["args"] = args
    else:
        change["env"] = [{"name": "GEARSHIFT_POLICY_SERVER__MODEL", "value": checkpoint.uri}]
    return {
        "spec": {
            "template": {
                "metadata": {"annotations": {CHECKPOINT_ANNOTATION: checkpoint.id}},
                "spec": {"containers": [change]},
            }
        }
    }


def publish_deployment(checkpoint: Checkpoint, settings: Settings, api_client=None) -> PublishReport:
    """Patches the policy Deployment and waits for the rollout to finish."""
    from kubernetes import client

    from gearshift.orchestration.runners import kube_api_client

    apps = client.AppsV1Api(api_client or kube_api_client())
    k8s = settings.kubernetes
    started = time.perf_counter()
    current = api_client.sanitize_for_serialization(apps.read_namespaced_deployment(k8s.policy_deployment, k8s.namespace))
    patched = apps.patch_namespaced_deployment(k8s.policy_deployment, k8s.namespace, deployment_patch(current, k8s.policy_container, checkpoint))
    generation = patched.metadata.generation
    deadline = time.monotonic() + settings.orchestration.publish_timeout_seconds
    while time.monotonic() < deadline:
        status = apps.read_namespaced_deployment_status(k8s.policy_deployment, k8s.namespace).status
        replicas = patched.spec.replicas or 1
        if (status.observed_generation or 0) >= generation and (status.updated_replicas or 0) >= replicas and (status.available_replicas or 0) >= replicas:
            return PublishReport("deployment", checkpoint.id, time.perf_counter() - started, {"generation": generation})
        time.sleep(k8s.poll_seconds)
    raise FailedPrecondition(f"rollout of {k8s.policy_deployment} did not finish in {settings.orchestration.publish_timeout_seconds:.0f} s")


def publish(checkpoint: Checkpoint, settings: Settings) -> PublishReport:
    """Makes serving use the checkpoint, the way settings.orchestration.publish_target says."""
    target = settings.orchestration.publish_target
    if target == "builtin":
        return asyncio.run(publish_builtin(checkpoint, settings))
    if target == "vllm_lora":
        return asyncio.run(publish_vllm_lora(checkpoint, settings))
    return publish_deployment(checkpoint, settings)
