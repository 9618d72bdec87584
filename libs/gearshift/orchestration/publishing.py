"""Publishing a checkpoint: the serving side switches to it, chosen by settings:

- builtin: POST /v1/load on the built-in policy server. The server loads the new weights next
  to the old ones and swaps them atomically; generations in flight finish on the old weights,
  so no request is dropped. The switch time is measured here, end to end.
- vllm_lora: vLLM's runtime LoRA loading (POST /v1/load_lora_adapter; the server needs
  VLLM_ALLOW_RUNTIME_LORA_UPDATING=True), on every ready pod of the policy Service (its
  EndpointSlices) when kubernetes.policy_service is set, else on the one policy URL. The
  adapter replaces, in place, the adapter served under the name the platform asks for
  (policy_client.model), so executors need no change; a pod that starts later gets it from
  `gearshift publish-startup-adapters` (its --lora-modules). vLLM swaps an in-place adapter
  between two engine steps: a generation in flight continues on the new adapter.
- deployment: a rolling restart of the policy Deployment with the new weights (vLLM's --model
  argument, or the built-in server's GEARSHIFT_POLICY_SERVER__MODEL), through the Kubernetes API.
  The write is fenced: it names the resourceVersion it read (a change in between is a 409, and the
  publish reads again) and the lease it is made under, so a copy of the publish task that lost
  its lease cannot roll serving back after the copy holding it published.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from gearshift.api.common.v1.common_pb2 import Checkpoint
from gearshift.errors import FailedPrecondition
from gearshift.orchestration.checkpoint_registry import published
from gearshift.orchestration.journal import LeaseLost
from gearshift.policy_client import PolicyClient
from gearshift.settings import Settings
from gearshift.training.results import ADAPTER_DIR

CHECKPOINT_ANNOTATION = "gearshift.io/checkpoint"
FENCE_ANNOTATION = "gearshift.io/publish-fence"  # on the Deployment: the lease of its last publish
CONFLICT_RETRIES = 5  # reads of a Deployment that others keep changing (a 409 each) before giving up


@dataclass(frozen=True)
class Fence:
    """The journal lease a publish is made under: its key and the attempt that holds it (each
    lease taken over counts one more)."""

    key: str
    attempt: int

    def __str__(self) -> str:
        return f"{self.key} {self.attempt}"

    def check(self, annotations: dict, owner: str = "") -> None:
        """LeaseLost when the target was last published under a later attempt of this key."""
        key, _, attempt = (annotations.get(FENCE_ANNOTATION) or "").rpartition(" ")
        if key == self.key and attempt.isdigit() and int(attempt) > self.attempt:
            raise LeaseLost(self.key, owner or f"attempt {self.attempt}", f"attempt {attempt}, which published")


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


def is_lora(checkpoint: Checkpoint) -> bool:
    """Whether the checkpoint is a LoRA run's (its registered config says so: the worker that
    publishes need not see the checkpoints volume)."""
    try:
        return bool(json.loads(checkpoint.config_json or "{}").get("model", {}).get("lora"))
    except (ValueError, AttributeError):
        return False


def adapter_path(checkpoint: Checkpoint) -> str:
    """Where a LoRA checkpoint's adapter lives, as the policy pods see the checkpoints volume."""
    return f"{checkpoint.uri.rstrip('/')}/{ADAPTER_DIR}"


@dataclass
class Replica:
    """One pod serving the policy: its name (for reports and errors) and its base URL."""

    pod: str
    url: str


def policy_replicas(settings: Settings, api_client=None) -> list[Replica]:
    """Every ready pod behind the policy Service, read from its EndpointSlices, each with the
    policy URL's scheme and path; without kubernetes.policy_service, the policy URL itself."""
    k8s = settings.kubernetes
    base = urlsplit(settings.policy_client.url)
    if not k8s.policy_service:
        return [Replica(base.hostname or "policy", settings.policy_client.url)]
    from kubernetes import client

    from gearshift.orchestration.runners import kube_api_client

    discovery = client.DiscoveryV1Api(api_client or kube_api_client())
    slices = discovery.list_namespaced_endpoint_slice(k8s.namespace, label_selector=f"kubernetes.io/service-name={k8s.policy_service}").items
    replicas = {}
    for endpoint_slice in slices:
        port = _serving_port(endpoint_slice.ports or [])
        for endpoint in endpoint_slice.endpoints or []:
            ready = endpoint.conditions.ready if endpoint.conditions else None
            if ready is False or not endpoint.addresses:  # unset means ready (the API's rule)
                continue
            host = endpoint.addresses[0]
            if ipaddress.ip_address(host).version == 6:
                host = f"[{host}]"
            pod = endpoint.target_ref.name if endpoint.target_ref else f"{host}:{port}"
            replicas[pod] = Replica(pod, f"{base.scheme}://{host}:{port}{base.path}")
    if not replicas:
        raise FailedPrecondition(f"no ready pod behind the Service {k8s.namespace}/{k8s.policy_service}")
    return sorted(replicas.values(), key=lambda replica: replica.pod)


def _serving_port(ports: list) -> int:
    """The slice's port the policy is served on: the only one, or the one named http."""
    if len(ports) == 1:
        return ports[0].port
    named = [p.port for p in ports if p.name == "http"]
    if named:
        return named[0]
    raise FailedPrecondition(f"cannot tell the policy's port among {[p.port for p in ports]} (name it http)")


async def publish_vllm_lora(checkpoint: Checkpoint, settings: Settings, api_client=None) -> PublishReport:
    """Loads the checkpoint's adapter on every ready policy pod at once, in place under the name
    executors ask for; the report has each pod's time. Any pod refusing fails the publish,
    naming the pods (the others keep what they loaded: publishing again converges them)."""
    if not is_lora(checkpoint):
        raise FailedPrecondition(f"{checkpoint.id} holds full weights, not a LoRA adapter: publish it with the deployment target")
    name, path = settings.policy_client.model, adapter_path(checkpoint)
    replicas = await asyncio.to_thread(policy_replicas, settings, api_client)
    admin = settings.policy_client.model_copy(update={"timeout_seconds": settings.orchestration.publish_timeout_seconds, "retries": 0})
    started = time.perf_counter()

    async def load(replica: Replica) -> float:
        begun = time.perf_counter()
        async with PolicyClient.from_settings(settings.model_copy(update={"policy_client": admin}).with_policy(replica.url)) as policy:
            await policy.load_lora_adapter(name, path, in_place=True)
        return time.perf_counter() - begun

    outcomes = await asyncio.gather(*(load(replica) for replica in replicas), return_exceptions=True)
    refused = {r.pod: o for r, o in zip(replicas, outcomes, strict=True) if isinstance(o, BaseException)}
    if refused:
        reasons = "; ".join(f"{pod}: {exc}" for pod, exc in refused.items())
        raise FailedPrecondition(f"{len(refused)} of {len(replicas)} policy pods refused the adapter {path}: {reasons}")
    seconds = {r.pod: round(o, 3) for r, o in zip(replicas, outcomes, strict=True)}
    return PublishReport("vllm_lora", checkpoint.id, time.perf_counter() - started,
                         {"served_model_name": name, "adapter": path, "pods": seconds})


async def startup_lora_arguments(settings: Settings) -> list[str]:
    """vLLM arguments that make a policy pod starting now serve the newest published policy
    under the name executors ask for, as pods running when it was published do: its
    --lora-modules, or nothing when that checkpoint has no adapter (or none is published)."""
    newest = await published(settings, "policy")
    if newest is None or not is_lora(newest):
        return []
    return ["--lora-modules", f"{settings.policy_client.model}={adapter_path(newest)}"]


def deployment_patch(deployment: dict, container_name: str, checkpoint: Checkpoint, fence: Fence | None = None) -> dict:
    """A strategic-merge patch that points the policy container at the checkpoint: vLLM's
    `--model` argument when it has one, else the built-in server's GEARSHIFT_POLICY_SERVER__MODEL, and
    an annotation with the checkpoint id so the pod template changes (a rolling restart). It
    holds the resourceVersion read (the API server refuses it with 409 if the Deployment changed
    since) and the fence it is made under."""
    pod = deployment["spec"]["template"]
    container = next(c for c in pod["spec"]["containers"] if c["name"] == container_name)
    change: dict = {"name": container_name}
    args = list(container.get("args") or [])
    if "--model" in args:
        args[args.index("--model") + 1] = checkpoint.uri
        change["args"] = args
    else:
        change["env"] = [{"name": "GEARSHIFT_POLICY_SERVER__MODEL", "value": checkpoint.uri}]
    metadata = {"resourceVersion": deployment["metadata"]["resourceVersion"]}
    if fence is not None:
        metadata["annotations"] = {FENCE_ANNOTATION: str(fence)}
    return {
        "metadata": metadata,
        "spec": {
            "template": {
                "metadata": {"annotations": {CHECKPOINT_ANNOTATION: checkpoint.id}},
                "spec": {"containers": [change]},
            }
        }
    }


def publish_deployment(checkpoint: Checkpoint, settings: Settings, api_client=None, fence: Fence | None = None) -> PublishReport:
    """Patches the policy Deployment (fenced: deployment_patch) and waits for the rollout to
    finish as `kubectl rollout status` does: every replica updated and available, no old one
    left. Old pods drain first (the chart's preStop and terminationGracePeriodSeconds)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from gearshift.orchestration.runners import kube_api_client

    api_client = api_client or kube_api_client()
    apps = client.AppsV1Api(api_client)
    k8s = settings.kubernetes
    started = time.perf_counter()
    for _ in range(CONFLICT_RETRIES):
        current = api_client.sanitize_for_serialization(apps.read_namespaced_deployment(k8s.policy_deployment, k8s.namespace))
        if fence is not None:
            fence.check(current["metadata"].get("annotations") or {})
        try:
            patched = apps.patch_namespaced_deployment(k8s.policy_deployment, k8s.namespace,
                                                       deployment_patch(current, k8s.policy_container, checkpoint, fence))
            break
        except ApiException as error:
            if error.status != 409:
                raise
    else:
        raise FailedPrecondition(f"{k8s.policy_deployment} changed under each of {CONFLICT_RETRIES} publishes of {checkpoint.id}")
    generation, replicas = patched.metadata.generation, patched.spec.replicas or 1
    deadline = time.monotonic() + settings.orchestration.publish_timeout_seconds
    while time.monotonic() < deadline:
        status = apps.read_namespaced_deployment_status(k8s.policy_deployment, k8s.namespace).status
        if (status.observed_generation or 0) >= generation and (status.updated_replicas or 0) >= replicas \
                and (status.available_replicas or 0) >= replicas and (status.replicas or 0) <= replicas:
            return PublishReport("deployment", checkpoint.id, time.perf_counter() - started, {"generation": generation})
        time.sleep(k8s.poll_seconds)
    raise FailedPrecondition(f"rollout of {k8s.policy_deployment} did not finish in {settings.orchestration.publish_timeout_seconds:.0f} s")


def publish(checkpoint: Checkpoint, settings: Settings, fence: Fence | None = None) -> PublishReport:
    """Makes serving use the checkpoint, the way settings.orchestration.publish_target says (the
    deployment target fenced by the lease it is made under)."""
    target = settings.orchestration.publish_target
    if target == "builtin":
        return asyncio.run(publish_builtin(checkpoint, settings))
    if target == "vllm_lora":
        return asyncio.run(publish_vllm_lora(checkpoint, settings))
    return publish_deployment(checkpoint, settings, fence=fence)
