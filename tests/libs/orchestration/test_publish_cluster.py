"""Publishing on a cluster, against the fake Kubernetes API over HTTP: the rolling restart with
the client a worker pod would build for itself (a kubeconfig here), waiting for the rollout as
kubectl does; finding the policy's ready pods from the Service's EndpointSlices."""

from __future__ import annotations

import asyncio

import pytest
from gearshift.api.common.v1.common_pb2 import Checkpoint
from gearshift.errors import FailedPrecondition
from gearshift.orchestration.journal import LeaseLost
from gearshift.orchestration.publishing import (CHECKPOINT_ANNOTATION, FENCE_ANNOTATION, Fence, deployment_patch, policy_replicas,
                                                publish_deployment)
from gearshift.orchestration.runners import kube_api_client
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from gearshift.settings import KubernetesSettings, OrchestrationSettings, PolicyClientSettings, Settings

CHECKPOINT = Checkpoint(id="apo-7", uri="/checkpoints/apo-7")
VLLM_ARGS = ["--model", "/models/base", "--served-model-name", "default"]


def settings(timeout: float = 30.0, **kubernetes) -> Settings:
    return Settings(
        kubernetes=KubernetesSettings(namespace="serving", poll_seconds=0.02, **kubernetes),
        orchestration=OrchestrationSettings(publish_timeout_seconds=timeout),
        policy_client=PolicyClientSettings(url="http://gearshift-policy:8000/v1", model="default"),
    )


def policy_deployment(fake_kube, replicas: int = 2) -> None:
    container = {"name": "policy", "image": "vllm", "args": VLLM_ARGS}
    fake_kube.create("deployments", "serving", {
        "metadata": {"name": "gearshift-policy"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "policy"}},
                 "template": {"metadata": {"labels": {"app": "policy"}}, "spec": {"containers": [container]}}},
    })
    fake_kube.set_status("deployments", "gearshift-policy", "serving", observedGeneration=1, replicas=replicas,
                         updatedReplicas=replicas, availableReplicas=replicas)


async def roll_out(fake_kube, old_pods_linger: bool) -> None:
    """Plays the Deployment controller: once the template changes, new pods come up; the old
    ones leave only after draining (a while with old_pods_linger)."""
    for _ in range(1000):
        if fake_kube.get("deployments", "serving", "gearshift-policy")["metadata"]["generation"] >= 2:
            break
        await asyncio.sleep(0.01)
    fake_kube.set_status("deployments", "gearshift-policy", "serving", observedGeneration=2, replicas=4,
                         updatedReplicas=2, availableReplicas=4)
    if old_pods_linger:
        await asyncio.sleep(0.3)
    fake_kube.set_status("deployments", "gearshift-policy", "serving", replicas=2, availableReplicas=2)


async def test_a_rolling_publish_with_the_default_client_waits_until_no_old_pod_is_left(fake_kube, kubeconfig):
    policy_deployment(fake_kube)
    report, _ = await asyncio.gather(asyncio.to_thread(publish_deployment, CHECKPOINT, settings()),
                                     roll_out(fake_kube, old_pods_linger=True))
    assert report.target == "deployment" and report.details == {"generation": 2}
    assert report.switch_seconds >= 0.3  # the old pods were still draining before that
    template = fake_kube.get("deployments", "serving", "gearshift-policy")["spec"]["template"]
    assert template["metadata"]["annotations"] == {CHECKPOINT_ANNOTATION: "apo-7"}
    (container,) = template["spec"]["containers"]
    assert container["args"] == ["--model", "/checkpoints/apo-7", "--served-model-name", "default"]


async def test_a_rollout_that_never_finishes_fails_the_publish_naming_the_deployment(fake_kube, kubeconfig):
    policy_deployment(fake_kube)
    with pytest.raises(FailedPrecondition, match="rollout of gearshift-policy did not finish in 0 s"):
        await asyncio.to_thread(publish_deployment, CHECKPOINT, settings(timeout=0.2))


async def test_a_copy_that_lost_its_lease_cannot_roll_serving_back_after_the_holder_published(fake_kube, kubeconfig):
    """The holder (attempt 2 of the publish) publishes apo-7; the copy taken for dead (attempt 1)
    wakes up to publish an older checkpoint: the Deployment's fence refuses it, nothing changes."""
    policy_deployment(fake_kube)
    await asyncio.gather(asyncio.to_thread(publish_deployment, CHECKPOINT, settings(), fence=Fence("publish:apo-7", 2)),
                         roll_out(fake_kube, old_pods_linger=False))
    published = fake_kube.get("deployments", "serving", "gearshift-policy")
    assert published["metadata"]["annotations"][FENCE_ANNOTATION] == "publish:apo-7 2"
    older = Checkpoint(id="apo-6", uri="/checkpoints/apo-6")
    with pytest.raises(LeaseLost, match="lease on publish:apo-7 lost: attempt 1 no longer holds it; now attempt 2"):
        await asyncio.to_thread(publish_deployment, older, settings(timeout=0.2), fence=Fence("publish:apo-7", 1))
    assert fake_kube.get("deployments", "serving", "gearshift-policy") == published
    Fence("publish:apo-6", 1).check(published["metadata"]["annotations"])  # another key's publish (a rollback) is not fenced by it


def test_a_patch_made_from_a_stale_read_is_refused_by_the_api_server(fake_kube, kubeconfig):
    """What keeps two publishes from interleaving: the patch names the resourceVersion it read."""
    policy_deployment(fake_kube)
    api_client = kube_api_client()
    apps = client.AppsV1Api(api_client)
    stale = api_client.sanitize_for_serialization(apps.read_namespaced_deployment("gearshift-policy", "serving"))
    apps.patch_namespaced_deployment("gearshift-policy", "serving", {"metadata": {"labels": {"touched": "yes"}}})
    with pytest.raises(ApiException) as refused:
        apps.patch_namespaced_deployment("gearshift-policy", "serving", deployment_patch(stale, "policy", CHECKPOINT))
    assert refused.value.status == 409
    assert CHECKPOINT_ANNOTATION not in (fake_kube.get("deployments", "serving", "gearshift-policy")["spec"]["template"]["metadata"]
                                         .get("annotations") or {})


def test_the_ready_policy_pods_come_from_the_services_endpoint_slices(fake_kube, kubeconfig):
    fake_kube.add_endpoint_slice("gearshift-policy", [("10.0.0.7", True), ("10.0.0.8", False)], namespace="serving")
    fake_kube.add_endpoint_slice("gearshift-policy", [("fd00::9", True)], ports=[{"name": "metrics", "port": 9000},
                                                                                  {"name": "http", "port": 8001}],
                                 namespace="serving")
    fake_kube.add_endpoint_slice("gearshift-router", [("10.0.0.20", True)], namespace="serving")
    replicas = policy_replicas(settings(policy_service="gearshift-policy"))
    assert [r.url for r in replicas] == ["http://10.0.0.7:8000/v1", "http://[fd00::9]:8001/v1"]


def test_no_ready_policy_pod_is_a_clear_error_and_without_a_service_the_policy_url_is_used(fake_kube, kubeconfig):
    fake_kube.add_endpoint_slice("gearshift-policy", [("10.0.0.8", False)], namespace="serving")
    with pytest.raises(FailedPrecondition, match="no ready pod behind the Service serving/gearshift-policy"):
        policy_replicas(settings(policy_service="gearshift-policy"))
    assert [r.url for r in policy_replicas(settings())] == ["http://gearshift-policy:8000/v1"]
