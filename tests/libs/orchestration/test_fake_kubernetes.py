"""The fake Kubernetes API (tests/fake_kubernetes.py) as the real kubernetes client sees it: objects
round-trip, a taken name is a 409 Status, labels select, logs are bounded, deletes cascade, lists
and watches answer as a real API server's do, a stale resourceVersion is a 409 Conflict."""

from __future__ import annotations

import json
import threading

import pytest
import urllib3
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from tests.fake_kubernetes import condition


def job(name: str, labels: dict | None = None) -> client.V1Job:
    container = client.V1Container(name="train", image="busybox", command=["true"])
    pod = client.V1PodTemplateSpec(spec=client.V1PodSpec(containers=[container], restart_policy="Never"))
    return client.V1Job(api_version="batch/v1", kind="Job", metadata=client.V1ObjectMeta(name=name, labels=labels),
                        spec=client.V1JobSpec(template=pod))


def test_objects_round_trip_with_uid_timestamp_and_version(fake_kube):
    core = client.CoreV1Api(fake_kube.api_client)
    created = core.create_namespaced_config_map("ns", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="c"), data={"a": "1"}))
    assert created.metadata.uid and created.metadata.creation_timestamp and created.metadata.resource_version
    read = core.read_namespaced_config_map("c", "ns")
    assert read.data == {"a": "1"} and read.metadata.uid == created.metadata.uid and read.metadata.namespace == "ns"
    batch = client.BatchV1Api(fake_kube.api_client)
    batch.create_namespaced_job("ns", job("j"))
    assert batch.read_namespaced_job("j", "ns").spec.template.spec.containers[0].command == ["true"]
    assert [(r.method, r.kind, r.name) for r in fake_kube.requests] == [
        ("POST", "ConfigMap", "c"), ("GET", "ConfigMap", "c"), ("POST", "Job", "j"), ("GET", "Job", "j")]


def test_a_taken_name_is_a_409_already_exists_status(fake_kube):
    batch = client.BatchV1Api(fake_kube.api_client)
    batch.create_namespaced_job("default", job("j"))
    with pytest.raises(ApiException) as caught:
        batch.create_namespaced_job("default", job("j"))
    assert caught.value.status == 409 and '"reason": "AlreadyExists"' in caught.value.body
    with pytest.raises(ApiException) as missing:
        batch.read_namespaced_job("nope", "default")
    assert missing.value.status == 404


def test_label_selectors_match_by_equality(fake_kube):
    batch = client.BatchV1Api(fake_kube.api_client)
    batch.create_namespaced_job("default", job("a", {"team": "x", "tier": "1"}))
    batch.create_namespaced_job("default", job("b", {"team": "x", "tier": "2"}))
    batch.create_namespaced_job("other", job("c", {"team": "x", "tier": "1"}))

    def names(selector: str) -> list[str]:
        return [j.metadata.name for j in batch.list_namespaced_job("default", label_selector=selector).items]

    assert names("team=x") == ["a", "b"]
    assert names("team=x,tier=2") == ["b"]
    assert names("tier!=2") == ["a"] and names("!team") == [] and names("") == ["a", "b"]
    assert [j.metadata.name for j in batch.list_job_for_all_namespaces(label_selector="tier==1").items] == ["a", "c"]
    fake_kube.add_pod("a", index=0)
    pods = client.CoreV1Api(fake_kube.api_client).list_namespaced_pod("default", label_selector="job-name=a").items
    assert len(pods) == 1 and pods[0].metadata.owner_references[0].name == "a"


def test_status_set_by_the_controller_hook_reads_through_the_status_subresource(fake_kube):
    batch = client.BatchV1Api(fake_kube.api_client)
    batch.create_namespaced_job("default", job("j"))
    fake_kube.set_status("jobs", "j", failed=2, conditions=[condition("Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit")])
    status = batch.read_namespaced_job_status("j", "default").status
    assert status.failed == 2 and status.conditions[0].reason == "BackoffLimitExceeded"


def test_pod_logs_honour_tail_lines_and_limit_bytes(fake_kube):
    client.BatchV1Api(fake_kube.api_client).create_namespaced_job("default", job("j"))
    pod = fake_kube.add_pod("j", log="".join(f"line {i}\n" for i in range(10)))["metadata"]["name"]
    core = client.CoreV1Api(fake_kube.api_client)

    def log(**bounds) -> str:
        # Read raw: client 36 answers a response type "str" with str(bytes), "b'...'".
        return core.read_namespaced_pod_log(pod, "default", _preload_content=False, **bounds).data.decode()

    assert log(tail_lines=2) == "line 8\nline 9\n"
    assert log(tail_lines=2, limit_bytes=4) == "line"
    waiting = fake_kube.add_pod("j", index=1, log=None)["metadata"]["name"]
    with pytest.raises(ApiException) as caught:
        core.read_namespaced_pod_log(waiting, "default")
    assert caught.value.status == 400


def test_delete_records_propagation_and_takes_owned_objects_along(fake_kube):
    batch, core = client.BatchV1Api(fake_kube.api_client), client.CoreV1Api(fake_kube.api_client)
    created = batch.create_namespaced_job("default", job("j"))
    owner = client.V1OwnerReference(api_version="batch/v1", kind="Job", name="j", uid=created.metadata.uid)
    core.create_namespaced_config_map("default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="j-config", owner_references=[owner])))
    core.create_namespaced_config_map("default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="unowned")))
    fake_kube.add_pod("j")
    batch.delete_namespaced_job("j", "default", propagation_policy="Foreground")
    assert fake_kube.deletions == [("Job", "j", "Foreground")]
    assert [c.metadata.name for c in core.list_namespaced_config_map("default").items] == ["unowned"]
    assert core.list_namespaced_pod("default").items == []


def test_trainjobs_through_custom_objects_with_pods_labelled_by_jobset(fake_kube):
    custom = client.CustomObjectsApi(fake_kube.api_client)
    body = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "t"},
            "spec": {"runtimeRef": {"name": "torch-distributed"}}, "status": {"ignored": True}}
    created = custom.create_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", "default", "trainjobs", body)
    assert created["status"] == {} and created["metadata"]["uid"]
    fake_kube.set_status("trainjobs", "t", conditions=[condition("Complete", "JobsCompleted")])
    read = custom.get_namespaced_custom_object_status("trainer.kubeflow.org", "v1alpha1", "default", "trainjobs", "t")
    assert read["status"]["conditions"][0]["type"] == "Complete"
    fake_kube.add_pod("t", index=1, trainjob=True)
    (pod,) = client.CoreV1Api(fake_kube.api_client).list_namespaced_pod("default", label_selector="jobset.sigs.k8s.io/jobset-name=t").items
    assert pod.metadata.labels["batch.kubernetes.io/job-completion-index"] == "1"
    custom.delete_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", "default", "trainjobs", "t", propagation_policy="Foreground")
    assert fake_kube.deletions == [("TrainJob", "t", "Foreground")] and fake_kube.list("pods") == []


def test_a_deployment_patch_merges_containers_by_name_and_bumps_the_generation(fake_kube):
    apps = client.AppsV1Api(fake_kube.api_client)
    containers = [client.V1Container(name="policy", image="p", args=["--model", "a"]), client.V1Container(name="side", image="s")]
    deployment = client.V1Deployment(
        metadata=client.V1ObjectMeta(name="d"),
        spec=client.V1DeploymentSpec(selector=client.V1LabelSelector(match_labels={"app": "d"}), template=client.V1PodTemplateSpec(
            metadata=client.V1ObjectMeta(labels={"app": "d"}), spec=client.V1PodSpec(containers=containers))))
    apps.create_namespaced_deployment("default", deployment)
    patched = apps.patch_namespaced_deployment("d", "default", {"spec": {"template": {
        "metadata": {"annotations": {"x": "1"}}, "spec": {"containers": [{"name": "policy", "args": ["--model", "b"]}]}}}})
    assert patched.metadata.generation == 2 and patched.spec.template.metadata.annotations == {"x": "1"}
    assert [(c.name, c.args) for c in patched.spec.template.spec.containers] == [("policy", ["--model", "b"]), ("side", None)]
    fake_kube.set_status("deployments", "d", observedGeneration=2, updatedReplicas=1)
    assert apps.read_namespaced_deployment_status("d", "default").status.observed_generation == 2
    json_patched = apps.patch_namespaced_deployment("d", "default", [{"op": "replace", "path": "/spec/replicas", "value": 3}])
    assert json_patched.spec.replicas == 3 and json_patched.metadata.generation == 3


def test_endpoint_slices_of_a_service(fake_kube):
    fake_kube.add_endpoint_slice("policy", [("10.0.0.1", True), ("10.0.0.2", False)])
    (slice_,) = client.DiscoveryV1Api(fake_kube.api_client).list_namespaced_endpoint_slice(
        "default", label_selector="kubernetes.io/service-name=policy").items
    assert [(e.addresses, e.conditions.ready) for e in slice_.endpoints] == [(["10.0.0.1"], True), (["10.0.0.2"], False)]
    assert slice_.ports[0].port == 8000


def test_an_injected_failure_fails_once_and_unknown_routes_are_404(fake_kube):
    core = client.CoreV1Api(fake_kube.api_client)
    fake_kube.fail_next("POST", "ConfigMap", code=503)
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_config_map("default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="c")))
    assert caught.value.status == 503
    core.create_namespaced_config_map("default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="c")))
    fake_kube.fail_next("POST", "ConfigMap", code=None)  # dropped: POST is not retried by urllib3
    with pytest.raises(urllib3.exceptions.HTTPError):
        core.create_namespaced_config_map("default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="d")))
    with pytest.raises(ApiException) as unknown:
        core.list_namespaced_secret("default")
    assert unknown.value.status == 404 and '"kind": "Status"' in unknown.value.body


def test_a_built_in_kinds_list_leaves_apiversion_and_kind_off_its_items_a_crds_keeps_them(fake_kube):
    """As a real API server lists: a JobList names its kind once; custom resources stay whole."""
    custom = client.CustomObjectsApi(fake_kube.api_client)
    created = client.BatchV1Api(fake_kube.api_client).create_namespaced_job("default", job("j"))
    custom.create_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", "default", "trainjobs",
                                           {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "t"}})
    jobs = custom.list_namespaced_custom_object("batch", "v1", "default", "jobs")
    (item,) = jobs["items"]
    assert (jobs["apiVersion"], jobs["kind"]) == ("batch/v1", "JobList") and "apiVersion" not in item and "kind" not in item
    assert item["metadata"]["uid"] == created.metadata.uid
    (trainjob,) = custom.list_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", "default", "trainjobs")["items"]
    assert (trainjob["apiVersion"], trainjob["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
    assert jobs["metadata"]["resourceVersion"] == custom.list_namespaced_custom_object(
        "batch", "v1", "default", "jobs")["metadata"]["resourceVersion"]  # a list changes nothing
    assert custom.get_namespaced_custom_object("batch", "v1", "default", "jobs", "j")["kind"] == "Job"  # one object names it
    (by_name,) = client.BatchV1Api(fake_kube.api_client).list_namespaced_job("default", field_selector="metadata.name=j").items
    assert by_name.metadata.name == "j"


def test_a_write_from_a_stale_resource_version_is_a_409_conflict(fake_kube):
    core = client.CoreV1Api(fake_kube.api_client)
    core.create_namespaced_config_map("default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="c"), data={"a": "1"}))
    read = core.read_namespaced_config_map("c", "default")
    core.patch_namespaced_config_map("c", "default", {"data": {"a": "2"}})  # someone else, meanwhile
    stale = read.metadata.resource_version
    writes = {
        "put": lambda: core.replace_namespaced_config_map("c", "default", read),
        "patch": lambda: core.patch_namespaced_config_map("c", "default", {"metadata": {"resourceVersion": stale}, "data": {"a": "3"}}),
        "delete": lambda: core.delete_namespaced_config_map(
            "c", "default", body=client.V1DeleteOptions(preconditions=client.V1Preconditions(resource_version=stale))),
    }
    for write in writes.values():
        with pytest.raises(ApiException) as caught:
            write()
        assert caught.value.status == 409 and '"reason": "Conflict"' in caught.value.body
    assert core.read_namespaced_config_map("c", "default").data == {"a": "2"}
    fresh = core.read_namespaced_config_map("c", "default")
    fresh.data = {"a": "4"}
    assert core.replace_namespaced_config_map("c", "default", fresh).data == {"a": "4"}  # re-read, retried: it holds


def test_a_watch_streams_the_changes_after_a_resource_version_through_its_selectors(fake_kube):
    batch = client.BatchV1Api(fake_kube.api_client)
    batch.create_namespaced_job("default", job("before", {"run": "x"}))
    since = batch.list_namespaced_job("default", label_selector="run=x").metadata.resource_version

    def controller() -> None:
        batch.create_namespaced_job("default", job("j", {"run": "x"}))
        batch.create_namespaced_job("default", job("other", {"run": "y"}))
        fake_kube.set_status("jobs", "j", conditions=[condition("Complete", "Completed")])
        batch.patch_namespaced_job("before", "default", {"metadata": {"labels": {"run": "y"}}})  # leaves the selection
        batch.delete_namespaced_job("j", "default")

    thread = threading.Thread(target=controller)
    thread.start()
    events = []
    for event in watch.Watch().stream(batch.list_namespaced_job, "default", label_selector="run=x", resource_version=since, timeout_seconds=5):
        events.append((event["type"], event["object"].metadata.name, event["raw_object"]["kind"]))
        if len(events) == 4:
            break
    thread.join()
    assert events == [("ADDED", "j", "Job"), ("MODIFIED", "j", "Job"), ("DELETED", "before", "Job"), ("DELETED", "j", "Job")]
    started = [(e["type"], e["object"].metadata.name) for e in watch.Watch().stream(batch.list_namespaced_job, "default", timeout_seconds=1)]
    assert started == [("ADDED", "before"), ("ADDED", "other")]  # no resourceVersion: what is there now, then changes


def test_a_watch_from_a_compacted_resource_version_gets_a_410_expired_event(fake_kube):
    """As the API server's watch cache answers: 200, then one ERROR event with a 410 Status, and the
    stream ends; the client raises it, and a new list gives a resourceVersion to watch from."""
    batch = client.BatchV1Api(fake_kube.api_client)
    batch.create_namespaced_job("default", job("j"))
    since = batch.list_namespaced_job("default").metadata.resource_version
    fake_kube.set_status("jobs", "j", active=1)
    fake_kube.compact()
    raw = batch.list_namespaced_job("default", watch=True, resource_version=since, _preload_content=False)
    assert raw.status == 200
    (line,) = raw.data.decode().splitlines()
    error = json.loads(line)
    assert error["type"] == "ERROR" and (error["object"]["code"], error["object"]["reason"]) == (410, "Expired")
    with pytest.raises(ApiException) as caught:
        list(watch.Watch().stream(batch.list_namespaced_job, "default", resource_version=since))  # its one retry expires too
    assert caught.value.status == 410
    relisted = batch.list_namespaced_job("default").metadata.resource_version
    later_ = threading.Timer(0.2, lambda: fake_kube.set_status("jobs", "j", succeeded=1))
    later_.start()
    event = next(watch.Watch().stream(batch.list_namespaced_job, "default", resource_version=relisted, timeout_seconds=5))
    assert (event["type"], event["object"].status.succeeded) == ("MODIFIED", 1)
