"""Where a training run executes: a subprocess on this machine (the embedded default) or a
Kubernetes Job on GPU nodes. Both are re-attachable: start() on a run that was already started
(a task redelivered after a worker crash) finds it instead of starting a second one.

Every run is `gearshift train <job> --config FILE` (`python -m gearshift.jobs.<job>` locally),
writing its checkpoint directory with a result.json and registering it in the store.
"""

from __future__ import annotations

import copy
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import yaml

from gearshift.settings import KubernetesSettings, Settings
from gearshift.training.results import RESULT_FILE, read_result

LOG_TAIL_CHARS = 64_000
TRAIN_CONFIG_PATH = "/etc/gearshift/train/config.yaml"  # where the chart mounts the run's ConfigMap


@dataclass
class RunSpec:
    """One training run: a DNS-safe name, the job, its --config and where its checkpoint lands."""

    name: str
    job: str
    config: dict
    output_dir: Path


@dataclass
class RunOutcome:
    """How a run ended: its exit, the tail of its log, and its result.json when readable here."""

    succeeded: bool
    external_id: str
    log: str = ""
    result: dict | None = None
    reason: str = ""
    extra: dict = field(default_factory=dict)


Heartbeat = Callable[[str], None]  # called with the log tail while a run is watched


class Runner(Protocol):
    def start(self, spec: RunSpec) -> str:
        """Starts the run, or finds it started; returns its external id."""

    def wait(self, spec: RunSpec, external_id: str, heartbeat: Heartbeat, timeout: float) -> RunOutcome:
        """Watches the run to its end."""


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, path.stat().st_size - LOG_TAIL_CHARS))
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


class LocalRunner:
    """A subprocess in its own session, its output in <run dir>/train.log and its exit status in
    <run dir>/exit_code (written by a shell wrapper, so a worker that adopts the run after a
    crash still learns how it ended)."""

    def __init__(self, runs_dir: Path, poll_seconds: float = 0.5, env: dict[str, str] | None = None):
        self.runs_dir = Path(runs_dir)
        self.poll_seconds = poll_seconds
        self.env = env or {}

    def run_dir(self, spec: RunSpec) -> Path:
        return self.runs_dir / spec.name

    def command(self, spec: RunSpec, config_path: Path) -> list[str]:
        return [sys.executable, "-m", f"gearshift.jobs.{spec.job}", "--config", str(config_path)]

    def start(self, spec: RunSpec) -> str:
        run_dir = self.run_dir(spec)
        run_dir.mkdir(parents=True, exist_ok=True)
        if self._alive(run_dir) or (run_dir / "exit_code").exists():
            return str(run_dir)  # started before (a redelivered task): watch that one
        config_path = run_dir / "config.yaml"
        config_path.write_text(yaml.safe_dump(spec.config, sort_keys=False))
        command = " ".join(shlex.quote(part) for part in self.command(spec, config_path))
        wrapper = f'{command} >> train.log 2>&1; echo $? > exit_code.tmp && mv exit_code.tmp exit_code'
        process = subprocess.Popen(
            ["/bin/sh", "-c", wrapper], cwd=run_dir, env=os.environ | self.env, start_new_session=True,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        (run_dir / "pid").write_text(str(process.pid))
        return str(run_dir)

    def wait(self, spec: RunSpec, external_id: str, heartbeat: Heartbeat, timeout: float) -> RunOutcome:
        run_dir = Path(external_id)
        deadline = time.monotonic() + timeout
        while not (run_dir / "exit_code").exists():
            if time.monotonic() > deadline:
                self.stop(run_dir)
                return RunOutcome(False, external_id, _tail(run_dir / "train.log"), reason=f"timed out after {timeout:.0f} s")
            if not self._alive(run_dir) and not (run_dir / "exit_code").exists():
                time.sleep(self.poll_seconds)  # the wrapper may be renaming exit_code right now
                if not (run_dir / "exit_code").exists():
                    return RunOutcome(False, external_id, _tail(run_dir / "train.log"), reason="the run's process vanished")
            heartbeat(_tail(run_dir / "train.log"))
            time.sleep(self.poll_seconds)
        code = int((run_dir / "exit_code").read_text().strip() or 1)
        log = _tail(run_dir / "train.log")
        result = read_result(spec.output_dir)
        if code != 0:
            return RunOutcome(False, external_id, log, result, reason=f"exit status {code}")
        if result is None:
            return RunOutcome(False, external_id, log, reason=f"no {RESULT_FILE} in {spec.output_dir}")
        return RunOutcome(True, external_id, log, result)

    def stop(self, run_dir: Path) -> None:
        pid = self._pid(run_dir)
        if pid:
            try:
                os.killpg(pid, signal.SIGTERM)  # the wrapper leads its own session
            except ProcessLookupError:
                pass

    @staticmethod
    def _pid(run_dir: Path) -> int | None:
        try:
            return int((run_dir / "pid").read_text())
        except (OSError, ValueError):
            return None

    def _alive(self, run_dir: Path) -> bool:
        pid = self._pid(run_dir)
        if not pid:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        # A zombie child of this process counts as ended: reap it.
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
            return done == 0
        except ChildProcessError:
            return True


# ---------------------------------------------------------------- Kubernetes


def config_map_name(spec: RunSpec) -> str:
    return f"{spec.name}-config"


def build_config_map(spec: RunSpec, labels: dict[str, str]):
    """The run's --config file as a ConfigMap (mounted at /etc/gearshift/train)."""
    from kubernetes import client

    return client.V1ConfigMap(
        api_version="v1", kind="ConfigMap",
        metadata=client.V1ObjectMeta(name=config_map_name(spec), labels=labels),
        data={"config.yaml": yaml.safe_dump(spec.config, sort_keys=False)},
    )


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


def _default_job(settings: KubernetesSettings):
    """A training Job built from settings alone (no template): the same shape as the chart's."""
    from kubernetes import client

    limits = {"cpu": settings.cpu, "memory": settings.memory}
    if settings.gpus:
        limits["nvidia.com/gpu"] = str(settings.gpus)
    if settings.gpus > 1:
        command = ["torchrun", "--standalone", "--nproc-per-node", str(settings.gpus), "-m", "gearshift.cli", "train"]
    else:
        command = ["gearshift", "train"]
    env = {"GEARSHIFT_DATA_DIR": settings.checkpoints_mount_path} | _training_env(settings)
    shm_size = settings.shm_size or f"{2 * max(settings.gpus, 1)}Gi"
    container = client.V1Container(
        name="train",
        image=settings.image,
        command=command,
        env=[client.V1EnvVar(name=name, value=value) for name, value in env.items()],
        resources=client.V1ResourceRequirements(requests={"cpu": settings.cpu, "memory": settings.memory}, limits=limits),
        volume_mounts=[
            client.V1VolumeMount(name="checkpoints", mount_path=settings.checkpoints_mount_path),
            client.V1VolumeMount(name="config", mount_path=str(Path(TRAIN_CONFIG_PATH).parent), read_only=True),
            client.V1VolumeMount(name="dshm", mount_path="/dev/shm"),
        ],
    )
    pod = client.V1PodSpec(
        restart_policy="Never",
        containers=[container],
        service_account_name=settings.service_account,
        node_selector=settings.node_selector or None,
        tolerations=[client.V1Toleration(**_snake(t)) for t in settings.tolerations] or None,
        volumes=[
            client.V1Volume(
                name="checkpoints",
                persistent_volume_claim=client.V1PersistentVolumeClaimVolumeSource(claim_name=settings.checkpoints_claim),
            ),
            client.V1Volume(name="config", config_map=client.V1ConfigMapVolumeSource(name="REPLACED-PER-RUN")),
            # torch DataLoader workers and NCCL share tensors through /dev/shm.
            client.V1Volume(name="dshm", empty_dir=client.V1EmptyDirVolumeSource(medium="Memory", size_limit=shm_size)),
        ],
    )
    return client.V1Job(
        api_version="batch/v1",
        kind="Job",
        metadata=client.V1ObjectMeta(),
        spec=client.V1JobSpec(
            backoff_limit=settings.backoff_limit,
            active_deadline_seconds=settings.active_deadline_seconds,
            ttl_seconds_after_finished=settings.ttl_seconds_after_finished,
            template=client.V1PodTemplateSpec(metadata=client.V1ObjectMeta(), spec=pod),
        ),
    )


def _snake(toleration: dict) -> dict:
    """Kubernetes' camelCase toleration keys as the client models' keyword arguments."""
    names = {"tolerationSeconds": "toleration_seconds"}
    return {names.get(key, key): value for key, value in toleration.items()}


def load_template(path: Path):
    """The chart's Job template (YAML) as a V1Job."""
    from kubernetes import client

    document = yaml.safe_load(Path(path).read_text())
    return client.ApiClient()._ApiClient__deserialize(document, "V1Job")


def build_job(spec: RunSpec, settings: KubernetesSettings, labels: dict[str, str] | None = None):
    """The run's Job: the template (the chart's, or one built from settings) with this run's
    name, labels, container args and config ConfigMap."""
    job = load_template(settings.job_template) if settings.job_template else _default_job(settings)
    job = copy.deepcopy(job)
    labels = {"gearshift.io/training-run": spec.name, "gearshift.io/job": spec.job} | (labels or {})
    job.metadata.name, job.metadata.generate_name = spec.name, None
    job.metadata.namespace = settings.namespace
    job.metadata.labels = (job.metadata.labels or {}) | labels
    template = job.spec.template
    template.metadata.labels = (template.metadata.labels or {}) | labels
    container = next(c for c in template.spec.containers if c.name == "train")
    container.args = [spec.job, "--config", TRAIN_CONFIG_PATH]
    config_volume = next(v for v in template.spec.volumes if v.name == "config")
    config_volume.config_map.name = config_map_name(spec)
    return job


def to_manifest(model) -> dict:
    """A client model as the plain dict kubectl would send (camelCase keys, no nulls)."""
    from kubernetes import client

    return client.ApiClient().sanitize_for_serialization(model)


def kube_api_client():
    """A Kubernetes API client: the pod's service account in a cluster, else the kubeconfig."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


class KubernetesRunner:
    """A batch/v1 Job per run, with its config in a ConfigMap owned by the Job (deleted with it)."""

    def __init__(self, settings: KubernetesSettings, api_client=None):
        from kubernetes import client

        api_client = api_client or kube_api_client()
        self.settings = settings
        self.batch = client.BatchV1Api(api_client)
        self.core = client.CoreV1Api(api_client)

    def start(self, spec: RunSpec) -> str:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        namespace = self.settings.namespace
        job = build_job(spec, self.settings)
        try:
            created = self.batch.create_namespaced_job(namespace, job)
        except ApiException as exc:
            if exc.status != 409:
                raise
            return spec.name  # created by an earlier attempt: watch that one
        config_map = build_config_map(spec, job.metadata.labels)
        config_map.metadata.owner_references = [
            client.V1OwnerReference(api_version="batch/v1", kind="Job", name=created.metadata.name, uid=created.metadata.uid)
        ]
        try:
            self.core.create_namespaced_config_map(namespace, config_map)
        except ApiException as exc:
            if exc.status != 409:
                raise
        return spec.name

    def wait(self, spec: RunSpec, external_id: str, heartbeat: Heartbeat, timeout: float) -> RunOutcome:
        deadline = time.monotonic() + timeout
        while True:
            status = self.batch.read_namespaced_job_status(external_id, self.settings.namespace).status
            log = self.logs(external_id)
            if status.succeeded:
                return RunOutcome(True, external_id, log, read_result(spec.output_dir))
            if status.failed and status.failed > self.settings.backoff_limit:
                return RunOutcome(False, external_id, log, reason=f"Job {external_id} failed")
            if time.monotonic() > deadline:
                return RunOutcome(False, external_id, log, reason=f"timed out after {timeout:.0f} s")
            heartbeat(log)
            time.sleep(self.settings.poll_seconds)

    def logs(self, job_name: str) -> str:
        pods = self.core.list_namespaced_pod(self.settings.namespace, label_selector=f"job-name={job_name}").items
        if not pods:
            return ""
        newest = max(pods, key=lambda pod: pod.metadata.creation_timestamp)
        try:
            return self.core.read_namespaced_pod_log(newest.metadata.name, self.settings.namespace, tail_lines=500)
        except Exception:  # a pod still pulling its image has no log yet
            return ""


def make_runner(settings: Settings) -> Runner:
    """The runner the settings ask for."""
    if settings.orchestration.runner == "kubernetes":
        return KubernetesRunner(settings.kubernetes)
    return LocalRunner(settings.data_dir / "runs")
