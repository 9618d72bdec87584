"""The training Job and TrainJob the KubernetesRunner submits, rendered and validated offline:
the Job against the Kubernetes 1.35 schemas (strict: unknown fields fail), the TrainJob against
Kubeflow Trainer's models; and the policy Deployment patch."""

from __future__ import annotations

import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from gearshift.api.common.v1.common_pb2 import Checkpoint
from gearshift.orchestration.publishing import CHECKPOINT_ANNOTATION, deployment_patch
from gearshift.orchestration.training_run import RunSpec
from gearshift.orchestration.training_manifests import attempt_name, build_config_map, build_job, build_run, build_trainjob, to_manifest
from gearshift.settings import KubernetesSettings
from pydantic import ValidationError

from tests.charts.k8s import CHART, KUBE_VERSION, RELEASE, helm, named, render

SPEC = RunSpec(name="gearshift-sft-0123abcd", job="sft", config={"optim": {"max_steps": 2}}, output_dir=Path("/checkpoints/x"))
GPU_NODES = {
    "gpus": 4,
    "node_selector": {"nvidia.com/gpu.present": "true"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "checkpoints_claim": "ckpts",
}


def validate(manifest: dict) -> None:
    kubernetes_validate.validate(manifest, KUBE_VERSION, strict=True)


def test_job_from_settings_has_gpus_placement_claim_and_torchrun():
    job = to_manifest(build_job(SPEC, KubernetesSettings(namespace="train", **GPU_NODES)))
    validate(job)
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert job["metadata"] == {"name": SPEC.name, "namespace": "train", "labels": {"gearshift.io/training-run": SPEC.name, "gearshift.io/job": "sft", "gearshift.io/attempt": "1"}}
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert container["command"][:4] == ["torchrun", "--standalone", "--nproc-per-node", "4"]
    assert container["args"] == ["sft", "--config", "/etc/gearshift/train/config.yaml"]
    assert pod["nodeSelector"] == GPU_NODES["node_selector"] and pod["tolerations"] == GPU_NODES["tolerations"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["checkpoints"]["persistentVolumeClaim"]["claimName"] == "ckpts"
    assert volumes["config"]["configMap"]["name"] == f"{SPEC.name}-config"
    assert pod["restartPolicy"] == "Never"


def test_one_gpu_runs_without_torchrun():
    container = to_manifest(build_job(SPEC, KubernetesSettings(gpus=1)))["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["gearshift", "train"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"


def pod_of(settings: KubernetesSettings) -> tuple[dict, dict, dict]:
    """(train container, its env as name -> value, the dshm volume) of the Job built from settings."""
    job = to_manifest(build_job(SPEC, settings))
    validate(job)
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert len(env) == len(container["env"])
    return container, env, next(v for v in pod["volumes"] if v["name"] == "dshm")


def test_two_gpus_get_torchrun_threads_per_process_nccl_env_and_sized_shared_memory():
    container, env, dshm = pod_of(KubernetesSettings(gpus=2, cpu="8"))
    assert container["command"] == ["torchrun", "--standalone", "--nproc-per-node", "2", "-m", "gearshift.cli", "train"]
    assert env == {
        "GEARSHIFT_DATA_DIR": "/checkpoints",
        "OMP_NUM_THREADS": "4",  # 8 CPUs over 2 processes
        "NCCL_DEBUG": "WARN",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    }
    assert dshm["emptyDir"] == {"medium": "Memory", "sizeLimit": "4Gi"}  # 2Gi per process
    assert pod_of(KubernetesSettings(gpus=2, shm_size="16Gi"))[2]["emptyDir"]["sizeLimit"] == "16Gi"


def test_cpu_pod_threads_use_the_whole_cpu_limit_and_settings_env_wins():
    _, env, dshm = pod_of(KubernetesSettings(cpu="3500m"))
    assert env == {"GEARSHIFT_DATA_DIR": "/checkpoints", "OMP_NUM_THREADS": "3"}  # no NCCL without GPUs
    assert dshm["emptyDir"]["sizeLimit"] == "2Gi"
    assert pod_of(KubernetesSettings(cpu="500m"))[1]["OMP_NUM_THREADS"] == "1"
    _, env, _ = pod_of(KubernetesSettings(gpus=4, cpu="2", env={"OMP_NUM_THREADS": "2", "NCCL_DEBUG": "INFO"}))
    assert env["OMP_NUM_THREADS"] == "2" and env["NCCL_DEBUG"] == "INFO" and env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"


def test_config_map_carries_the_config_file():
    config_map = to_manifest(build_config_map(SPEC, {"gearshift.io/job": "sft"}))
    validate(config_map)
    assert yaml.safe_load(config_map["data"]["config.yaml"]) == SPEC.config


def test_job_from_the_charts_template(tmp_path):
    """The worker's template comes from the chart's training-job ConfigMap: the run's Job keeps
    the chart's pod (image, GPUs, claim) and gets its own name, args and config ConfigMap."""
    docs = render(("values-gpu.yaml",))
    template = named(docs, "ConfigMap", "gearshift-training-job")["data"]["job.yaml"]
    (tmp_path / "job.yaml").write_text(template)
    job = to_manifest(build_job(SPEC, KubernetesSettings(namespace="gearshift", job_template=tmp_path / "job.yaml")))
    validate(job)
    assert "generateName" not in job["metadata"] and job["metadata"]["name"] == SPEC.name
    pod = job["spec"]["template"]["spec"]
    container = next(c for c in pod["containers"] if c["name"] == "train")
    assert container["args"] == ["sft", "--config", "/etc/gearshift/train/config.yaml"]
    chart_pod = yaml.safe_load(template)["spec"]["template"]["spec"]
    assert container["image"] == chart_pod["containers"][0]["image"]
    quantities = {kind: {name: str(value) for name, value in values.items()} for kind, values in chart_pod["containers"][0]["resources"].items()}
    assert container["resources"] == quantities  # the GPU count 1 becomes the quantity "1"
    assert next(v for v in pod["volumes"] if v["name"] == "config")["configMap"]["name"] == f"{SPEC.name}-config"
    assert job["metadata"]["labels"]["app.kubernetes.io/component"] == "training"


def test_deployment_patch_points_vllm_or_builtin_at_the_checkpoint():
    checkpoint = Checkpoint(id="sft-1", uri="/checkpoints/sft-1")
    read = {"resourceVersion": "7"}  # as the API server returns the Deployment: the patch is conditional on it
    vllm = {"metadata": read, "spec": {"template": {"spec": {"containers": [{"name": "policy", "args": ["--model", "/weights/base", "--port", "8000"]}]}}}}
    patch = deployment_patch(vllm, "policy", checkpoint)
    assert patch["spec"]["template"]["spec"]["containers"] == [{"name": "policy", "args": ["--model", "/checkpoints/sft-1", "--port", "8000"]}]
    assert patch["spec"]["template"]["metadata"]["annotations"] == {CHECKPOINT_ANNOTATION: "sft-1"}
    assert patch["metadata"] == {"resourceVersion": "7"}
    builtin = {"metadata": read, "spec": {"template": {"spec": {"containers": [{"name": "policy", "command": ["gearshift", "serve-policy"]}]}}}}
    (container,) = deployment_patch(builtin, "policy", checkpoint)["spec"]["template"]["spec"]["containers"]
    assert container["env"] == [{"name": "GEARSHIFT_POLICY_SERVER__MODEL", "value": "/checkpoints/sft-1"}]


# ---------------------------------------------------------------- TrainJob


def validate_trainjob(manifest: dict) -> None:
    """Kubeflow Trainer's own models (kubeflow-trainer-api) read the manifest back exactly: they
    drop what they do not know, so any unknown or misplaced key shows as a difference."""
    from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob

    assert TrainerV1alpha1TrainJob.from_dict(manifest).to_dict() == manifest


def node_pod(trainjob: dict) -> dict:
    (patch,) = trainjob["spec"]["runtimePatches"]
    (job,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert job["name"] == "node"
    return job["template"]["spec"]["template"]


def test_trainjob_from_settings_runs_torchrun_on_every_node_with_the_jobs_pod():
    settings = KubernetesSettings(namespace="train", launcher="trainjob", nodes=3, cpu="8", service_account="trainer", **GPU_NODES)
    trainjob = build_trainjob(SPEC, settings, attempt=2)
    validate_trainjob(trainjob)
    name = f"{SPEC.name}-a2"
    assert trainjob["metadata"] == {"name": name, "namespace": "train", "labels": {
        "gearshift.io/training-run": SPEC.name, "gearshift.io/job": "sft", "gearshift.io/attempt": "2"}}
    spec = trainjob["spec"]
    assert spec["runtimeRef"] == {"name": "torch-distributed", "apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime"}
    assert spec["activeDeadlineSeconds"] == settings.active_deadline_seconds
    trainer = spec["trainer"]
    assert trainer["command"] == ["torchrun", "-m", "gearshift.cli", "train"]  # the runtime's PET_* give the rendezvous
    assert trainer["args"] == ["sft", "--config", "/etc/gearshift/train/config.yaml"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (3, 4)
    job = to_manifest(build_job(SPEC, KubernetesSettings(namespace="train", cpu="8", service_account="trainer", **GPU_NODES)))
    job_pod = job["spec"]["template"]["spec"]
    assert trainer["resourcesPerNode"] == job_pod["containers"][0]["resources"]
    assert trainer["env"] == job_pod["containers"][0]["env"]
    pod = node_pod(trainjob)
    assert pod["metadata"]["labels"] == trainjob["metadata"]["labels"]
    patch = pod["spec"]
    for key in ("serviceAccountName", "nodeSelector", "tolerations"):
        assert patch[key] == job_pod[key]
    volumes = {v["name"]: v for v in patch["volumes"]}
    assert volumes["config"]["configMap"]["name"] == f"{name}-config" and volumes == {v["name"]: v for v in job_pod["volumes"]} | {
        "config": {"name": "config", "configMap": {"name": f"{name}-config"}}}
    assert patch["containers"] == [{"name": "node", "volumeMounts": job_pod["containers"][0]["volumeMounts"]}]


def test_a_cpu_trainjob_runs_one_process_per_node_and_the_runtime_is_a_setting():
    trainjob = build_trainjob(SPEC, KubernetesSettings(launcher="trainjob", trainjob_runtime="torch-cpu"))
    validate_trainjob(trainjob)
    assert trainjob["spec"]["trainer"]["numProcPerNode"] == 1 and trainjob["spec"]["trainer"]["numNodes"] == 1
    assert "nvidia.com/gpu" not in trainjob["spec"]["trainer"]["resourcesPerNode"]["limits"]
    assert trainjob["spec"]["runtimeRef"]["name"] == "torch-cpu"
    assert build_run(SPEC, KubernetesSettings(launcher="trainjob"))["kind"] == "TrainJob"
    assert build_run(SPEC, KubernetesSettings())["kind"] == "Job"


def test_a_job_across_nodes_is_refused():
    with pytest.raises(ValidationError, match="needs kubernetes.launcher=trainjob"):
        KubernetesSettings(nodes=2)


def test_attempt_names_stay_dns_labels():
    assert attempt_name("gearshift-sft-0123", 1) == "gearshift-sft-0123"
    assert attempt_name("gearshift-sft-0123", 2) == "gearshift-sft-0123-a2"
    long = "gearshift-distill-" + "b" * 44 + "-c"  # 64 characters
    for attempt in (1, 2, 123):
        name = attempt_name(long, attempt)
        assert len(name) <= 63 and re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name)
    assert attempt_name("x" * 61 + "-y", 12).endswith("x-a12")  # no "--" left where it was cut


def test_trainjob_from_the_charts_template(tmp_path):
    """With training.launcher=trainjob the chart's template is a TrainJob: the run fills in its
    name, labels, trainer args and config ConfigMap; the rest is the chart's."""
    result = helm("template", RELEASE, str(CHART), "--namespace", RELEASE, "--kube-version", KUBE_VERSION,
                  "-f", str(CHART / "values-gpu.yaml"), "--set", "training.launcher=trainjob", "--set", "training.nodes=2",
                  "--api-versions", "trainer.kubeflow.org/v1alpha1")
    assert result.returncode == 0, result.stderr
    docs = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    template = named(docs, "ConfigMap", "gearshift-training-job")["data"]["job.yaml"]
    (tmp_path / "job.yaml").write_text(template)
    settings = KubernetesSettings(namespace="gearshift", job_template=tmp_path / "job.yaml")
    trainjob = build_run(SPEC, settings)
    assert trainjob["kind"] == "TrainJob"
    validate_trainjob(trainjob)
    chart = yaml.safe_load(template)
    assert "generateName" not in trainjob["metadata"] and trainjob["metadata"]["name"] == SPEC.name
    assert trainjob["metadata"]["labels"]["app.kubernetes.io/component"] == "training"
    assert trainjob["spec"]["trainer"]["args"] == ["sft", "--config", "/etc/gearshift/train/config.yaml"]
    assert trainjob["spec"]["trainer"]["numNodes"] == 2 and trainjob["spec"]["trainer"]["image"] == chart["spec"]["trainer"]["image"]
    pod = node_pod(trainjob)
    assert next(v for v in pod["spec"]["volumes"] if v["name"] == "config")["configMap"]["name"] == f"{SPEC.name}-config"
    assert pod["metadata"]["labels"]["gearshift.io/training-run"] == SPEC.name
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "training"  # the chart's, kept
    with pytest.raises(ValueError, match="needs a Job template"):
        build_job(SPEC, settings)
