"""KubernetesRunner against the fake Kubernetes API over HTTP, through the real kubernetes client
(nothing mocked): what it creates and in which order, how each ending is read, what a timeout,
a retry, a redelivery and a crash between two creations do, and the logs it collects. The tests
play the Job and TrainJob controllers through the fake's hooks."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import yaml
from gearshift.orchestration.runners import KubernetesRunner
from gearshift.orchestration.training_run import RunSpec
from gearshift.settings import KubernetesSettings
from gearshift.training.results import write_result

from tests.fake_kubernetes import condition

NAMESPACE = "train"
PLURAL = {"job": "jobs", "trainjob": "trainjobs"}
KIND = {"job": "Job", "trainjob": "TrainJob"}
LAUNCHERS = ("job", "trainjob")


def make_spec(tmp_path: Path, name: str = "gearshift-sft-0123abcd") -> RunSpec:
    output = tmp_path / name
    output.mkdir(parents=True, exist_ok=True)
    return RunSpec(name=name, job="sft", config={"optim": {"max_steps": 2}, "output": {"dir": str(output)}}, output_dir=output)


def make_runner(fake_kube, launcher: str = "job", **settings) -> KubernetesRunner:
    settings = KubernetesSettings(namespace=NAMESPACE, launcher=launcher, poll_seconds=0.05, **settings)
    return KubernetesRunner(settings, fake_kube.api_client)


def later(seconds: float, action) -> threading.Timer:
    """The controller acting while the runner waits."""
    timer = threading.Timer(seconds, action)
    timer.start()
    return timer


def no_heartbeat(_log: str) -> None:
    pass


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_the_config_map_comes_first_then_the_run_then_its_ownership(fake_kube, tmp_path, launcher):
    spec = make_spec(tmp_path)
    name = make_runner(fake_kube, launcher).start(spec)
    assert name == spec.name
    writes = [(r.method, r.kind, r.name) for r in fake_kube.requests if r.method != "GET"]
    assert writes == [("POST", "ConfigMap", f"{name}-config"), ("POST", KIND[launcher], name), ("PATCH", "ConfigMap", f"{name}-config")]
    run = fake_kube.get(PLURAL[launcher], NAMESPACE, name)
    (owner,) = fake_kube.get("configmaps", NAMESPACE, f"{name}-config")["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == (KIND[launcher], name, run["metadata"]["uid"])
    assert run["metadata"]["labels"]["gearshift.io/attempt"] == "1"
    fake_kube.delete(PLURAL[launcher], NAMESPACE, name)
    assert fake_kube.list("configmaps") == []  # owned: it goes with the run


@pytest.mark.parametrize(("launcher", "reason", "message"), [
    ("job", "BackoffLimitExceeded", "Job has reached the specified backoff limit"),
    ("job", "DeadlineExceeded", "Job was active longer than specified deadline"),
    ("trainjob", "JobsFailed", "jobset gearshift-sft-0123abcd failed: node-0 failed"),
])
def test_a_failed_condition_ends_the_wait_at_once_with_its_reason(fake_kube, tmp_path, launcher, reason, message):
    spec = make_spec(tmp_path)
    runner = make_runner(fake_kube, launcher)
    name = runner.start(spec)
    failed = condition("Failed", reason, message)
    later(0.2, lambda: fake_kube.set_status(PLURAL[launcher], name, NAMESPACE, conditions=[failed]))
    started = time.monotonic()
    outcome = runner.wait(spec, name, no_heartbeat, timeout=30)
    assert time.monotonic() - started < 2  # not the runner's own timeout
    assert not outcome.succeeded and outcome.reason == f"{KIND[launcher]} {name} failed: {reason}: {message}"
    assert fake_kube.deletions == []  # a finished run is left to its TTL, with its pods' logs


def test_a_job_failure_target_counts_before_the_failed_condition(fake_kube, tmp_path):
    spec = make_spec(tmp_path)
    runner = make_runner(fake_kube)
    name = runner.start(spec)
    fake_kube.set_status("jobs", name, NAMESPACE, failed=2, conditions=[condition("FailureTarget", "BackoffLimitExceeded")])
    assert runner.wait(spec, name, no_heartbeat, timeout=30).reason == f"Job {name} failed: BackoffLimitExceeded"


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_success_reads_the_result_the_pod_wrote(fake_kube, tmp_path, launcher):
    spec = make_spec(tmp_path)
    runner = make_runner(fake_kube, launcher)
    name = runner.start(spec)
    fake_kube.add_pod(name, log="step 2 loss 0.5\n", namespace=NAMESPACE, trainjob=launcher == "trainjob")
    beats = []

    def finish() -> None:  # what the training pod and the controller do
        write_result(spec.output_dir, {"checkpoint_id": spec.name, "metrics": {"loss": 0.5}})
        fake_kube.set_status(PLURAL[launcher], name, NAMESPACE, conditions=[condition("Complete", "Completed")])

    later(0.2, finish)
    outcome = runner.wait(spec, name, beats.append, timeout=30)
    assert outcome.succeeded and outcome.result == {"checkpoint_id": spec.name, "metrics": {"loss": 0.5}}
    assert "step 2 loss 0.5" in outcome.log and beats and "step 2" in beats[-1]


def test_a_job_counted_succeeded_without_conditions_is_done(fake_kube, tmp_path):
    spec = make_spec(tmp_path)
    runner = make_runner(fake_kube)
    name = runner.start(spec)
    write_result(spec.output_dir, {"checkpoint_id": "c"})
    fake_kube.set_status("jobs", name, NAMESPACE, succeeded=1)
    assert runner.wait(spec, name, no_heartbeat, timeout=30).result == {"checkpoint_id": "c"}


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_timeout_deletes_the_run_with_foreground_propagation(fake_kube, tmp_path, launcher):
    spec = make_spec(tmp_path)
    runner = make_runner(fake_kube, launcher)
    name = runner.start(spec)
    fake_kube.add_pod(name, namespace=NAMESPACE, trainjob=launcher == "trainjob")
    outcome = runner.wait(spec, name, no_heartbeat, timeout=0.2)
    assert not outcome.succeeded and outcome.reason == f"timed out after 0 s; {KIND[launcher]} {name} deleted"
    assert fake_kube.deletions == [(KIND[launcher], name, "Foreground")]
    assert fake_kube.list("configmaps") == [] and fake_kube.list("pods") == []


def test_cancel_deletes_and_a_second_cancel_is_harmless(fake_kube, tmp_path):
    spec = make_spec(tmp_path)
    runner = make_runner(fake_kube, "trainjob")
    name = runner.start(spec)
    runner.cancel(spec, name)
    runner.cancel(spec, name)
    assert fake_kube.deletions == [("TrainJob", name, "Foreground")]
    assert runner.wait(spec, name, no_heartbeat, timeout=30).reason == f"TrainJob {name} no longer exists"


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_retry_of_a_failed_run_starts_a_new_attempt(fake_kube, tmp_path, launcher):
    spec = make_spec(tmp_path)
    runner = make_runner(fake_kube, launcher)
    first = runner.start(spec)
    fake_kube.set_status(PLURAL[launcher], first, NAMESPACE, conditions=[condition("Failed", "DeadlineExceeded")])
    second = runner.start(spec)
    assert second == f"{spec.name}-a2"
    run = fake_kube.get(PLURAL[launcher], NAMESPACE, second)
    assert run["metadata"]["labels"]["gearshift.io/attempt"] == "2"
    (owner,) = fake_kube.get("configmaps", NAMESPACE, f"{second}-config")["metadata"]["ownerReferences"]
    assert owner["uid"] == run["metadata"]["uid"]
    later(0.1, lambda: fake_kube.set_status(PLURAL[launcher], second, NAMESPACE, conditions=[condition("Complete", "Completed")]))
    assert runner.wait(spec, second, no_heartbeat, timeout=30).succeeded
    fake_kube.set_status(PLURAL[launcher], second, NAMESPACE, conditions=[condition("Failed", "BackoffLimitExceeded")])
    assert runner.start(spec) == f"{spec.name}-a3"  # counted from the newest attempt


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_redelivered_run_still_running_or_done_is_reattached(fake_kube, tmp_path, launcher):
    spec = make_spec(tmp_path)
    runner = make_runner(fake_kube, launcher)
    name = runner.start(spec)
    assert make_runner(fake_kube, launcher).start(spec) == name  # another worker, the run still going
    fake_kube.set_status(PLURAL[launcher], name, NAMESPACE, conditions=[condition("Complete", "Completed")])
    assert runner.start(spec) == name
    assert [r.kind for r in fake_kube.created()] == ["ConfigMap", KIND[launcher]]  # no second copy


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_start_that_died_between_the_two_creations_is_completed(fake_kube, tmp_path, launcher):
    spec = make_spec(tmp_path)
    runner = make_runner(fake_kube, launcher)
    fake_kube.fail_next("POST", KIND[launcher], code=None)  # the connection drops: as a worker dying there
    with pytest.raises(Exception):  # noqa: B017 - whatever the client raises for a dropped connection
        runner.start(spec)
    assert [c["metadata"]["name"] for c in fake_kube.list("configmaps")] == [f"{spec.name}-config"]
    assert fake_kube.list(PLURAL[launcher]) == []
    config_uid = fake_kube.get("configmaps", NAMESPACE, f"{spec.name}-config")["metadata"]["uid"]
    name = runner.start(spec)  # the retry
    assert name == spec.name
    config_map = fake_kube.get("configmaps", NAMESPACE, f"{name}-config")
    assert config_map["metadata"]["uid"] == config_uid  # reused, not replaced
    assert config_map["metadata"]["ownerReferences"][0]["uid"] == fake_kube.get(PLURAL[launcher], NAMESPACE, name)["metadata"]["uid"]


def test_a_start_that_died_before_owning_its_config_map_owns_it_on_reattaching(fake_kube, tmp_path):
    spec = make_spec(tmp_path)
    runner = make_runner(fake_kube)
    fake_kube.fail_next("PATCH", "ConfigMap", code=None)
    with pytest.raises(Exception):  # noqa: B017
        runner.start(spec)
    assert runner.start(spec) == spec.name
    job = fake_kube.get("jobs", NAMESPACE, spec.name)
    assert fake_kube.get("configmaps", NAMESPACE, f"{spec.name}-config")["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_run_listed_as_a_real_api_server_lists_it_is_reattached_and_owns_its_config_map(fake_kube, tmp_path, launcher):
    """A real API server leaves apiVersion and kind off the items of a built-in kind's list (a
    JobList's Jobs; a CRD's list, of TrainJobs, keeps them). Re-attaching after a start that died
    before owning its ConfigMap reads the run from such a list and still names it whole as owner."""
    from kubernetes import client

    spec = make_spec(tmp_path)
    runner = make_runner(fake_kube, launcher)
    fake_kube.fail_next("PATCH", "ConfigMap", code=None)
    with pytest.raises(Exception):  # noqa: B017 - the dropped connection, as a worker dying there
        runner.start(spec)
    listed = client.CustomObjectsApi(fake_kube.api_client).list_namespaced_custom_object(*runner.resource)
    (item,) = listed["items"]
    assert ("apiVersion" in item, "kind" in item) == ((False, False) if launcher == "job" else (True, True))
    assert make_runner(fake_kube, launcher).start(spec) == spec.name
    run = fake_kube.get(PLURAL[launcher], NAMESPACE, spec.name)
    (owner,) = fake_kube.get("configmaps", NAMESPACE, f"{spec.name}-config")["metadata"]["ownerReferences"]
    assert owner == {"apiVersion": run["apiVersion"], "kind": KIND[launcher], "name": spec.name, "uid": run["metadata"]["uid"]}
    assert [r.kind for r in fake_kube.created()] == ["ConfigMap", KIND[launcher]]  # re-attached: nothing created twice


def test_a_config_map_left_owned_by_a_vanished_run_is_replaced(fake_kube, tmp_path):
    """A deleted run's ConfigMap the garbage collector has not removed yet would take the new run's
    config with it: it is replaced, not reused."""
    spec = make_spec(tmp_path)
    stale = {"name": f"{spec.name}-config", "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": spec.name, "uid": "gone"}]}
    fake_kube.create("configmaps", NAMESPACE, {"metadata": stale, "data": {"config.yaml": "old"}})
    name = make_runner(fake_kube).start(spec)
    config_map = fake_kube.get("configmaps", NAMESPACE, f"{name}-config")
    assert config_map["metadata"]["ownerReferences"][0]["uid"] == fake_kube.get("jobs", NAMESPACE, name)["metadata"]["uid"]
    assert "max_steps: 2" in config_map["data"]["config.yaml"]


def test_the_api_dropping_for_a_moment_does_not_end_the_wait(fake_kube, tmp_path):
    spec = make_spec(tmp_path)
    runner = make_runner(fake_kube)
    name = runner.start(spec)
    fake_kube.fail_next("GET", "Job", code=503, times=2)
    later(0.3, lambda: fake_kube.set_status("jobs", name, NAMESPACE, conditions=[condition("Complete", "Completed")]))
    assert runner.wait(spec, name, no_heartbeat, timeout=30).succeeded


def test_logs_come_from_every_pod_rank_zero_first_each_bounded(fake_kube, tmp_path):
    spec = make_spec(tmp_path)
    runner = make_runner(fake_kube, "trainjob", nodes=3, log_tail_bytes=3_000)
    name = runner.start(spec)
    for rank in (2, 0, 1):  # created out of order
        lines = "".join(f"rank {rank} step {step:05d} loss 0.{step:04d}\n" for step in range(2_000))
        fake_kube.add_pod(name, index=rank, log=lines, namespace=NAMESPACE, trainjob=True, name=f"{name}-node-0-{rank}-x")
    fake_kube.add_pod(name, index=3, log=None, namespace=NAMESPACE, trainjob=True, name=f"{name}-node-0-3-x")
    log = runner.logs(name)
    sections = log.split("==> pod ")[1:]
    assert [s.split(" <==")[0] for s in sections] == [f"{name}-node-0-{rank}-x" for rank in (0, 1, 2, 3)]
    for rank, section in enumerate(sections[:3]):
        body = section.split(" <==\n", 1)[1].rstrip("\n")
        assert len(body) <= 3_000 // 4 and body.endswith(f"rank {rank} step 01999 loss 0.1999")  # the end of each
    assert "waiting to start" in sections[3]
    assert len(log) < 3_000 + 4 * 80  # the budget plus a header line a pod
    reads = [r.query for r in fake_kube.requests if r.path.endswith("/log")]
    assert reads and all(int(q["limitBytes"]) <= 4 * 750 and "tailLines" in q for q in reads)


def test_a_job_refuses_more_than_one_node():
    with pytest.raises(ValueError, match="needs kubernetes.launcher=trainjob"):
        KubernetesSettings(launcher="job", nodes=2)


def test_through_the_journal_a_failure_is_recorded_with_its_reason_and_the_retry_succeeds(fake_kube, tmp_path, orchestration_db, monkeypatch):
    """The train task's path (tasks.once around tasks.run_training) on the job journal: the failed
    attempt's condition reaches job_runs.error; the retried task makes attempt 2, which succeeds."""
    from gearshift.orchestration import tasks
    from gearshift.orchestration.journal import JobJournal, RunStatus

    book = JobJournal(orchestration_db)
    monkeypatch.setattr(tasks, "journal", lambda: book)
    spec, runner, key = make_spec(tmp_path), make_runner(fake_kube), "train:sft:abc"

    def controller(verdict):  # the Job controller, deciding each new Job's fate as it appears
        fake_kube.on_create["Job"] = [lambda job: later(0.1, lambda: fake_kube.set_status(
            "jobs", job["metadata"]["name"], NAMESPACE, conditions=[verdict]))]

    def train() -> dict:
        return tasks.once(key, "train", {}, lambda lease: tasks.run_training(lease, runner, spec, timeout=30))

    controller(condition("Failed", "DeadlineExceeded", "Job was active longer than specified deadline"))
    with pytest.raises(tasks.TaskFailed):
        train()
    failed = book.get(key)
    assert failed.status is RunStatus.FAILED and failed.external_id == spec.name
    assert f"Job {spec.name} failed: DeadlineExceeded: Job was active longer than specified deadline" in failed.error

    write_result(spec.output_dir, {"checkpoint_id": "sft-abc"})
    controller(condition("Complete", "Completed"))
    assert train()["checkpoint_id"] == "sft-abc"
    done = book.get(key)
    assert done.status is RunStatus.SUCCEEDED and done.external_id == f"{spec.name}-a2" and done.attempts == 2


def worker_role_rules(launcher: str) -> list[dict]:
    from tests.charts.k8s import CHART, KUBE_VERSION, RELEASE, helm, named

    result = helm("template", RELEASE, str(CHART), "--namespace", RELEASE, "--kube-version", KUBE_VERSION,
                  "--set", f"training.launcher={launcher}", "--api-versions", "trainer.kubeflow.org/v1alpha1")
    assert result.returncode == 0, result.stderr
    return named([d for d in yaml.safe_load_all(result.stdout) if d], "Role", "gearshift-worker")["rules"]


def rbac_request(request) -> tuple[str, str, str]:
    """(apiGroup, resource[/subresource], verb) of a recorded request, as RBAC sees it."""
    parts = request.path.strip("/").split("/")
    group = "" if parts[0] == "api" else parts[1]
    rest = parts[parts.index("namespaces") + 2:]
    resource = "/".join([rest[0], *rest[2:3]])
    named_ = len(rest) > 1
    verb = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}.get(request.method, "get" if named_ else "list")
    return group, resource, verb


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_every_request_the_runner_makes_is_one_the_charts_worker_role_allows(fake_kube, tmp_path, launcher):
    spec = make_spec(tmp_path)
    runner = make_runner(fake_kube, launcher)
    first = runner.start(spec)
    fake_kube.add_pod(first, namespace=NAMESPACE, log="x\n", trainjob=launcher == "trainjob")
    fake_kube.set_status(PLURAL[launcher], first, NAMESPACE, conditions=[condition("Failed", "BackoffLimitExceeded")])
    runner.wait(spec, first, no_heartbeat, timeout=30)
    second = runner.start(spec)
    runner.wait(spec, second, no_heartbeat, timeout=0.1)  # times out: deleted
    stale = {"name": f"{second}-config", "ownerReferences": [{"apiVersion": "v1", "kind": "Job", "uid": "gone", "name": second}]}
    fake_kube.create("configmaps", NAMESPACE, {"metadata": stale})
    assert runner.start(spec) == second  # attempt 2 again (the deleted one is gone), its stale ConfigMap replaced
    rules = worker_role_rules(launcher)
    asked = {rbac_request(r) for r in fake_kube.requests}
    assert ("", "configmaps", "delete") in asked and ("", "pods/log", "get") in asked
    for group, resource, verb in sorted(asked):
        assert any(group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"] and "resourceNames" not in rule
                   for rule in rules), f"the worker's Role does not allow {verb} {group}/{resource}"


def test_a_runner_without_a_client_builds_one_from_the_kubeconfig_of_now(fake_kube, tmp_path, monkeypatch):
    """Outside a cluster the worker reads $KUBECONFIG when it builds its client (the client
    library itself read it once, at import)."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": fake_kube.url}}],
        "users": [{"name": "worker", "user": {"token": "t"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "worker"}}],
    }))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    spec = make_spec(tmp_path)
    runner = KubernetesRunner(KubernetesSettings(namespace=NAMESPACE))
    assert runner.start(spec) == spec.name and fake_kube.get("jobs", NAMESPACE, spec.name)


def test_a_run_still_being_deleted_counts_as_ended_and_the_next_attempt_gets_a_new_name(fake_kube, tmp_path):
    """A Foreground deletion keeps the object (deletionTimestamp set) until its pods are gone:
    a retry meanwhile must neither attach to it nor reuse its name."""
    spec = make_spec(tmp_path)
    runner = make_runner(fake_kube)
    first = runner.start(spec)
    fake_kube.patch("jobs", NAMESPACE, first, {"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}, "application/merge-patch+json")
    assert runner.wait(spec, first, no_heartbeat, timeout=30).reason == f"Job {first} is being deleted"
    assert runner.start(spec) == f"{spec.name}-a2"
