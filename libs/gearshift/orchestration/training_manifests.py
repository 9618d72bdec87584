"""What a training run is on a cluster: its --config file in a ConfigMap, and one attempt of it as
a batch/v1 Job (one node; torchrun --standalone across its GPUs) or a Kubeflow Trainer TrainJob
(settings.nodes nodes on the torch-distributed runtime). Each is built from settings alone or
from the chart's template (settings.job_template, a Job or a TrainJob: its kind decides), and the
run fills in only:

    metadata.name, metadata.namespace      attempt_name(run, attempt), settings.namespace
    metadata.labels, the pods' labels      the run, its job and the attempt (RUN_LABEL, ...)
    Job:       spec.template.spec.containers[train].args = [job, "--config", TRAIN_CONFIG_PATH]
               spec.template.spec.volumes[config].configMap.name = "<name>-config"
    TrainJob:  spec.trainer.args = [job, "--config", TRAIN_CONFIG_PATH]
               spec.runtimePatches[*].trainingRuntimeSpec.template.spec.replicatedJobs[*]
                   .template.spec.template.spec.volumes[config].configMap.name = "<name>-config"

The chart renders the same structures into its training-job ConfigMap (job.yaml), with the
config volume's ConfigMap named REPLACED-PER-RUN. A TrainJob may patch only what a PodSpecPatch
or ContainerPatch holds, so its volumes, mounts, service account and placement travel in one
runtime patch on the runtime's `node` job and container.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import yaml

from gearshift.orchestration.training_run import RunSpec
from gearshift.settings import KubernetesSettings

TRAIN_CONFIG_PATH = "/etc/gearshift/train/config.yaml"  # where the run's ConfigMap is mounted
RUN_LABEL, JOB_LABEL, ATTEMPT_LABEL = "gearshift.io/training-run", "gearshift.io/job", "gearshift.io/attempt"
RUNTIME_PATCH_MANAGER = "gearshift.io/runner"
# torchrun reads the rendezvous (PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR,
# PET_MASTER_PORT) from the environment the torch runtime sets: no --standalone, no counts here.
TRAINJOB_COMMAND = ["torchrun", "-m", "gearshift.cli", "train"]
# (group, version, plural) of each kind a run can be.
RESOURCES = {"Job": ("batch", "v1", "jobs"), "TrainJob": ("trainer.kubeflow.org", "v1alpha1", "trainjobs")}
LAUNCHER_KINDS = {"job": "Job", "trainjob": "TrainJob"}
MAX_NAME = 63  # a Job's name becomes its pods' job-name label value; a TrainJob's a DNS-1035 label


def attempt_name(run: str, attempt: int) -> str:
    """The object of one attempt: the run's name for the first (a Job started before attempts
    were counted is found under it), `<run>-a<N>` after, within 63 characters."""
    suffix = f"-a{attempt}" if attempt > 1 else ""
    return run[: MAX_NAME - len(suffix)].rstrip("-") + suffix


def config_map_name(name: str) -> str:
    return f"{name}-config"


def run_labels(spec: RunSpec, attempt: int) -> dict[str, str]:
    return {RUN_LABEL: spec.name, JOB_LABEL: spec.job, ATTEMPT_LABEL: str(attempt)}


def attempt_of(obj: dict) -> int:
    """The attempt an object is (a Job without the label is the first)."""
    try:
        return int(obj["metadata"].get("labels", {}).get(ATTEMPT_LABEL, 1))
    except ValueError:
        return 1


def build_config_map(spec: RunSpec, labels: dict[str, str], attempt: int = 1) -> dict:
    """The run's --config file as a ConfigMap (mounted at /etc/gearshift/train)."""
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": config_map_name(attempt_name(spec.name, attempt)), "labels": labels},
        "data": {"config.yaml": yaml.safe_dump(spec.config, sort_keys=False)},
    }


def to_manifest(model) -> dict:
    """A client model (or a dict of them) as the plain dict kubectl would send: camelCase keys,
    no nulls."""
    from kubernetes import client

    return client.ApiClient().sanitize_for_serialization(model)


def load_template(path: Path) -> dict:
    """The chart's Job or TrainJob template (YAML)."""
    return yaml.safe_load(Path(path).read_text())


def run_kind(settings: KubernetesSettings) -> str:
    """Job or TrainJob: the template's kind when there is one, else settings.launcher's."""
    if settings.job_template:
        kind = load_template(settings.job_template).get("kind")
        if kind not in RESOURCES:
            raise ValueError(f"{settings.job_template} holds a {kind}; a training template is a Job or a TrainJob")
        return kind
    return LAUNCHER_KINDS[settings.launcher]


def build_run(spec: RunSpec, settings: KubernetesSettings, attempt: int = 1) -> dict:
    """The object of one attempt of the run, of the kind run_kind says."""
    build = build_trainjob if run_kind(settings) == "TrainJob" else build_job
    return build(spec, settings, attempt=attempt)


# ---------------------------------------------------------------- what both kinds share


def _whole_cpus(quantity: str) -> int:
    """Whole CPUs in a CPU quantity ("4", "2.5", "500m"), rounded down; 0 when it cannot be read
    (the chart's gearshift.wholeCPUs)."""
    try:
        return int(quantity[:-1]) // 1000 if quantity.endswith("m") else int(float(quantity))
    except (ValueError, OverflowError):
        return 0


def _training_env(settings: KubernetesSettings) -> dict[str, str]:
    """The environment torchrun's processes need, under settings.env (which wins), as the chart
    sets it. OMP_NUM_THREADS: the CPU limit shared by the processes (torchrun would set 1,
    starving a lone CPU process). TORCH_NCCL_ASYNC_ERROR_HANDLING: when a rank dies the others
    fail fast instead of hanging in a collective."""
    env = {"OMP_NUM_THREADS": str(max(1, _whole_cpus(settings.cpu) // max(settings.gpus, 1)))}
    if settings.gpus:
        env |= {"NCCL_DEBUG": "WARN", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    return env | settings.env


def _env(settings: KubernetesSettings) -> list[dict]:
    env = {"GEARSHIFT_DATA_DIR": settings.checkpoints_mount_path} | _training_env(settings)
    return [{"name": name, "value": value} for name, value in env.items()]


def _resources(settings: KubernetesSettings) -> dict:
    limits = {"cpu": settings.cpu, "memory": settings.memory}
    if settings.gpus:
        limits["nvidia.com/gpu"] = str(settings.gpus)
    return {"requests": {"cpu": settings.cpu, "memory": settings.memory}, "limits": limits}


def _volumes(settings: KubernetesSettings) -> list[dict]:
    shm_size = settings.shm_size or f"{2 * max(settings.gpus, 1)}Gi"
    return [
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": settings.checkpoints_claim}},
        {"name": "config", "configMap": {"name": "REPLACED-PER-RUN"}},
        # torch DataLoader workers and NCCL share tensors through /dev/shm.
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_size}},
    ]


def _volume_mounts(settings: KubernetesSettings) -> list[dict]:
    return [
        {"name": "checkpoints", "mountPath": settings.checkpoints_mount_path},
        {"name": "config", "mountPath": str(Path(TRAIN_CONFIG_PATH).parent), "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]


def _placement(settings: KubernetesSettings) -> dict:
    """Service account, node selector and tolerations, where set."""
    pod = {"serviceAccountName": settings.service_account, "nodeSelector": settings.node_selector or None,
           "tolerations": settings.tolerations or None}
    return {key: value for key, value in pod.items() if value is not None}


def _named(items: list[dict], name: str, what: str) -> dict:
    try:
        return next(item for item in items if item.get("name") == name)
    except StopIteration:
        raise ValueError(f"the training template has no {what} named {name!r}") from None


def _fill_metadata(manifest: dict, name: str, namespace: str, labels: dict[str, str]) -> None:
    meta = manifest.setdefault("metadata", {}) or {}
    meta.pop("generateName", None)
    manifest["metadata"] = meta | {"name": name, "namespace": namespace, "labels": (meta.get("labels") or {}) | labels}


def _fill_pod_labels(template: dict, labels: dict[str, str]) -> None:
    meta = template.get("metadata") or {}
    template["metadata"] = meta | {"labels": (meta.get("labels") or {}) | labels}


# ---------------------------------------------------------------- batch/v1 Job


def _default_job(settings: KubernetesSettings) -> dict:
    """A training Job built from settings alone (no template): the same shape as the chart's."""
    if settings.gpus > 1:
        command = ["torchrun", "--standalone", "--nproc-per-node", str(settings.gpus), "-m", "gearshift.cli", "train"]
    else:
        command = ["gearshift", "train"]
    container = {"name": "train", "image": settings.image, "command": command, "env": _env(settings),
                 "resources": _resources(settings), "volumeMounts": _volume_mounts(settings)}
    pod = {"restartPolicy": "Never", "containers": [container], **_placement(settings), "volumes": _volumes(settings)}
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {},
        "spec": {"backoffLimit": settings.backoff_limit, "activeDeadlineSeconds": settings.active_deadline_seconds,
                 "ttlSecondsAfterFinished": settings.ttl_seconds_after_finished, "template": {"metadata": {}, "spec": pod}},
    }


def _as_job(document: dict) -> dict:
    """A Job manifest read through the client's V1Job (quantities become strings, as the API
    returns them)."""
    from kubernetes import client

    return to_manifest(client.ApiClient()._ApiClient__deserialize(document, "V1Job"))


def build_job(spec: RunSpec, settings: KubernetesSettings, labels: dict[str, str] | None = None, attempt: int = 1) -> dict:
    """One attempt of the run as a Job: the template (the chart's, or one built from settings)
    with the attempt's name, labels, container args and config ConfigMap."""
    document = load_template(settings.job_template) if settings.job_template else _default_job(settings)
    if document.get("kind") != "Job":
        raise ValueError(f"build_job needs a Job template, not a {document.get('kind')}")
    job = _as_job(copy.deepcopy(document))
    name, labels = attempt_name(spec.name, attempt), run_labels(spec, attempt) | (labels or {})
    _fill_metadata(job, name, settings.namespace, labels)
    template = job["spec"]["template"]
    _fill_pod_labels(template, labels)
    _named(template["spec"]["containers"], "train", "container")["args"] = [spec.job, "--config", TRAIN_CONFIG_PATH]
    _named(template["spec"]["volumes"], "config", "volume")["configMap"]["name"] = config_map_name(name)
    return job


# ---------------------------------------------------------------- Kubeflow Trainer TrainJob


def _default_trainjob(settings: KubernetesSettings) -> dict:
    """A TrainJob built from settings alone: settings.nodes nodes of max(gpus, 1) processes, each
    node's pod given the Job's volumes and placement through one runtime patch."""
    pod = {**_placement(settings), "volumes": _volumes(settings),
           "containers": [{"name": "node", "volumeMounts": _volume_mounts(settings)}]}
    node_job = {"name": "node", "template": {"spec": {"template": {"spec": pod}}}}
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {},
        "spec": {
            "runtimeRef": {"name": settings.trainjob_runtime, "apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime"},
            "activeDeadlineSeconds": settings.active_deadline_seconds,
            "trainer": {
                "image": settings.image, "command": list(TRAINJOB_COMMAND),
                "numNodes": settings.nodes, "numProcPerNode": max(settings.gpus, 1),
                "resourcesPerNode": _resources(settings), "env": _env(settings),
            },
            "runtimePatches": [{"manager": RUNTIME_PATCH_MANAGER,
                                "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [node_job]}}}}],
        },
    }


def _patched_pod_templates(trainjob: dict) -> list[dict]:
    """The pod templates of every replicated job the TrainJob's runtime patches touch."""
    return [job["template"]["spec"]["template"]
            for patch in trainjob["spec"].get("runtimePatches") or []
            for job in (((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {}).get("replicatedJobs") or []
            if (job.get("template") or {}).get("spec", {}).get("template")]


def build_trainjob(spec: RunSpec, settings: KubernetesSettings, labels: dict[str, str] | None = None, attempt: int = 1) -> dict:
    """One attempt of the run as a TrainJob: the template (the chart's, or one built from
    settings) with the attempt's name, labels, trainer args and config ConfigMap."""
    document = load_template(settings.job_template) if settings.job_template else _default_trainjob(settings)
    if document.get("kind") != "TrainJob":
        raise ValueError(f"build_trainjob needs a TrainJob template, not a {document.get('kind')}")
    trainjob = copy.deepcopy(document)
    name, labels = attempt_name(spec.name, attempt), run_labels(spec, attempt) | (labels or {})
    _fill_metadata(trainjob, name, settings.namespace, labels)
    trainjob["spec"].setdefault("trainer", {})["args"] = [spec.job, "--config", TRAIN_CONFIG_PATH]
    configs = [volume for pod in _patched_pod_templates(trainjob)
               for volume in pod.get("spec", {}).get("volumes") or [] if volume.get("name") == "config"]
    if not configs:
        raise ValueError("the TrainJob template's runtime patches have no volume named 'config'")
    for volume in configs:
        volume["configMap"]["name"] = config_map_name(name)
    for pod in _patched_pod_templates(trainjob):
        _fill_pod_labels(pod, labels)
    return trainjob


# ---------------------------------------------------------------- how an attempt ended


@dataclass(frozen=True)
class Verdict:
    succeeded: bool
    reason: str = ""


def verdict(obj: dict) -> Verdict | None:
    """How a Job or TrainJob ended, from its status conditions (a Job's succeeded count too);
    None while it runs. One being deleted has ended, unsuccessfully."""
    kind, meta = obj.get("kind", "Job"), obj["metadata"]
    status = obj.get("status") or {}
    holding = {c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"}
    # FailureTarget: a Job controller's verdict while its pods still terminate (Failed follows).
    failed = holding.get("Failed") or holding.get("FailureTarget")
    if failed:
        why = ": ".join(part for part in (failed.get("reason"), failed.get("message")) if part) or "no reason given"
        return Verdict(False, f"{kind} {meta['name']} failed: {why}")
    if meta.get("deletionTimestamp"):
        return Verdict(False, f"{kind} {meta['name']} is being deleted")
    completions = (obj.get("spec") or {}).get("completions") or 1
    if "Complete" in holding or (kind == "Job" and (status.get("succeeded") or 0) >= completions):
        return Verdict(True)
    return None


def pod_selector(kind: str, name: str) -> str:
    """The label selector of an attempt's pods: the Job controller's job-name, or the JobSet that
    Kubeflow Trainer makes of a TrainJob (named after it)."""
    return f"jobset.sigs.k8s.io/jobset-name={name}" if kind == "TrainJob" else f"job-name={name}"


def rank_order(pod) -> tuple[int, int, str]:
    """Sorts an attempt's pods rank 0 first: by JobSet job index, then completion index (a
    torch runtime node's rank), then name."""
    labels = pod.metadata.labels or {}

    def number(key: str) -> int:
        value = labels.get(key, "0")
        return int(value) if value.isdigit() else 0

    return number("jobset.sigs.k8s.io/job-index"), number("batch.kubernetes.io/job-completion-index"), pod.metadata.name
